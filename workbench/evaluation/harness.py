"""``workbench evaluate``: code continuation under several decoding policies, written as Parquet.

For each context mode (``real``: every block conditioned on the real text before it; ``free``: each
block conditioned on what was generated) the harness runs AR-greedy, the serial target at every block
length, and the confidence policy at every (block length, threshold), on the same prompts, and
computes per-prompt metrics (see :data:`METRIC_COLUMNS`).
"""
from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from ..corpus import by_split, load_corpus
from ..decoding import DecodeResult, get_policy
from ..decoding.base import DecodeError, cast_for_precision, check_lengths, check_precision, check_threshold, resolve_precision
from ..model.load import load_model, resolve_device
from ..utils import writes_out_dir
from .metrics import (agreement, ar_token_logprobs, first_line, introspective_acceptance, known_words, nan_mean,
                      oov_word_rate, repetition_rate, whitespace_ids, whitespace_share, whitespace_share_multi)
from .prompts import Prompt, make_prompts
from ..model.loading import ModelLoading
from ..tasks.run import SampledTaskConfig

MODES = ("real", "free")
#: How reports name the two context modes.
MODE_NAMES = {"real": "real-context", "free": "free-running"}
METRIC_COLUMNS = ("tpf", "tpf_real", "agree_ar", "agree_serial", "token_acc", "first_line_exact", "ar_nll",
                  "introspective_acceptance",
                  "repetition", "real_repetition", "oov_word_rate", "real_oov_word_rate", "ws_share", "ws_share_multi",
                  "real_ws_share", "tokens_per_s")
KNOBS = {"ar_sample": "temperature"}
"""The keyword the 4th element of a run tuple sets, per policy (default: ``threshold``)."""


@dataclass
class EvalConfig(ModelLoading, SampledTaskConfig):
    """Evaluation sweep over policies, context modes, block lengths and thresholds."""

    model: str = "builtin:tiny"
    """Checkpoint directory, or 'builtin:tiny' for the model shipped with the workbench."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    split: str = "test"
    """Corpus split the prompts come from."""
    n_prompts: int = 48
    """Number of prompts (at most one per file, spread over categories)."""
    prompt_len: int = 192
    """Maximum prompt length in tokens (prompts end at a line boundary)."""
    gen_len: int = 128
    """Tokens generated per prompt (a multiple of every block length)."""
    block_lengths: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    """Block lengths B of the diffusion policies."""
    thresholds: list[float] = field(default_factory=lambda: [0.5, 0.7, 0.9, 0.95])
    """Confidence thresholds τ in (0, 1]."""
    modes: list[str] = field(default_factory=lambda: ["real", "free"])
    """Context modes: 'real' and/or 'free'."""
    sample_temperatures: list[float] = field(default_factory=list)
    """Temperatures of extra free-running AR sampling runs (policy ``ar_sample``): the model's own
    distribution next to the greedy path, a diagnostic of looping (Holtzman et al. 2020). Empty: none."""
    batch_size: int = 16
    """Prompts decoded together in lockstep."""
    precision: str = "auto"
    """'auto' (bf16 autocast where the device has native bf16 matmuls, fp32 on a CPU that would emulate them:
    docs/guides/precision.md), 'fp32', 'bf16' (autocast) or 'bf16-true' (weights stored in bf16)."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    add_mask_token: bool = False
    """Add a [MASK] token (and resize the embeddings) when the checkpoint's tokenizer has none."""
    out_dir: str = "runs/evaluate"
    """Run directory for results.parquet, summary.json and config."""
    progress_bar: bool = True
    """Show a progress bar."""
    def __post_init__(self):
        if self.task:                           # a task is decoded free-running (no real continuation to reset to)
            self.modes = ["free"]

    def validate(self) -> None:
        """Raise a one-line ``ValueError`` / ``DecodeError`` for an inconsistent sweep; with ``--task``, also for a bad
        task option, or (:class:`~workbench.tasks.execution.UnsafeCodeError`) a run without
        ``--confirm_run_unsafe_code``."""
        if self.task:
            from ..tasks.run import options_of

            options_of(self).validate("workbench evaluate")
        if not self.modes:
            raise ValueError(f"--modes is empty; give one or both of {', '.join(MODES)}")
        for m in self.modes:
            if m not in MODES:
                raise ValueError(f"unknown context mode {m!r}; valid: {', '.join(MODES)}")
        if not self.block_lengths or not self.thresholds:
            empty = "--block_lengths" if not self.block_lengths else "--thresholds"
            raise ValueError(f"{empty} is empty, which would drop the {'serial and ' if empty == '--block_lengths' else ''}"
                             "confidence runs of the sweep; give at least one value, e.g. "
                             f"{'[4, 8]' if empty == '--block_lengths' else '[0.9]'}")
        for t in self.thresholds:
            check_threshold(t)
        for b in self.block_lengths:
            if b <= 0:
                raise DecodeError(f"block length must be positive, got {b}")
            if self.gen_len % b:
                raise DecodeError(f"block length {b} does not divide gen_len {self.gen_len}")
        if self.batch_size <= 0:
            raise ValueError("batch_size must be positive")
        check_precision(self.precision, allow_auto=True)
        for t in self.sample_temperatures:
            if not t > 0:
                raise ValueError(f"sample temperature must be > 0, got {t}")


