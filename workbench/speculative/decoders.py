"""Registers linear and quadratic self-speculation (NLD §3.3, App. C) in :mod:`workbench.decoding.registry`."""
from ..decoding.registry import DecoderSpec, register_decoder


def _draft_length(kw: dict) -> int:
    """Self-speculation draft length k: ``draft_length`` if given, else the harness's ``block_length``
    (NLD sweeps self-speculation by its block length), else 8."""
    kw.pop("threshold", None)
    k = kw.pop("draft_length", None)
    return int(k if k is not None else kw.get("block_length") or 8)


def _ss_linear(model, prompts, gen_len, **kw):
    from .linear import linear_self_speculation

    k = _draft_length(kw)
    return linear_self_speculation(model, prompts, gen_len, draft_length=k, **kw)


def _ss_quadratic(model, prompts, gen_len, **kw):
    from .quadratic import quadratic_self_speculation

    k = _draft_length(kw)
    return quadratic_self_speculation(model, prompts, gen_len, draft_length=k, **kw)


_SPEC_OPTIONS = ("threshold", "draft_length", "temperature", "precision", "seed", "pad_id", "real_continuation",
                 "block_length", "top_k", "top_p")

register_decoder(DecoderSpec("ss_linear", _ss_linear, family="speculative", sweep="draft_length", lossless=True,
                             ceiling="ar_greedy", target_forwards="both", lora_drafter=True,
                             options=_SPEC_OPTIONS + ("layout",),
                             reference="Nemotron-Labs-Diffusion (arXiv:2607.05722) §3.3: linear self-speculation",
                             description="linear self-speculation: diffusion draft, AR verify "
                             "(two forwards per cycle; NLD §3.3)"))
register_decoder(DecoderSpec("ss_quadratic", _ss_quadratic, family="speculative", sweep="draft_length",
                             lossless=True, ceiling="ar_greedy", lora_drafter=True,
                             # one forward over [x, d_1..d_k] + k + 1 groups of k + 1 masks (quadratic.py)
                             cost=lambda k, _: (float((k + 1) + (k + 1) ** 2), 0.0),
                             options=_SPEC_OPTIONS + ("ensemble_lambda",),
                             reference="Nemotron-Labs-Diffusion (arXiv:2607.05722) App. C: quadratic "
                             "self-speculation",
                             description="quadratic self-speculation: draft and "
                             "verify in one forward (NLD App. C)"))
