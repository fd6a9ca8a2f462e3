"""``workbench deer eval``: DEER's measurements on held-out prompts (arXiv:2512.15176 §4), written as Parquet + PNG.

On the same test-split prompts, decoded one batch at a time with the same settings:

* AR decoding of the target (the speedup reference, greedy or sampled at ``temperature``);
* DEER with the main drafter (normally the Stage I+II drafter): per category τ, max accepted length,
  share of cycles accepting ≥ 8 draft tokens (Fig. 4), real TPF, cost-weighted TPF, wall-clock speedup
  over AR (Tables 1–2), agreement with AR (1.0 at temperature 0: lossless);
* optional: DEER with the Stage I drafter (Table 3: w/o vs w/ refinement), DEER with each Stage II run of
  an α sweep (Fig. 6: training curves and final τ per α), DEER with any further named drafters, linear
  self-speculation of the target (:func:`~workbench.speculative.linear.linear_self_speculation`,
  optionally with a LoRA adapter).

Files in ``out_dir``: ``rows.parquet`` (per prompt and method), ``by_category.parquet``,
``cycles.parquet`` (accepted length of every cycle), ``acceptance_hist.parquet``, ``stage_table.parquet``,
``deer_vs_linear.parquet``, ``alpha.parquet`` + ``alpha_curves.parquet``, ``acceptance.png``,
``alpha.png``, ``summary.json`` and ``config.json``. Written into ``out_dir.partial`` and renamed.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
from tqdm.auto import tqdm

from ..corpus import by_split, load_corpus
from ..decoding.ar import ar_decode
from ..decoding.base import DecodeResult
from ..decoding.sampling import check_sampling
from ..evaluation.metrics import agreement, repetition_rate
from ..evaluation.prompts import Prompt, make_prompts
from ..model.io import read_workbench_json
from ..speculative.metrics import row_metrics
from ..utils import writes_out_dir
from .decode import DeerResult, deer_decode
from .models import load_drafter, load_target
from .tables import acceptance_histogram, by_category, compare_tau
from ..model.loading import ModelLoading

Decoder = Callable[[list[list[int]]], DecodeResult]


@dataclass
class DeerEvalConfig(ModelLoading):
    """DEER evaluation on held-out prompts (arXiv:2512.15176 §4)."""

    target: str = "builtin:tiny"
    """AR target: 'builtin:tiny' or a checkpoint directory."""
    drafter: str | None = None
    """Main DEER drafter (normally Stage I+II; default: the one shipped for --target, e.g.
    workbench/assets/smollm2-135m-deer-drafter)."""
    stage1_drafter: str | None = None
    """Stage-I-only drafter for the Stage I vs Stage I+II table (DEER Table 3)."""
    alpha_runs: list[str] = field(default_factory=list)
    """Stage II run directories of an α sweep (DEER Fig. 6): curves from their logs, τ of their drafters."""
    extra_drafters: dict[str, str] = field(default_factory=dict)
    """More drafters to decode with, as method name -> drafter directory (e.g. a control run)."""
    compare_linear: bool = True
    """Also decode with linear self-speculation of the target (NLD §3.3) at the same draft length."""
    adapter: str | None = None
    """Optional LoRA adapter directory (peft) for the linear self-speculation drafter."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    split: str = "test"
    """Split of the evaluation prompts (held out from the teacher data)."""
    n_prompts: int = 32
    """Number of prompts."""
    prompt_len: int = 128
    """Maximum prompt length in tokens."""
    gen_len: int = 128
    """Tokens generated per prompt."""
    draft_length: int = 16
    """k: draft tokens per DEER cycle (and per linear-SS cycle)."""
    temperature: float = 0.0
    """0: greedy (lossless: output = AR greedy); > 0: speculative sampling at this temperature."""
    top_k: int = 0
    """Top-k filter when sampling, on the AR reference, the drafts' q and the verifier's p alike (0 = off)."""
    top_p: float = 1.0
    """Top-p (nucleus) filter when sampling, applied as top_k is, in (0, 1] (1 = off)."""
    batch_size: int = 1
    """Prompts decoded together (1 = latency setting of the speedup measurement)."""
    precision: str = "fp32"
    """'fp32' or 'bf16' (autocast)."""
    seed: int = 0
    """Sampling seed."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    out_dir: str = "runs/deer/eval"
    """Output directory."""
    progress_bar: bool = True
    """Show a progress bar."""

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line reason for an inconsistent configuration."""
        for name in ("n_prompts", "prompt_len", "gen_len", "draft_length", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        check_sampling(self.temperature, self.top_k, self.top_p)


def _rows_of(method: str, res: DecodeResult, chunk: list[Prompt]) -> tuple[list[dict], list[dict]]:
    rows, cycles = [], []
    for j, p in enumerate(chunk):
        m = row_metrics(res, j, at_least=8)
        cost = float("nan")
        acc = [e - 1 for e in res.committed_per_step[j]]
        if isinstance(res, DeerResult):
            cost = len(res.tokens[j]) / res.tpf_cost(j)
            acc = res.accepted[j]
        rows.append({**m, "method": method, "prompt_id": p.prompt_id, "category": p.category,
                     "forwards": res.forwards[j], "extra_forwards": res.extra_forwards[j], "cost_forwards": cost,
                     "wall_s": res.wall_time / len(chunk), "repetition": repetition_rate(res.tokens[j]),
                     "ids": list(res.tokens[j])})
        cycles += [{"method": method, "prompt_id": p.prompt_id, "category": p.category, "accepted": a} for a in acc]
    return rows, cycles


def decode_rows(runs: dict[str, Decoder], prompts: list[Prompt], batch_size: int,
                progress_bar: bool = False) -> tuple[list[dict], list[dict]]:
    """Decode ``prompts`` in batches with every method of ``runs`` (``name -> (prompt ids -> DecodeResult)``),
    the methods interleaved batch by batch so their wall times see the same machine load.

    Returns ``(rows, cycles)``: one dict per (method, prompt) (the metrics of
    :func:`~workbench.speculative.metrics.row_metrics`, ``wall_s`` = batch wall time / batch rows,
    ``cost_forwards`` for DEER, the generated ``ids``) and one dict per cycle (``accepted`` draft tokens;
    DEER: untruncated, others: emitted − 1).
    """
    rows, cycles = [], []
    for i in tqdm(range(0, len(prompts), batch_size), desc="deer eval", disable=not progress_bar):
        chunk = prompts[i:i + batch_size]
        for name, decode in runs.items():
            r, c = _rows_of(name, decode([list(p.prompt) for p in chunk]), chunk)
            rows += r
            cycles += c
    return rows, cycles


def alpha_curves(run_dir: str | Path) -> tuple[float, pd.DataFrame]:
    """α and the logged curves (``step``, ``train/loss``, ``val/tau``...) of a Stage II run directory
    (all ``logs/version_*/metrics.csv`` concatenated). Raises ``FileNotFoundError`` without a drafter."""
    run = Path(run_dir)
    meta = read_workbench_json(run / "drafter")
    if not meta:
        raise FileNotFoundError(f"{run} has no trained drafter (drafter/workbench.json); train it first")
    alpha = float(meta["train_config"]["alpha"])
    logs = sorted(run.glob("logs/version_*/metrics.csv"))
    df = pd.concat([pd.read_csv(f) for f in logs], ignore_index=True) if logs else pd.DataFrame({"step": []})
    return alpha, df.assign(alpha=alpha, run=str(run))


def _overall(table: pd.DataFrame, method: str, cols) -> dict:
    return table[(table["method"] == method) & (table["category"] == "all")][list(cols)].iloc[0].to_dict()


def _last(curves: pd.DataFrame, col: str) -> float:
    s = curves[col].dropna() if col in curves else pd.Series(dtype=float)
    return float(s.iloc[-1]) if len(s) else float("nan")


def _drafters(cfg: DeerEvalConfig) -> tuple[dict[str, str], dict[str, tuple[float, pd.DataFrame]]]:
    """Method name -> drafter directory of every drafter to decode with, and the α-sweep runs' curves."""
    from ..assets import shipped_artefact

    main = cfg.drafter or shipped_artefact(cfg.target, "drafter")
    if main is None:
        raise ValueError(f"no DEER drafter given or shipped for {cfg.target}; pass --drafter <dir> (make one with "
                         "`workbench train deer --stage 1`, then --stage 2)")
    drafters = {"deer": str(main)}
    if cfg.stage1_drafter:
        drafters["deer_stage1"] = cfg.stage1_drafter
    drafters.update(cfg.extra_drafters)
    alphas = {}
    for run in cfg.alpha_runs:
        alpha, curves = alpha_curves(run)
        path = str(Path(run) / "drafter")
        same = [m for m, p in drafters.items() if Path(p).resolve() == Path(path).resolve()]
        name = same[0] if same else f"deer_alpha{alpha:g}"
        drafters.setdefault(name, path)
        alphas[name] = (alpha, curves)
    return drafters, alphas


def _linear_model(target, adapter: str | None):
    if not adapter:
        return target
    import copy

    from ..model.trimode import TriModeLM
    from ..speculative.adapter import load_adapter

    model = load_adapter(TriModeLM(copy.deepcopy(target.backbone), target.mask_token_id), adapter)
    model.backbone.eval()
    return model


@writes_out_dir("deer eval")
def run_deer_eval(cfg: DeerEvalConfig, target=None, tokenizer=None) -> Path:
    """Run every measurement of ``cfg`` and write the tables and figures; returns ``cfg.out_dir``.

    Raises ``ValueError`` for a bad config, :class:`~workbench.deer.models.TokenizerMismatchError` for a
    drafter with another tokenizer, :class:`~workbench.model.io.CheckpointError` for a bad drafter path,
    :class:`~workbench.utils.RunDirError` for an ``out_dir`` it may not replace or cannot write (before any decoding).
    """
    from ..model.load import resolve_device
    from ..speculative.linear import linear_self_speculation
    from ..utils import check_out_dir, staged_dir
    from .plots import plot_acceptance, plot_alpha

    cfg.validate()
    check_out_dir(cfg.out_dir, "deer eval")
    dev = resolve_device(cfg.device)
    if target is None:
        target, tokenizer = load_target(cfg.target, dev)
    drafters, alphas = _drafters(cfg)
    # loaded first: a shared-base drafter gives the target its mask and separator tokens
    loaded = {name: load_drafter(path, target, tokenizer) for name, path in drafters.items()}
    pad = int(tokenizer.pad_token_id)
    docs = by_split(load_corpus(cfg.corpus), cfg.split)
    prompts = make_prompts(docs, cfg.n_prompts, cfg.prompt_len, cfg.gen_len, tokenizer)
    common = dict(temperature=cfg.temperature, pad_id=pad, precision=cfg.precision, seed=cfg.seed, top_k=cfg.top_k,
                  top_p=cfg.top_p)
    runs: dict[str, Decoder] = {"ar": lambda ps: ar_decode(target, ps, cfg.gen_len, **common)}
    for name, d in loaded.items():
        runs[name] = (lambda d: lambda ps: deer_decode(target, d, ps, cfg.gen_len, cfg.draft_length,
                                                       sep_id=d.sep_token_id, **common))(d)
    if cfg.compare_linear:
        lin = _linear_model(target, cfg.adapter)
        runs["linear_ss"] = lambda ps: linear_self_speculation(lin, ps, cfg.gen_len, draft_length=cfg.draft_length,
                                                               **common)
    for fn in runs.values():                 # warm-up (allocator, kernels) before any timing
        fn([list(prompts[0].prompt)[:16]])
    rows, cycles = decode_rows(runs, prompts, cfg.batch_size, cfg.progress_bar)
    df = pd.DataFrame(rows)
    ar = df[df["method"] == "ar"].set_index("prompt_id")
    df["ar_wall_s"] = df["prompt_id"].map(ar["wall_s"])
    df["agree_ar"] = [agreement(ids, ar.at[pid, "ids"]) for ids, pid in zip(df["ids"], df["prompt_id"])]
    table = by_category(df)
    cyc = pd.DataFrame(cycles)
    stage = compare_tau(table, {"stage1": "deer_stage1", "stage2": "deer"}, ("tau", "speedup")) \
        if cfg.stage1_drafter else pd.DataFrame()
    vs_linear = compare_tau(table, {"linear_ss": "linear_ss", "deer": "deer"}, ("tau", "tpf_real", "speedup")) \
        if cfg.compare_linear else pd.DataFrame()
    alpha_rows = [{"alpha": a, "method": m, **_overall(table, m, ("tau", "speedup")),
                   "final_val_tau": _last(c, "val/tau")} for m, (a, c) in alphas.items()]
    out = Path(cfg.out_dir)
    with staged_dir(out, kind="deer eval", settings=asdict(cfg)) as tmp:
        df.drop(columns=["ids"]).to_parquet(tmp / "rows.parquet", index=False)
        table.to_parquet(tmp / "by_category.parquet", index=False)
        cyc.to_parquet(tmp / "cycles.parquet", index=False)
        acceptance_histogram(cyc).to_parquet(tmp / "acceptance_hist.parquet", index=False)
        stage.to_parquet(tmp / "stage_table.parquet", index=False)
        vs_linear.to_parquet(tmp / "deer_vs_linear.parquet", index=False)
        pd.DataFrame(alpha_rows).to_parquet(tmp / "alpha.parquet", index=False)
        curves = pd.concat([c for _, c in alphas.values()], ignore_index=True) if alphas else pd.DataFrame()
        curves.to_parquet(tmp / "alpha_curves.parquet", index=False)
        plot_acceptance(cyc, table, tmp / "acceptance.png")
        if alphas:
            plot_alpha(curves, pd.DataFrame(alpha_rows), tmp / "alpha.png")
        overall = table[table["category"] == "all"].drop(columns=["category"]).to_dict(orient="records")
        (tmp / "summary.json").write_text(json.dumps({"n_prompts": len(prompts), "overall": overall,
                                                      "stage_table": stage.to_dict(orient="records"),
                                                      "alpha": alpha_rows}, indent=2, default=float) + "\n")
        (tmp / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return out