def decode_prompts(model, policy: str, prompts: list[Prompt], mode: str, bs: int, pad_id: int, **kw) -> DecodeResult:
    """Run ``policy`` over ``prompts`` in batches of ``bs`` and concatenate the results. With a sampling
    temperature > 0, batch c decodes with ``seed + c`` (``seed`` from ``kw``, default 0), so the batches draw
    independent samples instead of replaying one random stream."""
    fn = get_policy(policy)
    parts = []
    sampled = (kw.get("temperature") or 0) > 0
    for c, i in enumerate(range(0, len(prompts), bs)):
        chunk = prompts[i:i + bs]
        real = [list(p.real) for p in chunk] if mode == "real" else None
        kw_c = {**kw, "seed": kw.get("seed", 0) + c} if sampled else kw
        parts.append(fn(model, [list(p.prompt) for p in chunk], len(chunk[0].real), real_continuation=real,
                        pad_id=pad_id, **kw_c))
    return DecodeResult.concat(parts)


def _nll(model, prompts, res: DecodeResult, mode: str, block_length: int | None, bs: int, pad_id: int, precision: str,
         temperature: float = 1.0) -> tuple[list[float], list[float]]:
    """Per prompt: the AR negative log-likelihood of the generated tokens (nats per token) and the introspective
    acceptance α of I-DLM §2 (NaN when the decoder records no ``q``), from one introspection forward per batch."""
    nll, alpha = [], []
    for i in range(0, len(prompts), bs):
        chunk = prompts[i:i + bs]
        real = [list(p.real) for p in chunk] if mode == "real" else None
        lp = ar_token_logprobs(model, [list(p.prompt) for p in chunk], res.tokens[i:i + bs], real, block_length,
                               pad_id, precision)
        nll += [-sum(r) / len(r) if r else float("nan") for r in lp]
        qs = res.token_probs[i:i + bs] if res.token_probs else [[] for _ in chunk]
        if temperature != 1.0 and any(qs):            # a sampled decoder's q is at its temperature: so is p
            lp = ar_token_logprobs(model, [list(p.prompt) for p in chunk], res.tokens[i:i + bs], real, block_length,
                                   pad_id, precision, temperature)
        alpha += [introspective_acceptance([q], [row]) if q else float("nan") for q, row in zip(qs, lp)]
    return nll, alpha


def default_runs(cfg: EvalConfig, ar: bool = True) -> list[tuple]:
    """The sweep of ``cfg``: (mode, policy, B, τ) for AR greedy, serial and confidence, then
    (free, ar_sample, None, temperature) per ``cfg.sample_temperatures``. AR greedy and serial come first
    in each mode because the other runs are compared with them. ``ar`` False (a released diffusion LM without an
    AR mode) leaves the AR runs out."""
    runs = [(mode, "ar_greedy", b, None) for mode in cfg.modes for b in (cfg.block_lengths if mode == "real" else [None])
            if ar]
    runs += [(mode, "serial", b, None) for mode in cfg.modes for b in cfg.block_lengths]
    runs += [(mode, "confidence", b, t) for mode in cfg.modes for b in cfg.block_lengths for t in cfg.thresholds]
    if "free" in cfg.modes and ar:
        runs += [("free", "ar_sample", None, t) for t in cfg.sample_temperatures]
    return runs


