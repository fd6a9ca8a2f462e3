"""Registers SimSD (arXiv:2606.02544 §3.2) in :mod:`workbench.decoding.registry`: the model is the diffusion target,
the ``drafter`` artefact a smaller diffusion drafter of its tokenizer (a DEER drafter)."""
from ..decoding.registry import DecoderSpec, register_decoder


def _simsd(model, prompts, gen_len, drafter=None, **kw):
    from ..decoding.base import DecodeError
    from .decode import simsd_decode

    if drafter is None:
        raise DecodeError("the simsd policy needs drafter=<a small diffusion drafter of the target's tokenizer>")
    kw.pop("threshold", None)
    return simsd_decode(model, drafter, prompts, gen_len, block_length=int(kw.get("block_length") or 8),
                        temperature=kw.get("temperature", 0.0), drafter_kind="deer",
                        sep_id=getattr(drafter, "sep_token_id", None), real_continuation=kw.get("real_continuation"),
                        precision=kw.get("precision", "fp32"), seed=kw.get("seed", 0), top_k=kw.get("top_k", 0),
                        top_p=kw.get("top_p", 1.0))


def _load(path, model, tokenizer):
    from ..deer.models import load_drafter
    from .decode import warn_if_larger

    drafter = load_drafter(path, model, tokenizer)
    warn_if_larger(drafter, model)
    return drafter


register_decoder(DecoderSpec("simsd", _simsd, family="diffusion", sweep="block_length", block_commits=True,
                             ceiling="serial", needs="drafter", load=_load,
                             # pad_id and threshold: the harness's, accepted and unused
                             options=("drafter", "threshold", "block_length", "temperature", "real_continuation",
                                      "precision", "seed", "top_k", "top_p", "pad_id"),
                             reference="SimSD (arXiv:2606.02544) §3.2",
                             needs_hint="workbench train deer --stage 1 (then --stage 2)",
                             # counted forwards: the verify forward of 2B tokens and the finishing steps (B tokens,
                             # charged as 2B: an upper bound); extra: the B-token KV commit. The drafter's forwards
                             # are DecodeResult.drafter_forwards, charged by the leaderboard at its share of FLOPs
                             cost=lambda b, ratio: (float(2 * b), float(b)),
                             description="SimSD: a small diffusion drafter drafts the block in its own order, the "
                             "diffusion target verifies it in one forward (temporal causal mask), then finishes it"))
