"""``workbench leaderboard``: decode every registered decoder on one prompt set and write the table.

Output (``out_dir``, built in ``<out_dir>.partial`` and moved into place at the end):

* ``leaderboard.parquet``: one row per decoder × mode × setting with the columns of
  :mod:`workbench.leaderboard.columns`, ``speedup`` (tokens/s over AR greedy's in the same mode, process,
  dtype and thread count, after one untimed warm-up decode), ``ceiling`` / ``ceiling_tpf`` / ``distance``
  (tpf ÷ the SOL ceiling that applies, free-running rows), and ``status`` ('ok', or why the row is missing);
* ``ceilings.parquet``: SOL(serial) and SOL(AR greedy) per B with their greedy baselines;
* ``leaderboard.md``, ``leaderboard.png`` (TPF against agreement with AR greedy, ceilings as lines), ``config.json``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..decoding.base import DecodeError, cast_for_precision, stop_at_eos
from ..decoding.registry import DecoderSpec, get_decoder, load_decoders
from ..evaluation.harness import decode_identity, decode_prompts
from ..evaluation.metrics import whitespace_ids
from ..utils import check_out_dir, staged_dir, writes_out_dir
from .columns import row_columns
from .config import LeaderboardConfig
from ..model.families.spec import FamilyError
from ..tokenizer import TokenizerError
from ..tasks.run import TaskPrompts, decode_task, options_of
from .rows import REFERENCES, Setting, grid


def _specs(cfg: LeaderboardConfig) -> list[DecoderSpec]:
    """The decoders to run: ``cfg.decoders`` (unknown names raise :class:`DecodeError` listing the valid
    ones) or every registered one; the references (ar_greedy, serial) always run, since every row's agreement,
    lossless and speed-up columns compare with them."""
    load_decoders()
    from ..decoding.registry import DECODERS

    names = cfg.decoders or sorted(DECODERS)
    return [get_decoder(n) for n in [*[r for r in REFERENCES if r not in names], *names]]


def _artefacts(cfg: LeaderboardConfig, specs: list[DecoderSpec], model, tok) -> tuple[dict, dict]:
    """Load each decoder's artefact (``needs``); returns ``(artefacts by decoder, missing reasons by decoder)``.

    A decoder named in ``--decoders`` whose artefact is not given raises ``ValueError`` naming the command that
    makes it, unless ``skip_missing``; with the default (every registered decoder) such a decoder gets a row
    whose status says why, as the sampler and DEER run only when their artefact is given. An artefact not given
    is the one shipped for ``cfg.model`` when there is one (:func:`~workbench.assets.shipped_artefact`)."""
    from ..assets import shipped_artefact

    given = {"sampler": cfg.sampler, "drafter": cfg.drafter, "proxy": cfg.proxy}
    loaded, missing = {}, {}
    for spec in specs:
        if spec.needs is None:
            continue
        path = given.get(spec.needs) or shipped_artefact(cfg.model, spec.needs)
        if not path:
            why = (f"the {spec.name} decoder needs --{spec.needs} <path>; make one with `{spec.needs_hint}`"
                   + ("" if cfg.skip_missing else ", or pass --skip_missing true"))
            if cfg.decoders and not cfg.skip_missing:
                raise ValueError(why)
            missing[spec.name] = why
            continue
        if not Path(path).exists():
            raise FileNotFoundError(f"--{spec.needs} {path} does not exist; make it with `{spec.needs_hint}`")
        loaded[spec.name] = spec.load(path, model, tok)
    return loaded, missing


@writes_out_dir("leaderboard")
def run_leaderboard(cfg: LeaderboardConfig, model=None, tokenizer=None, decode_cache: dict | None = None,
                    sol_cache: dict | None = None) -> tuple[pd.DataFrame, Path]:
    """Run the leaderboard and write ``cfg.out_dir``; returns ``(table, out_dir)``.

    ``model`` / ``tokenizer``: an already loaded target (else ``cfg.model`` is loaded). ``decode_cache``: a dict
    shared with :func:`~workbench.evaluation.harness.evaluate_model` (same keys): a run already decoded there on
    the same prompts, precision and batch size is reused, not decoded again. ``sol_cache``: the same for the
    ceilings' SOL searches (:func:`~workbench.sol.runner.run_sol`; the demo's SOL stage fills it).
    Raises one-line ``ValueError`` / ``DecodeError`` / ``FileNotFoundError`` for bad input, before any decoding.
    """
    from ..corpus import by_split, load_corpus
    from ..evaluation.harness import check_sweep_fits
    from ..evaluation.prompts import make_prompts
    from ..model.load import load_model, resolve_device

    cfg.validate()
    check_out_dir(cfg.out_dir, "leaderboard")
    specs = _specs(cfg)
    meta = None
    if model is None:
        model, tokenizer, meta = load_model(cfg.model, resolve_device(cfg.device), cfg.add_mask_token)
        cast_for_precision(model, cfg.precision)
    elif cfg.precision == "bf16-true" and model.mask_dtype != torch.bfloat16:
        raise ValueError("precision bf16-true needs the target's weights in bf16 "
                         "(decoding.base.cast_for_precision); the model given has " + str(model.mask_dtype))
    if not cfg.decoders:                          # a family's own decoders run on that family's models only
        specs = [s for s in specs if s.runs_by_default_on(model)]
    unavailable = {}                              # e.g. AR greedy on SDAR, LLaDA, Dream: the one-line reason
    for s in specs:
        try:
            s.check_model(model)
        except DecodeError as e:
            unavailable[s.name] = str(e)
    task = options_of(cfg)
    tp = TaskPrompts.build(task, tokenizer) if task else None
    check_sweep_fits(model, cfg.block_lengths if model.has_mask_token else [], tp.longest if tp else cfg.prompt_len,
                     cfg.gen_len, meta)   # without a mask token the diffusion rows are listed as not run
    artefacts, missing = _artefacts(cfg, [s for s in specs if s.name not in unavailable], model, tokenizer)
    adapter_model = None
    if cfg.adapter:
        from ..speculative.adapter import load_adapter

        adapter_model = load_adapter(load_model(cfg.model, model.device, cfg.add_mask_token)[0], cfg.adapter).eval()
        cast_for_precision(adapter_model, cfg.precision)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if tp is not None:                            # the task's problems, cut at its stop tokens
        from ..evaluation.task import task_as_prompts

        prompts, eos = task_as_prompts(tp, cfg.gen_len, pad), tp.stop_ids
    else:
        prompts = make_prompts(by_split(load_corpus(cfg.corpus), cfg.split), cfg.n_prompts, cfg.prompt_len,
                               cfg.gen_len, tokenizer)
        eos = tokenizer.eos_token_id
    ws = whitespace_ids(tokenizer, model.vocab_size)
    target_params = sum(p.numel() for p in model.backbone.parameters())
    # each decoder's drafter (DEER's, SimSD's) as a share of the target's parameters; 0 without one
    ratios = {name: sum(p.numel() for p in a.backbone.parameters()) / target_params
              for name, a in artefacts.items() if hasattr(a, "backbone")}
    cache = {} if decode_cache is None else decode_cache
    same = decode_identity(prompts, cfg.precision, cfg.batch_size)
    settings = grid([s for s in specs if s.name not in missing and s.name not in unavailable], cfg.modes,
                    cfg.block_lengths, cfg.thresholds, adapter_model is not None, cfg.real_context_decoders)

    def options(st: Setting) -> tuple[dict, float | None]:
        """The decoder's keyword options for setting ``st`` and its knob (threshold, or the sampling settings),
        part of the decode cache's key."""
        spec = get_decoder(st.decoder)
        kw = {"precision": cfg.precision, "block_length": st.length}
        if st.threshold is not None:
            kw["threshold"] = st.threshold
        if spec.sweep == "draft_length":
            kw["draft_length"] = st.length
        knob = st.threshold
        if spec.temperature:
            kw.update(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
            # the evaluation sweep's key is the bare temperature: its unfiltered ar_sample decodes are reused
            knob = cfg.temperature if (cfg.top_k, cfg.top_p) == (0, 1.0) else (cfg.temperature, cfg.top_k, cfg.top_p)
        if st.decoder in artefacts:
            kw[spec.needs] = artefacts[st.decoder]
        return kw, knob

    def decode(st: Setting):
        kw, knob = options(st)
        if tp is not None:                        # a task: stops at its stop tokens (AR ends the batch there)
            return decode_task(adapter_model if st.adapter else model, st.decoder, tp, cfg.gen_len, cfg.batch_size,
                               pad, progress=cfg.progress_bar, **kw)
        key = (st.mode, st.decoder, st.length, knob, same)
        cacheable = st.decoder not in artefacts and not st.adapter
        if cacheable and key in cache:
            return cache[key]
        m = adapter_model if st.adapter else model
        res = decode_prompts(m, st.decoder, prompts, st.mode, cfg.batch_size, pad, **kw)
        if cacheable:
            cache[key] = res
        return res

    if settings and tp is not None:               # a task's warm-up, not timed: one batch, a few blocks
        first = settings[0]
        decode_task(adapter_model if first.adapter else model, first.decoder, TaskPrompts(
            tp.problems[:cfg.batch_size], tp.fmt, tp.ids[:cfg.batch_size], tp.stop_ids),
            math.lcm(*cfg.block_lengths), cfg.batch_size, pad, **options(first)[0])
    elif settings and (settings[0].mode, settings[0].decoder, settings[0].length, None, same) not in cache:
        first = settings[0]                                                           # warm-up, not timed
        decode_prompts(adapter_model if first.adapter else model, first.decoder, prompts[:cfg.batch_size], first.mode,
                       cfg.batch_size, pad, **options(first)[0])
    t0 = time.time()
    results, rows = {}, []
    bar = tqdm(settings, desc="leaderboard", disable=not cfg.progress_bar)
    for st in bar:
        bar.set_postfix_str(f"{st.mode} {st.label}" + (f" B={st.length}" if st.length else "")
                            + (f" τ={st.threshold}" if st.threshold is not None else ""))
        spec = get_decoder(st.decoder)
        base = {"decoder": st.label, "mode": st.mode, "block_length": st.length or 0,
                "threshold": st.threshold if st.threshold is not None else math.nan, "family": spec.family,
                "claims_lossless": spec.lossless}
        try:
            res = decode(st)
        except (DecodeError, FamilyError, TokenizerError) as e:   # e.g. a self-drafting decoder without a mask token
            rows.append({**base, "status": f"not run: {e}"})
            continue
        full = res
        if st.mode == "free" and eos is not None:
            res = stop_at_eos(res, eos, st.length if spec.block_commits else None)
        results[st] = (res, full)
        ar = _ref(results, "ar_greedy", st)
        serial = _ref(results, "serial", st)
        alpha = _introspective(model, prompts, res, st, cfg, pad, spec.temperature)
        exact = _exact_ref(results, spec.approximates, st)
        rows.append({**base, **row_columns(spec, st.length, res, ar, serial, ws, ratios.get(st.decoder, 0.0)),
                     "introspective_acceptance": alpha, "status": "ok",
                     "agree_exact": _mean_agreement(res, exact) if exact is not None else math.nan})
    for name, why in [*((n, f"missing: {w}") for n, w in missing.items()),
                      *((n, f"not run: {w}") for n, w in unavailable.items())]:
        spec = get_decoder(name)
        rows.append({"decoder": name, "mode": "", "block_length": 0, "threshold": math.nan, "family": spec.family,
                     "claims_lossless": spec.lossless, "status": why})
    df = pd.DataFrame(rows)
    df = _speedup(df)
    records = []
    if tp is not None:
        from .task import redecoder, score_rows

        df, records = score_rows(df, results, task, tp, tokenizer, redecoder(model, adapter_model, tp, cfg, pad, options),
                                 cfg.progress_bar)
    ceilings = pd.DataFrame()
    if cfg.sol and "free" in cfg.modes and model.has_mask_token:
        ar_free = next((full for st, (_, full) in results.items() if st.decoder == "ar_greedy" and st.mode == "free"),
                       None)
        ceilings = sol_ceilings_for(model, prompts, cfg, pad, ar_free, sol_cache)
        df = _distance(df, ceilings, specs)
    wall = time.time() - t0
    from .report import leaderboard_markdown, plot_leaderboard

    with staged_dir(cfg.out_dir, kind="leaderboard", settings=asdict(cfg)) as out:
        df.to_parquet(out / "leaderboard.parquet", index=False)
        ceilings.to_parquet(out / "ceilings.parquet", index=False)
        (out / "leaderboard.md").write_text(leaderboard_markdown(df, ceilings, cfg, len(prompts)))
        plot_leaderboard(df, ceilings, out / "leaderboard.png")
        if tp is not None:
            from ..tasks.report import plot_accuracy_vs_tpf
            from ..tasks.run import write_samples

            write_samples(out / "samples.jsonl", records)
            plot_accuracy_vs_tpf(df[(df["status"] == "ok") & (df["mode"] == "free")], out / "pass_at_1.png",
                                 f"{cfg.model}: {task.task}, {len(tp.problems)} problems ({tp.fmt} format)")
        (out / "config.json").write_text(json.dumps({**asdict(cfg), "wall_s": wall, "n_prompts_used": len(prompts)},
                                                    indent=2) + "\n")
    if cfg.results_table:
        from ..results import append_results, leaderboard_figures

        sampling = {name for name, spec in load_decoders().items() if spec.temperature}
        append_results(leaderboard_figures(df, cfg, ceilings, sampling=sampling, wall_s=wall), cfg.results_table)
    return df, Path(cfg.out_dir)


def sol_ceilings_for(model, prompts, cfg: LeaderboardConfig, pad: int, ar_free, cache: dict | None = None
                     ) -> pd.DataFrame:
    """:func:`~workbench.leaderboard.ceilings.sol_ceilings` on the leaderboard's prompts."""
    from .ceilings import sol_ceilings

    return sol_ceilings(model, [list(p.prompt) for p in prompts], cfg.block_lengths, cfg.gen_len, pad,
                        ar_free.tokens if ar_free is not None else None, cfg.precision, cfg.sol_budget,
                        cfg.progress_bar, cache)


def _introspective(model, prompts, res, st: Setting, cfg: LeaderboardConfig, pad: int, sampled: bool) -> float:
    """I-DLM §2's introspective acceptance of a decoded row: the decoder's recorded ``q_k(x_k)`` against the
    target's causal AR ``p_k(x_k)`` with every earlier token revealed (one extra forward per batch; with a gated
    LoRA or a LoRA drafter, the base model). NaN for a decoder that records no ``q``."""
    from ..evaluation.metrics import ar_token_logprobs, introspective_acceptance

    if not res.token_probs or not any(res.token_probs) or "ar" not in model.modes:
        return math.nan
    logp = []
    for i in range(0, len(prompts), cfg.batch_size):
        chunk = prompts[i:i + cfg.batch_size]
        real = [list(p.real) for p in chunk] if st.mode == "real" else None
        logp += ar_token_logprobs(model, [list(p.prompt) for p in chunk], res.tokens[i:i + cfg.batch_size], real,
                                  st.length, pad, cfg.precision, *((cfg.temperature, cfg.top_k, cfg.top_p)
                                                                    if sampled else (1.0,)))
    return introspective_acceptance(res.token_probs, logp)


def _ref(results: dict, name: str, st: Setting):
    """The reference decode for row ``st``: AR greedy / serial in the same mode (real-context: same segment
    length; free-running AR: its single row)."""
    for key, (res, _) in results.items():
        if key.decoder == name and key.mode == st.mode and not key.adapter:
            if name == "ar_greedy" and (st.mode == "free" or key.length == st.length):
                return res
            if name == "serial" and key.length == st.length:
                return res
    return None


def _exact_ref(results: dict, name: str | None, st: Setting):
    """The decode of ``name`` (the exact decoder an approximate one stands for) in ``st``'s mode, length and
    threshold, or None."""
    for key, (res, _) in results.items():
        if name and key.decoder == name and key.mode == st.mode and key.length == st.length \
                and key.threshold == st.threshold and not key.adapter:
            return res
    return None


def _mean_agreement(res, ref) -> float:
    """Token agreement of ``res`` with ``ref``, weighted by row length (as the leaderboard's ``agree_*``)."""
    from ..evaluation.metrics import agreement

    pairs = list(zip(res.tokens, ref.tokens))
    return sum(agreement(a, b) * max(len(a), len(b)) for a, b in pairs) / \
        max(1, sum(max(len(a), len(b)) for a, b in pairs))


def _speedup(df: pd.DataFrame) -> pd.DataFrame:
    """``speedup``: tokens/s ÷ AR greedy's tokens/s in the same mode (real-context: same segment length)."""
    if "tokens_per_s" not in df:
        return df
    ar = df[(df["decoder"] == "ar_greedy") & (df["status"] == "ok")]
    out = []
    for _, r in df.iterrows():
        ref = ar[(ar["mode"] == r["mode"]) & ((r["mode"] == "free") | (ar["block_length"] == r["block_length"]))]
        out.append(r["tokens_per_s"] / ref["tokens_per_s"].iloc[0] if len(ref) and r["status"] == "ok" else math.nan)
    return df.assign(speedup=out)


def _distance(df: pd.DataFrame, ceilings: pd.DataFrame, specs: list[DecoderSpec]) -> pd.DataFrame:
    """``ceiling``, ``ceiling_tpf``, ``distance`` = tpf ÷ ceiling for free-running rows whose decoder names one."""
    by = {s.name: s.ceiling for s in specs}
    name, value = [], []
    for _, r in df.iterrows():
        c = by.get(str(r["decoder"]).split("+")[0])
        hit = ceilings[(ceilings["ceiling"] == c) & (ceilings["block_length"] == r["block_length"])] \
            if c and len(ceilings) and r["mode"] == "free" else []
        name.append(c if len(hit) else None)
        value.append(float(hit["sol"].iloc[0]) if len(hit) else math.nan)
    df = df.assign(ceiling=name, ceiling_tpf=value)
    return df.assign(distance=df["tpf"] / df["ceiling_tpf"]) if "tpf" in df else df


def main(argv: list[str]) -> int:
    """``workbench leaderboard --config <yaml> [--field value ...]``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench leaderboard", LeaderboardConfig, argv)
    df, out = run_leaderboard(cfg)
    ok = df[df["status"] == "ok"]
    print(ok[["decoder", "mode", "block_length", "threshold", "tpf", "cost_tpf", "tau", "agree_ar", "lossless",
              "speedup", *[c for c in ("pass@1", "aup") if c in ok]]].to_string(index=False))
    print(f"leaderboard: {out / 'leaderboard.md'}")
    return 0