def _real_metrics(p: Prompt, tokenizer, ws: set[int], known: set[str] | None) -> dict:
    """Text, repetition, whitespace share and OOV word rate of the real continuation of ``p``."""
    text = tokenizer.decode(list(p.real))
    return {"text": text, "repetition": repetition_rate(list(p.real)), "ws_share": whitespace_share(p.real, ws),
            "oov_word_rate": oov_word_rate(text, known) if known is not None else float("nan")}


def decode_identity(prompts: list[Prompt], precision: str, batch_size: int) -> tuple:
    """The part of a ``decode_cache`` key that says which decode a run is: the prompts' ids and tokens (prompt
    and real continuation, so that prompts cut by another tokenizer or length never match), the precision and
    the batch size (the batch decides the padding, so lossless comparisons stay exact). Shared by
    :func:`evaluate_model` and the leaderboard, which reuse each other's runs through one cache."""
    return tuple((p.prompt_id, p.prompt, p.real) for p in prompts), precision, batch_size


def evaluate_model(model, tokenizer, prompts: list[Prompt], cfg: EvalConfig, runs: list[tuple] | None = None,
                   policy_kwargs: dict | None = None, known: set[str] | None = None,
                   decode_cache: dict | None = None) -> pd.DataFrame:
    """Run ``runs`` (default: the sweep of ``cfg``, see :func:`default_runs`) on ``prompts``; one row per
    (prompt, mode, policy, B, τ) with :data:`METRIC_COLUMNS` plus identifiers and the generated text.

    ``runs`` are ``(mode, policy, block_length, knob)`` tuples, the knob being the threshold τ, or the
    temperature for the policies in :data:`KNOBS`; every (mode, B) needs its AR-greedy run (free mode:
    B = None) before the others, and its serial run for ``agree_serial``.
    ``policy_kwargs`` maps a policy name to extra keyword arguments (e.g. the loaded sampler).
    ``known``: identifiers of the train split (:func:`~workbench.evaluation.metrics.known_words`) for
    ``oov_word_rate``; ``None`` leaves that column NaN. It is NaN in real-context mode too, where the
    generated blocks, each following the real text, join into words no block wrote.
    ``decode_cache``: a dict shared by several calls on the same model; a run already decoded there (same
    prompts, precision and batch size; policies without ``policy_kwargs``) is reused, decode time included,
    instead of decoded again. The demo's sampler frontier and leaderboard reuse the main sweep's runs this way;
    a reused run keeps the sweep's decode time (tokens/s).
    """
    cfg.validate()
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, model.device))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ws = whitespace_ids(tokenizer, model.vocab_size)
    rows = []
    has_ar = "ar" in getattr(model, "modes", ("ar",))
    runs = default_runs(cfg, has_ar) if runs is None else runs
    policy_kwargs = policy_kwargs or {}
    ar_out: dict = {}
    serial_out: dict = {}
    nan = float("nan")
    real = [_real_metrics(p, tokenizer, ws, known) for p in prompts]    # once per prompt, not once per run

    def run_kwargs(policy, b, t) -> dict:
        kw = {"precision": cfg.precision, "block_length": b}
        if t is not None:
            kw[KNOBS.get(policy, "threshold")] = t
        return kw | policy_kwargs.get(policy, {})

    cache = {} if decode_cache is None else decode_cache
    same = decode_identity(prompts, cfg.precision, cfg.batch_size)

    def decode(mode, policy, b, t) -> DecodeResult:
        if policy in policy_kwargs:             # e.g. a loaded sampler: not part of the key, never reused
            return decode_prompts(model, policy, prompts, mode, cfg.batch_size, pad, **run_kwargs(policy, b, t))
        key = (mode, policy, b, t, same)
        if key not in cache:
            cache[key] = decode_prompts(model, policy, prompts, mode, cfg.batch_size, pad, **run_kwargs(policy, b, t))
        return cache[key]

    if runs and prompts and (*runs[0], same) not in cache:
        # warm-up, not timed: the first decode pays one-off allocator and kernel set-up
        mode, policy, b, t = runs[0]
        decode_prompts(model, policy, prompts[:cfg.batch_size], mode, cfg.batch_size, pad, **run_kwargs(policy, b, t))
    bar = tqdm(runs, desc="evaluate", disable=not cfg.progress_bar)
    for mode, policy, b, t in bar:
        knob = KNOBS.get(policy, "threshold")
        bar.set_postfix_str(f"{mode} {policy}" + (f" B={b}" if b else "") + (f" {knob}={t}" if t is not None else ""))
        res = decode(mode, policy, b, t)
        if policy == "ar_greedy":
            ar_out[(mode, b)] = res
        if policy == "serial":
            serial_out[(mode, b)] = res
        if has_ar:                  # the AR likelihood of the output needs an AR mode
            nll, alpha = _nll(model, prompts, res, mode, b, cfg.batch_size, pad, cfg.precision,
                              t if knob == "temperature" and t is not None else 1.0)
        else:
            nll = alpha = [nan] * len(prompts)
        ar_ref = ar_out.get((mode, b if mode == "real" else None))
        ser_ref = serial_out.get((mode, b))
        tps = sum(len(x) for x in res.tokens) / max(res.wall_time, 1e-9)
        for i, p in enumerate(prompts):
            gen, r = res.tokens[i], real[i]
            text = tokenizer.decode(gen)
            wsm, n_multi = whitespace_share_multi(res.step_tokens[i], ws) if not policy.startswith("ar_") else (nan, 0)
            rows.append(dict(
                prompt_id=p.prompt_id, path=p.path, category=p.category, mode=mode, policy=policy,
                block_length=b if b is not None else 0,
                threshold=t if t is not None and knob == "threshold" else nan,
                temperature=t if t is not None and knob == "temperature" else nan,
                tokens=len(gen), forwards=res.forwards[i], extra_forwards=res.extra_forwards[i],
                tpf=res.tpf(i), tpf_real=res.tpf_real(i),
                agree_ar=agreement(gen, ar_ref.tokens[i]) if ar_ref is not None else float("nan"),
                agree_serial=agreement(gen, ser_ref.tokens[i]) if ser_ref is not None else float("nan"),
                token_acc=agreement(gen, p.real), first_line_exact=float(first_line(text) == first_line(r["text"])),
                ar_nll=nll[i], introspective_acceptance=alpha[i], repetition=repetition_rate(gen),
                real_repetition=r["repetition"],
                oov_word_rate=oov_word_rate(text, known) if known is not None and mode == "free" else nan,
                real_oov_word_rate=r["oov_word_rate"],
                ws_share=whitespace_share(gen, ws), ws_share_multi=wsm, multi_tokens=n_multi,
                real_ws_share=r["ws_share"], tokens_per_s=tps, text=text,
                sampler_s_per_step=res.sampler_seconds / res.sampler_calls if res.sampler_calls else float("nan"),
                forward_s_per_step=(res.wall_time - res.sampler_seconds) / max(1, res.model_calls)))
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame, by=("mode", "policy", "block_length", "threshold", "temperature")) -> pd.DataFrame:
    """Mean of every metric per group of the ``by`` columns present in ``df`` (NaN thresholds and
    temperatures grouped as one value)."""
    knobs = [c for c in ("threshold", "temperature") if c in df.columns]
    g = df.assign(**{c: df[c].fillna(-1.0) for c in knobs}).groupby([c for c in by if c in df.columns], sort=True)
    cols = [c for c in METRIC_COLUMNS if c in df.columns]
    out = g[cols].agg(lambda s: nan_mean(s.tolist())).reset_index()
    for c in knobs:
        if c in out:
            out[c] = out[c].where(out[c] >= 0)
    out["n_prompts"] = g.size().values
    return out


