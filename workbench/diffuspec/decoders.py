"""Registers DiffuSpec (arXiv:2510.02358 Algorithm 1) and its ablations (Table 2) in
:mod:`workbench.decoding.registry`. The drafter is the model's own diffusion mode (a tri-mode model, e.g. the
converted SmolLM2) and the verifier its AR mode; ``workbench diffuspec eval`` also runs a DEER drafter.

* ``diffuspec``: CPS + ADL (needs the n-gram proxy);
* ``diffuspec_cps``: CPS at a fixed draft length (swept);
* ``diffuspec_adl``: the drafter's argmax + ADL;
* ``diffuspec_argmax``: the drafter's argmax at a fixed draft length (swept).
"""
from ..decoding.registry import DecoderSpec, register_decoder

PROXY_HINT = "workbench diffuspec proxy --model <model> --out_dir <dir>"


def _make(cps: bool, adl: bool):
    def decode(model, prompts, gen_len, proxy=None, **kw):
        from ..decoding.base import DecodeError
        from .decode import DiffuSpecConfig, diffuspec_decode

        if kw.pop("real_continuation", None) is not None:
            raise DecodeError("DiffuSpec decodes free-running only (no real-context mode)")
        kw.pop("threshold", None)
        k = kw.pop("draft_length", None) or kw.get("block_length") or 8
        eos = model.backbone.config.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        cfg = DiffuSpecConfig(cps=cps, adl=adl, k_fixed=int(k))
        return diffuspec_decode(model, model, prompts, gen_len, cfg, proxy=proxy,
                                temperature=kw.get("temperature", 0.0), eos_id=eos,
                                precision=kw.get("precision", "fp32"), seed=kw.get("seed", 0),
                                top_k=kw.get("top_k", 0), top_p=kw.get("top_p", 1.0))
    return decode


def _load_proxy(path, model, tokenizer):
    from .ngram import load_proxy

    return load_proxy(path, tokenizer)


def _cost(k, _ratio):
    """FLOPs of a drafter forward (k masks) and a verify forward (k + 1 tokens), in one-token target forwards;
    for the ADL rows (no swept k) at the default k_max: an upper bound."""
    from .decode import DiffuSpecConfig

    k = k or DiffuSpecConfig().k_max
    return float(k + 1), float(k + 1)


for _name, _cps, _adl, _desc in (
        ("diffuspec", True, True, "DiffuSpec: diffusion draft, causal path search (CPS) with an n-gram proxy, "
                                  "adaptive draft length (ADL), AR verify"),
        ("diffuspec_cps", True, False, "DiffuSpec ablation: CPS at a fixed draft length"),
        ("diffuspec_adl", False, True, "DiffuSpec ablation: the drafter's argmax with ADL"),
        ("diffuspec_argmax", False, False, "DiffuSpec ablation: the drafter's argmax at a fixed draft length")):
    register_decoder(DecoderSpec(_name, _make(_cps, _adl), family="speculative",
                                 sweep="none" if _adl else "draft_length", lossless=True, ceiling="ar_greedy",
                                 needs="proxy" if _cps else None, needs_hint=PROXY_HINT if _cps else None,
                                 load=_load_proxy if _cps else None, target_forwards="both", real_context=False,
                                 cost=_cost, ablation=_name in ("diffuspec_cps", "diffuspec_adl"), description=_desc,
                                 # pad_id and threshold: the harness's, accepted and unused (one prompt at a time)
                                 options=("proxy", "real_continuation", "threshold", "draft_length", "block_length",
                                          "temperature", "precision", "seed", "top_k", "top_p", "pad_id"),
                                 reference="DiffuSpec (arXiv:2510.02358) Algorithm 1" + (
                                     "" if _name == "diffuspec" else f"; its Table 2 ablation ({_desc.split(': ')[1]})")))
