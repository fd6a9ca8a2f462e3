"""Registers DEER decoding (arXiv:2512.15176 Alg. 1) in :mod:`workbench.decoding.registry`."""
from ..decoding.registry import DecoderSpec, register_decoder


def _deer(model, prompts, gen_len, drafter=None, **kw):
    from .decode import deer_policy

    if getattr(drafter, "sep_token_id", None) is not None:
        kw["sep_id"] = drafter.sep_token_id
    return deer_policy(model, prompts, gen_len, drafter=drafter, **kw)


def _load(path, model, tokenizer):
    from .models import load_drafter

    return load_drafter(path, model, tokenizer)


register_decoder(DecoderSpec("deer", _deer, load=_load, target_forwards="extra",
                             # drafter forward over k masks (and the new context chunk), target verify of k + 1
                             cost=lambda k, ratio: (ratio * k, float(k + 1)), family="speculative", sweep="draft_length", lossless=True,
                             ceiling="ar_greedy", needs="drafter", real_context=False,
                             needs_hint="workbench train deer --stage 1 (then --stage 2)",
                             # block_length and threshold: the harness's knobs of other decoders, accepted and unused
                             options=("drafter", "draft_length", "temperature", "real_continuation", "pad_id",
                                      "precision", "seed", "top_k", "top_p", "block_length", "threshold"),
                             reference="DEER (arXiv:2512.15176) Algorithm 1",
                             description="DEER: a separate diffusion drafter drafts a block, the AR target verifies"))
