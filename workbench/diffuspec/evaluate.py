"""``workbench diffuspec eval``: DiffuSpec's ablation table (arXiv:2510.02358 Table 2 and Table 5) on held-out
prompts, with AR greedy decoded in the same run as the speed-up reference.

Methods, each on the same prompts, one prompt at a time (batch size 1, as the paper):

* ``ar``: AR greedy of the target (the reference for agreement and speed-up);
* ``argmax``: the drafter's argmax block at a fixed length (no CPS, no ADL);
* ``cps``: CPS at the fixed length; ``adl``: argmax + ADL; ``cps+adl``: DiffuSpec;
* ``fixed_k{k}``: CPS at each extra fixed length of ``fixed_lengths`` (the fixed-length controllers of Table 5).

Each drafter in ``drafters`` (``self``: the target's own diffusion mode; or a DEER drafter directory) gets every
method. Columns: MAT (mean accepted draft tokens per step, **the bonus token not counted**), tokens per step
(with it), TPF in target forwards, cost-weighted TPF (drafter forwards weighted by the drafter's parameter
share), tokens/s, speed-up over ``ar`` and agreement with ``ar`` (1.0: lossless). Files in ``out_dir``:
``rows.parquet`` (per prompt and method), ``table.parquet``/``table.csv`` and ``config.json``, written staged.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from .decode import DiffuSpecConfig, SearchKnobs
from ..model.loading import ModelLoading
from ..utils import writes_out_dir


@dataclass
class DiffuSpecEvalConfig(SearchKnobs, ModelLoading):
    """DiffuSpec ablations on held-out prompts (arXiv:2510.02358 §5, Tables 2 and 5); CPS's and ADL's knobs are
    :class:`~workbench.diffuspec.decode.SearchKnobs`."""

    model: str = "tiny"
    """AR target (and the 'self' drafter): 'tiny', 'smollm2-135m-trimode' or a checkpoint directory."""
    drafters: list[str] = field(default_factory=lambda: ["self"])
    """Drafters: 'self' (the model's own diffusion mode) and/or DEER drafter directories."""
    proxy: str | None = None
    """n-gram proxy directory (`workbench diffuspec proxy`; default: the one shipped for --model)."""
    corpus: str = "stdlib"
    """Corpus of the prompts."""
    split: str = "test"
    """Split of the prompts (held out from the proxy and the drafters' training)."""
    n_prompts: int = 8
    """Number of prompts."""
    prompt_len: int = 128
    """Maximum prompt length in tokens."""
    gen_len: int = 64
    """Tokens generated per prompt (fewer after EOS)."""
    k_fixed: int = 8
    """Draft length of the fixed-length methods."""
    fixed_lengths: list[int] = field(default_factory=list)
    """Extra fixed lengths for CPS (Table 5's fixed-k policies)."""
    precision: str = "fp32"
    """'fp32' or 'bf16' (autocast)."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    out_dir: str = "runs/diffuspec/eval"
    """Output directory."""
    progress_bar: bool = True
    """Show a progress bar."""

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line reason for a bad setting."""
        self.settings(True, True).validate()
        for k in [self.k_fixed, *self.fixed_lengths]:
            if k < 1:
                raise ValueError(f"fixed draft lengths must be >= 1, got {k}")
        if not self.drafters:
            raise ValueError("give at least one drafter ('self' or a DEER drafter directory)")

    def settings(self, cps: bool, adl: bool, k: int | None = None):
        """The :class:`~workbench.diffuspec.decode.DiffuSpecConfig` of one method."""
        return DiffuSpecConfig(cps=cps, adl=adl, k_fixed=k or self.k_fixed, **self.knobs())

    def methods(self) -> dict:
        """Method name -> DiffuSpecConfig."""
        out = {"argmax": self.settings(False, False), "cps": self.settings(True, False),
               "adl": self.settings(False, True), "cps+adl": self.settings(True, True)}
        for k in self.fixed_lengths:
            out[f"fixed_k{k}"] = self.settings(True, False, k)
        return out


def load_drafter(spec: str, model, tok):
    """``(drafter, kind, sep_id)`` for ``'self'``, a released diffusion LM's checkpoint folder (DiffuSpec's own
    setting: Dream-7B drafting for Qwen2.5; :func:`~workbench.model.load.load_released_drafter`) or a DEER drafter
    directory (checked against the target's tokenizer; raises :class:`~workbench.deer.models.TokenizerMismatchError`
    naming both vocabulary sizes)."""
    if spec == "self":
        _ = model.mask_token_id                 # raises a one-line TokenizerError for a plain AR model
        return model, "trimode", None
    from ..model.load import load_released_drafter

    released = load_released_drafter(spec, model, tok)
    if released is not None:
        return released, "trimode", None
    from ..deer.models import load_drafter as load_deer

    d = load_deer(spec, model, tok)
    return d, "deer", d.sep_token_id


def _row(name: str, drafter: str, prompt, res, i: int, ar_ids: list[int]) -> dict:
    """One prompt's measurements of a :class:`~workbench.diffuspec.decode.DiffuSpecResult` row."""
    from ..evaluation.metrics import agreement

    toks = res.tokens[i]
    steps = max(1, len(res.accepted[i]))
    d_share = res.drafter_params / max(1, res.target_params)
    cost = res.extra_forwards[i] + d_share * res.forwards[i]
    return {"method": name, "drafter": drafter, "prompt_id": prompt.prompt_id, "category": prompt.category,
            "tokens": len(toks), "steps": len(res.accepted[i]), "accepted": sum(res.accepted[i]), "mat": res.mat(i),
            "tokens_per_step": len(toks) / steps, "target_forwards": res.extra_forwards[i],
            "drafter_forwards": res.forwards[i], "tpf_target": len(toks) / max(1, res.extra_forwards[i]),
            "tpf_cost": len(toks) / max(1e-9, cost),
            "mean_draft_length": sum(res.draft_lengths[i]) / steps,
            "wall_s": res.wall_time, "agree_ar": agreement(toks, ar_ids),
            "ids": toks}


@writes_out_dir("diffuspec")
def run_eval(cfg: DiffuSpecEvalConfig) -> Path:
    """Decode every method and drafter on the same prompts and write the table; returns ``cfg.out_dir``.

    Raises ``ValueError`` for a bad config, :class:`~workbench.diffuspec.ngram.ProxyError` for a missing or
    foreign proxy, :class:`~workbench.model.io.CheckpointError` / TokenizerMismatchError for a bad drafter,
    :class:`~workbench.utils.RunDirError` for an out_dir it may not replace (all before decoding)."""
    import time

    from ..assets import shipped_artefact
    from ..corpus import by_split, load_corpus
    from ..decoding.ar import ar_decode
    from ..evaluation.prompts import make_prompts
    from ..model.load import load_model, resolve_device
    from ..utils import check_out_dir, staged_dir
    from .decode import diffuspec_decode
    from .ngram import ProxyError, load_proxy

    cfg.validate()
    check_out_dir(cfg.out_dir, "diffuspec")
    model, tok, _ = load_model(cfg.model, resolve_device(cfg.device))
    model.eval()
    proxy_path = cfg.proxy or shipped_artefact(cfg.model, "proxy")
    if proxy_path is None:
        raise ProxyError(f"no n-gram proxy for {cfg.model}: pass --proxy, or build one with "
                         f"`workbench diffuspec proxy --model {cfg.model} --out_dir <dir>`")
    proxy = load_proxy(proxy_path, tok)
    drafters = {spec: load_drafter(spec, model, tok) for spec in cfg.drafters}
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = make_prompts(by_split(load_corpus(cfg.corpus), cfg.split), cfg.n_prompts, cfg.prompt_len,
                           cfg.gen_len, tok)
    methods = cfg.methods()
    warm = [list(prompts[0].prompt)[:32]]
    ar_decode(model, warm, 8, pad_id=pad, precision=cfg.precision)            # warm-up of every path, untimed
    for d, kind, sep in drafters.values():
        for s in methods.values():
            diffuspec_decode(model, d, warm, 8, s, proxy=proxy, eos_id=eos, drafter_kind=kind, sep_id=sep,
                             precision=cfg.precision)
    rows = []
    total = len(prompts) * (1 + len(methods) * len(drafters))
    bar = tqdm(total=total, desc="diffuspec eval", disable=not cfg.progress_bar)
    for p in prompts:
        ids = [list(p.prompt)]
        t0 = time.perf_counter()
        ar = ar_decode(model, ids, cfg.gen_len, pad_id=pad, precision=cfg.precision)
        ar_ids, wall = _cut(ar.tokens[0], eos), time.perf_counter() - t0
        n = len(ar_ids)
        rows.append({"method": "ar", "drafter": "-", "prompt_id": p.prompt_id, "category": p.category, "tokens": n,
                     "steps": n, "accepted": 0, "mat": 0.0, "tokens_per_step": 1.0, "target_forwards": n, "drafter_forwards": 0,
                     "tpf_target": 1.0, "tpf_cost": 1.0, "mean_draft_length": 0.0, "wall_s": wall, "agree_ar": 1.0,
                     "ids": ar_ids})
        bar.update()
        for dname, (d, kind, sep) in drafters.items():
            for name, s in methods.items():
                res = diffuspec_decode(model, d, ids, cfg.gen_len, s, proxy=proxy, eos_id=eos, drafter_kind=kind,
                                       sep_id=sep, precision=cfg.precision)
                rows.append(_row(name, dname, p, res, 0, ar_ids))
                bar.update()
    bar.close()
    df = pd.DataFrame(rows)
    table = summarize(df)
    out = Path(cfg.out_dir)
    with staged_dir(out, kind="diffuspec", settings=asdict(cfg)) as tmp:
        df.drop(columns=["ids"]).to_parquet(tmp / "rows.parquet", index=False)
        table.to_parquet(tmp / "table.parquet", index=False)
        table.to_csv(tmp / "table.csv", index=False)
        (tmp / "config.json").write_text(json.dumps({**asdict(cfg), "proxy": str(proxy_path)}, indent=2) + "\n")
    return out


def _cut(ids: list[int], eos: int | None) -> list[int]:
    return ids[:ids.index(eos) + 1] if eos is not None and eos in ids else ids


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per drafter and method: MAT (bonus not counted), tokens per step, TPF in target forwards, cost-weighted
    TPF, mean draft length, tokens/s, speed-up over AR greedy (total tokens/s ratio) and agreement with it."""
    ar_tps = rows.loc[rows.method == "ar", "tokens"].sum() / rows.loc[rows.method == "ar", "wall_s"].sum()
    g = rows.groupby(["drafter", "method"], sort=False)
    out = g.agg(prompts=("prompt_id", "count"), tokens=("tokens", "sum"), steps=("steps", "sum"),
                accepted=("accepted", "sum"),
                target_forwards=("target_forwards", "sum"), wall_s=("wall_s", "sum"),
                mean_draft_length=("mean_draft_length", "mean"), tpf_cost=("tpf_cost", "mean"),
                agree_ar=("agree_ar", "mean")).reset_index()
    out["mat"] = out["accepted"] / out["steps"].clip(lower=1)
    out["tokens_per_step"] = out["tokens"] / out["steps"].clip(lower=1)
    out["tpf_target"] = out["tokens"] / out["target_forwards"].clip(lower=1)
    out["tokens_per_s"] = out["tokens"] / out["wall_s"]
    out["speedup"] = out["tokens_per_s"] / ar_tps
    out.loc[out.method == "ar", ["mat", "mean_draft_length"]] = float("nan")
    return out[["drafter", "method", "prompts", "tokens", "mat", "tokens_per_step", "tpf_target", "tpf_cost",
                "mean_draft_length", "tokens_per_s", "speedup", "agree_ar"]]


def main(argv: list[str]) -> int:
    """``workbench diffuspec eval --model M [--drafters "[self, DIR]"] ...``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench diffuspec eval", DiffuSpecEvalConfig, argv)
    out = run_eval(cfg)
    table = pd.read_parquet(out / "table.parquet")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"results: {out}")
    return 0
