"""``workbench speculate``: evaluate a checkpoint (optionally with a LoRA drafter adapter) with AR greedy,
linear and quadratic self-speculation on held-out prompts (NLD §3.3, App. C).

Writes to the run directory (built in ``<out_dir>.partial`` and renamed at the end):
``results.parquet`` (one row per mode × method × prompt, see
:func:`~workbench.speculative.evaluate.evaluate_speculation`), ``summary.parquet`` (per mode × method ×
category plus ``category = 'all'``), ``summary.json`` and the resolved ``config.json``.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..decoding.base import DecodeError
from ..decoding.sampling import check_sampling
from ..utils import writes_out_dir
from .adapter import check_adapter_dir, load_adapter
from ..model.loading import ModelLoading


@dataclass
class SpeculateConfig(ModelLoading):
    """Self-speculation evaluation: AR greedy vs linear and quadratic self-speculation (NLD §3.3, App. C)."""

    model: str = "builtin:tiny"
    """Checkpoint directory or 'builtin:tiny'."""
    adapter: str | None = None
    """Optional peft LoRA drafter directory (PeftModel.from_pretrained on the backbone)."""
    corpus: str = "stdlib"
    """Corpus of the held-out prompts."""
    split: str = "test"
    """Corpus split of the prompts."""
    n_prompts: int = 16
    """Prompts (at most one per file, spread over categories)."""
    prompt_len: int = 192
    """Maximum prompt length (tokens)."""
    gen_len: int = 128
    """Tokens generated per prompt."""
    draft_lengths: list[int] = field(default_factory=lambda: [4, 8, 16])
    """Draft lengths k of linear self-speculation."""
    quadratic_draft_lengths: list[int] = field(default_factory=lambda: [4])
    """Draft lengths k of quadratic self-speculation (a forward holds (k+1)(k+2) tokens); [] skips it."""
    ensemble_lambdas: list[float] = field(default_factory=lambda: [1.0])
    """λ of the quadratic AR–diffusion ensemble verifier (1 = pure AR, lossless)."""
    temperature: float = 0.0
    """0 = greedy acceptance; > 0 = speculative sampling at this temperature."""
    top_k: int = 0
    """Top-k filter of speculative sampling, applied to the drafts' q and the verifier's p alike (0 = off)."""
    top_p: float = 1.0
    """Top-p (nucleus) filter of speculative sampling, on q and p alike, in (0, 1] (1 = off)."""
    seed: int = 0
    """Sampling seed."""
    modes: list[str] = field(default_factory=lambda: ["real", "free"])
    """Context modes: 'real' (reset to the real continuation every block_length tokens) and/or 'free'."""
    block_length: int = 32
    """Real-context segment length (divides gen_len)."""
    batch_size: int = 16
    """Prompts decoded in lockstep."""
    precision: str = "fp32"
    """'fp32', 'bf16' (bf16 autocast on fp32 weights) or 'bf16-true' (weights stored in bf16; faster on CPU)."""
    merge_adapter: bool = False
    """Gated-LoRA models: forwards with the adapter on at every position (diffusion blocks, linear self-speculation
    drafts in the in_block layout) use one merged weight W + (α/r)·BA per layer, about a base forward's cost
    (lossless decoders stay lossless; in bf16 a draft token can differ by rounding). Needs a gated-LoRA model."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    add_mask_token: bool = False
    """Add a [MASK] token when the checkpoint's tokenizer has none."""
    out_dir: str = "runs/speculate"
    """Run directory."""
    progress_bar: bool = True
    """Show a progress bar."""

    def validate(self) -> None:
        """Raise a one-line ``ValueError`` / ``DecodeError`` for inconsistent options."""
        check_speculation_options(self, list(self.draft_lengths) + list(self.quadratic_draft_lengths))
        check_sampling(self.temperature, self.top_k, self.top_p)
        if self.quadratic_draft_lengths and not self.ensemble_lambdas:
            raise ValueError("--ensemble_lambdas is empty, which would drop the quadratic runs; give at least one "
                             "λ, e.g. [1.0], or leave quadratic self-speculation out with --quadratic_draft_lengths []")
        for lam in self.ensemble_lambdas:
            if not 0.0 <= lam <= 1.0:
                raise DecodeError(f"ensemble_lambda must be in [0, 1], got {lam}")
        if self.adapter:
            check_adapter_dir(self.adapter)


