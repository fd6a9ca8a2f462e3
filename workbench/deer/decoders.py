"""Registers DEER decoding (deer.txt Alg. 1) in :mod:`workbench.decoding.registry`."""
from ..decoding.registry import DecoderSpec, register_decoder


def _deer(model, prompts, gen_len, drafter=None, **kw):
    from .decode import deer_policy

    return deer_policy(model, prompts, gen_len, drafter=drafter, **kw)


def _load(path, model, tokenizer):
    from ..model.io import load_checkpoint
    from .models import check_shared_tokenizer, check_vocab_sizes

    drafter, tok, _ = load_checkpoint(path, device=model.device)
    check_shared_tokenizer(tokenizer, tok)
    check_vocab_sizes(model, drafter)
    return drafter.eval()


register_decoder(DecoderSpec("deer", _deer, load=_load, target_forwards="extra",
                             # drafter forward over k masks (and the new context chunk), target verify of k + 1
                             cost=lambda k, ratio: (ratio * k, float(k + 1)), family="speculative", sweep="draft_length", lossless=True,
                             ceiling="ar_greedy", needs="drafter", real_context=False,
                             needs_hint="workbench train deer --stage 1 (then --stage 2)",
                             description="DEER: a separate diffusion drafter drafts a block, the AR target verifies"))
