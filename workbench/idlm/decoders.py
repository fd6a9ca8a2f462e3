"""Registers ISD (I-DLM §3.2) in :mod:`workbench.decoding.registry`."""
from ..decoding.registry import DecoderSpec, register_decoder


def _isd(model, prompts, gen_len, **kw):
    from .isd import isd_decode

    kw.pop("threshold", None)
    n = kw.pop("draft_length", None) or kw.get("block_length") or 4
    return isd_decode(model, prompts, gen_len, stride=int(n), **kw)


register_decoder(DecoderSpec("isd", _isd, family="speculative", sweep="draft_length", lossless=True,
                             ceiling="ar_greedy",
                             # one strictly causal forward of 2N − 1 tokens per step (I-DLM App. B, fixed query)
                             cost=lambda n, _: (float(2 * n - 1), 0.0),
                             description="introspective strided decoding, stride N: proposals and their "
                             "introspection in one causal forward (I-DLM Alg. 1); R-ISD with a gated LoRA"))
