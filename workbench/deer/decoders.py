"""Registers DEER decoding (deer.txt Alg. 1) in :mod:`workbench.decoding.registry`."""
from ..decoding.registry import DecoderSpec, register_decoder


def _deer(model, prompts, gen_len, drafter=None, **kw):
    from .decode import deer_policy

    return deer_policy(model, prompts, gen_len, drafter=drafter, **kw)


register_decoder(DecoderSpec("deer", _deer, family="speculative", sweep="draft_length", lossless=True,
                             ceiling="ar_greedy", needs="drafter", real_context=False,
                             needs_hint="workbench train deer --stage 1 (then --stage 2)",
                             description="DEER: a separate diffusion drafter drafts a block, the AR target verifies"))
