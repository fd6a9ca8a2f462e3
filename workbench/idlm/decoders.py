"""Registers ISD (I-DLM §3.2) in :mod:`workbench.decoding.registry`."""
from ..decoding.registry import DecoderSpec, register_decoder


def _isd(model, prompts, gen_len, **kw):
    from .isd import isd_decode

    kw.pop("threshold", None)
    n = kw.pop("draft_length", None) or kw.get("block_length") or 4
    return isd_decode(model, prompts, gen_len, stride=int(n), **kw)


register_decoder(DecoderSpec("isd", _isd, family="speculative", sweep="draft_length", lossless=True,
                             ceiling="ar_greedy",
                             options=("threshold", "draft_length", "temperature", "proposal", "precision", "seed",
                                      "pad_id", "real_continuation", "block_length", "relax", "top_k", "top_p"),
                             reference="I-DLM (arXiv:2604.11035) §3.2 Algorithm 1; at temperature > 0 with argmax "
                             "proposals the engine's acceptance, thuEcstasy/I-DLM inference/sglang/sglang/srt/dllm/"
                             "algorithm/idlm_blockN.py: IDLMBlockN.run",
                             # one strictly causal forward of 2N − 1 tokens per step (I-DLM App. B, fixed query)
                             cost=lambda n, _: (float(2 * n - 1), 0.0),
                             description="introspective strided decoding, stride N: proposals and their "
                             "introspection in one causal forward (I-DLM Alg. 1); R-ISD with a gated LoRA"))