def warn_untrained_positions(meta: dict, prompt_len: int, gen_len: int) -> str | None:
    """Warn (``UserWarning``) and return the message when ``prompt_len + gen_len`` tokens exceed the longest
    window the checkpoint was trained on (:func:`~workbench.model.io.trained_context`); ``None`` otherwise."""
    from ..model.io import trained_context

    ctx = trained_context(meta)
    if ctx is None or prompt_len + gen_len <= ctx:
        return None
    msg = (f"prompt + generation = {prompt_len + gen_len} tokens exceeds the model's longest training window "
           f"({ctx} tokens): the last positions were never trained; use prompt_len <= {ctx - gen_len} "
           f"to evaluate inside it")
    warnings.warn(msg, stacklevel=3)             # point at check_sweep_fits's caller
    return msg


def check_sweep_fits(model, block_lengths, prompt_len: int, gen_len: int, meta: dict | None = None) -> str | None:
    """Raise :class:`DecodeError` if a block length or prompt + generation exceeds the model context
    (the decoders' own :func:`~workbench.decoding.base.check_lengths`, run once before the sweep), or if the sweep
    has block lengths (diffusion runs) and the model no mask token. With the checkpoint's ``workbench.json`` as
    ``meta``, also warn when the sweep decodes past its longest training window (:func:`warn_untrained_positions`);
    returns that warning or ``None``."""
    if block_lengths and not getattr(model, "has_mask_token", True):
        raise DecodeError("the serial and confidence runs at --block_lengths decode in diffusion mode, which needs a "
                          "mask token, and this checkpoint's tokenizer has none: pass --add_mask_token true (a new, "
                          "untrained row: mechanics only), or score AR decoders alone with `workbench leaderboard "
                          "--decoders \"[ar_greedy]\"`")
    for b in block_lengths:
        check_lengths(model, [[0] * prompt_len], gen_len, b)
    return warn_untrained_positions(meta, prompt_len, gen_len) if meta is not None else None