def check_speculation_options(cfg, draft_lengths: list[int]) -> None:
    """Shared checks of the speculation evaluation configs (``modes``, ``block_length``, ``gen_len``,
    ``temperature``, ``batch_size``, ``n_prompts`` attributes of ``cfg``). Raises a one-line ``ValueError``
    or :class:`~workbench.decoding.base.DecodeError`."""
    if not cfg.modes:
        raise ValueError("--modes is empty; give one or both of real, free")
    for m in cfg.modes:
        if m not in ("real", "free"):
            raise ValueError(f"unknown context mode {m!r}; valid: real, free")
    if "real" in cfg.modes and (cfg.block_length <= 0 or cfg.gen_len % cfg.block_length):
        raise DecodeError(f"block length {cfg.block_length} must be positive and divide gen_len {cfg.gen_len}")
    if not draft_lengths or min(draft_lengths) < 1:
        raise DecodeError(f"draft lengths must be ≥ 1, got {draft_lengths}")
    if cfg.temperature < 0 or cfg.batch_size <= 0 or cfg.n_prompts <= 0:
        raise ValueError("need temperature ≥ 0, batch_size > 0 and n_prompts > 0")


def attach_adapter(model, adapter_dir: str):
    """:func:`~workbench.speculative.adapter.load_adapter` for inference (frozen, eval mode); returns ``model``."""
    load_adapter(model, adapter_dir).backbone.eval()
    return model


@writes_out_dir("speculate")
def run_speculate(cfg: SpeculateConfig, model=None, tokenizer=None) -> dict:
    """Run the evaluation and write the run directory; returns ``{"results", "summary", "out_dir", "wall_s"}``."""
    from ..corpus import by_split, load_corpus
    from ..decoding.base import cast_for_precision
    from ..model.gated_lora import merged_adapter
    from ..model.load import load_model, resolve_device
    from ..evaluation.prompts import make_prompts
    from ..utils import check_out_dir, staged_dir
    from .evaluate import default_methods, evaluate_speculation, summarize_speculation

    cfg.validate()
    check_out_dir(cfg.out_dir, "speculate")                # before loading the model and decoding
    if model is None:
        model, tokenizer, _ = load_model(cfg.model, resolve_device(cfg.device), cfg.add_mask_token)
        if cfg.adapter:
            attach_adapter(model, cfg.adapter)
        cast_for_precision(model, cfg.precision)
    if cfg.merge_adapter:
        merged_adapter(model)
    docs = by_split(load_corpus(cfg.corpus), cfg.split)
    prompts = make_prompts(docs, cfg.n_prompts, cfg.prompt_len, cfg.gen_len, tokenizer)
    methods = default_methods(cfg.draft_lengths, cfg.quadratic_draft_lengths, cfg.ensemble_lambdas,
                              cfg.temperature, cfg.seed, cfg.top_k, cfg.top_p)
    t0 = time.time()
    with staged_dir(cfg.out_dir, kind="speculate", settings=asdict(cfg)) as run:
        df = evaluate_speculation(model, tokenizer, prompts, methods, cfg.modes, cfg.block_length, cfg.batch_size,
                                  cfg.precision, cfg.progress_bar)
        summary = summarize_speculation(df)
        wall = time.time() - t0
        df.to_parquet(run / "results.parquet", index=False)
        summary.to_parquet(run / "summary.parquet", index=False)
        overall = summary[summary["category"] == "all"]
        (run / "summary.json").write_text(json.dumps({"wall_s": wall, "n_prompts": len(prompts),
                                                      "overall": overall.to_dict(orient="records")},
                                                     indent=2, default=float) + "\n")
        (run / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return {"results": df, "summary": summary, "out_dir": Path(cfg.out_dir), "wall_s": wall}


def main(argv: list[str]) -> int:
    """``workbench speculate``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench speculate", SpeculateConfig, argv)
    r = run_speculate(cfg)
    s = r["summary"]
    cols = ["mode", "method", "tau", "max_accepted", "share_accept_ge8", "tpf", "tpf_real", "agree_ar", "token_acc",
            "tokens_per_s", "speedup_vs_ar"]
    print(s[s["category"] == "all"][cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"results: {r['out_dir'] / 'results.parquet'} ({r['wall_s']:.0f} s)")
    return 0