@writes_out_dir("evaluate")
def run_evaluate(cfg: EvalConfig, model=None, tokenizer=None) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    """Evaluate and write ``results.parquet``, ``summary.parquet``, ``summary.json`` and ``config.json``
    to ``cfg.out_dir``. Returns (per-prompt rows, summary, run dir)."""
    from ..utils import check_out_dir, staged_dir

    if cfg.task:                                # the command dispatches a task run (evaluation.command)
        raise ValueError("run_evaluate decodes corpus prompts; a task run is evaluation.task.run_task_evaluate")
    cfg.validate()
    check_out_dir(cfg.out_dir, "evaluate")     # before minutes of decoding, without creating anything
    meta = None                                 # a model passed in has no workbench.json to check against
    if model is None:
        model, tokenizer, meta = load_model(cfg.model, resolve_device(cfg.device), cfg.add_mask_token)
        cast_for_precision(model, resolve_precision(cfg.precision, model.device))
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, model.device))   # config.json records it
    check_sweep_fits(model, cfg.block_lengths, cfg.prompt_len, cfg.gen_len, meta)
    all_docs = load_corpus(cfg.corpus)
    docs = by_split(all_docs, cfg.split)
    prompts = make_prompts(docs, cfg.n_prompts, cfg.prompt_len, cfg.gen_len, tokenizer)
    t0 = time.time()
    df = evaluate_model(model, tokenizer, prompts, cfg, known=known_words(d.text for d in by_split(all_docs, "train")))
    summary = summarize(df)
    with staged_dir(cfg.out_dir, kind="evaluate", settings=asdict(cfg)) as out:
        df.to_parquet(out / "results.parquet", index=False)
        summary.to_parquet(out / "summary.parquet", index=False)
        (out / "summary.json").write_text(json.dumps({"wall_s": time.time() - t0, "n_prompts": len(prompts),
                                                      "rows": summary.to_dict(orient="records")}, indent=2,
                                                     default=float) + "\n")
        (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return df, summary, Path(cfg.out_dir)
