"""The demo's options and the configs its stages run, built once so that the up-front checks and the stages
validate the same objects."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..model.loading import ModelLoading

HEADLINE = {"block_length": 16, "threshold": 0.9}
"""The report's headline setting for a byte-level model (tiny's targets are at B = 16)."""
HEADLINE_BLOCK_LENGTH_BPE = 8
"""The headline block length for a BPE model: the real model's targets (:data:`TARGETS`) are at B = 8."""
SHIPPED_LEGS = ("tiny.yaml", "tiny_continue.yaml", "tiny_leg3.yaml", "tiny_leg4.yaml", "tiny_leg5.yaml",
                "tiny_leg6.yaml", "tiny_leg7.yaml")
"""The training legs of the shipped ``tiny`` model, in order (``workbench/configs``); ``--retrain`` runs them."""
TARGETS = {"heldout_ar": 1.0, "tpf": 1.5, "agree_serial": 0.95, "agree_ar": 0.9, "free_running_ratio": 1.5}
"""The targets the report checks, the goals the workbench set for its shipped models: tiny's (held-out loss, TPF
and agreement with the serial target) and the real model's (TPF and agreement with AR greedy, both at B = 8,
τ = 0.9). ``free_running_ratio``: free-running AR-greedy and diffusion continuations count as not degenerate when their repetition rate and whitespace share are each at most this multiple of
the real continuations' (the goal is "close to"; the multiple is the workbench's reading of it)."""


@dataclass
class DemoConfig(ModelLoading):
    """The main job's options (defaults reproduce the documented demo)."""

    model: str = "builtin:tiny"
    """Checkpoint to evaluate: 'builtin:tiny' (shipped) or a local Hugging Face checkpoint directory."""
    retrain: bool = False
    """Reproduce the model from scratch first with ``train_config`` (long on a CPU; default: the legs of the
    shipped model, :data:`SHIPPED_LEGS`). The legs go to ``<out_dir>.retrain/``; after an interruption, the
    same command resumes them."""
    train_config: str | None = None
    """YAML of a single retraining run (default: the shipped model's legs, :data:`SHIPPED_LEGS`)."""
    out_dir: str = "runs/demo"
    """Run directory (created; an existing demo there is replaced)."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    n_prompts: int = 16
    """Held-out code-continuation prompts (16 = one batch at the default batch size)."""
    prompt_len: int = 192
    """Maximum prompt length (tokens)."""
    gen_len: int = 128
    """Generated tokens per prompt."""
    block_lengths: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    """Block lengths of diffusion mode."""
    thresholds: list[float] = field(default_factory=lambda: [0.5, 0.7, 0.9, 0.95])
    """Confidence thresholds τ."""
    headline_block_length: int | None = None
    """Block length of the report's headline row (confidence at τ = 0.9) and free-running check; one of
    ``block_lengths``. Unset: 16 for a byte-level model (tiny's targets), 8 for a BPE one (the real model's),
    or the largest of ``block_lengths`` when that one is not swept."""
    modes: list[str] = field(default_factory=lambda: ["real", "free"])
    """Context modes: 'real' and/or 'free'."""
    sample_temperatures: list[float] = field(default_factory=lambda: [1.0])
    """Temperatures of free-running AR sampling runs, reported next to greedy as a looping diagnostic."""
    collect: bool = True
    """Collect a trajectory store from the model (``workbench collect``) and report it."""
    collect_prompts: int = 224
    """Prompts of the demo's trajectory collection (4 blocks each, per block length)."""
    collect_block_lengths: list[int] = field(default_factory=lambda: [8, 32])
    """Block lengths of the demo's trajectory store."""
    collect_policy: str = "serial"
    """Trajectory policy of the demo's store (serial, hybrid, confidence)."""
    store: str | None = None
    """Where the demo's trajectory store is written (default: ``<out_dir>/trajectories.zarr``)."""
    sampler: bool = True
    """Train the confidence sampler + MLP ablation on the store, compare frontiers, run a short sweep."""
    sampler_block_length: int = 8
    """Block length of the sampler stage (NLD Fig. 8 uses 32; the demo uses 8, a block length of its leaderboard,
    so that the sampler has a row in the headline table)."""
    sampler_epochs: int = 2
    """Sampler training epochs (early stopping on held-out AUC; each epoch ends with a validation)."""
    sampler_max_steps: int = -1
    """Cap on sampler optimiser steps (-1 = none). A cap that ends training mid-epoch wastes the steps after
    the last validation, since the best-AUC checkpoint is the one kept."""
    sampler_mlp_frontier: bool = True
    """Also decode the MLP-only ablation over the frontier's thresholds and score it by the area under its
    accuracy–TPF frontier (NLD App. A). Off, the ablation is reported by its held-out AUC only (six decodes fewer)."""
    sweep_trials: int = 6
    """Trials of the demo's Optuna threshold sweep (0 = skip)."""
    sol: bool = True
    """Run the speed-of-light analysis (NLD §4) on held-out prompts and add its table and figures."""
    sol_prompts: int = 12
    """Held-out prompts of the SOL stage."""
    sol_gen_len: int = 64
    """Tokens reproduced per prompt in the SOL stage (a multiple of every block length)."""
    sol_block_lengths: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    """Block lengths of the SOL stage."""
    lora: bool = True
    """Train a small LoRA drafter (NLD §3.3) and report linear self-speculation with / without it."""
    lora_steps: int = 60
    """Optimiser steps of the demo's LoRA drafter (``configs/lora_tiny.yaml`` otherwise)."""
    lora_prompts: int = 12
    """Held-out prompts of the self-speculation evaluation."""
    deer: bool = True
    """Run a short DEER alignment (teacher data, Stage I, Stage II) and report DEER decoding's τ."""
    deer_answers: int = 128
    """Teacher answers of the demo's DEER stage."""
    deer_stage1_steps: int = 60
    """Stage I optimiser steps of the demo's DEER drafter."""
    deer_stage2_steps: int = 30
    """Stage II optimiser steps of the demo's DEER drafter."""
    deer_prompts: int = 8
    """Held-out prompts of the DEER evaluation (batch 1)."""
    leaderboard: bool = True
    """Run the leaderboard (every registered decoder against the SOL ceilings): the report's headline table."""
    leaderboard_prompts: int = 8
    """Held-out prompts of the leaderboard stage."""
    leaderboard_decoders: list[str] | None = None
    """Decoders of the leaderboard stage (default: every registered one but the ablations; the references always
    run)."""
    leaderboard_real_context_decoders: list[str] | None = None
    """Decoders of the leaderboard stage that also get real-context rows (default: all that can; the references
    always do). The headline table shows the free-running rows."""
    leaderboard_ablations: bool = False
    """Also run the registered ablations (e.g. diffuspec_cps, diffuspec_adl) when leaderboard_decoders is not set."""
    leaderboard_gen_len: int = 64
    """Tokens per prompt in the leaderboard stage (a multiple of every leaderboard block length)."""
    leaderboard_block_lengths: list[int] = field(default_factory=lambda: [4, 8, 16])
    """Block / draft lengths of the leaderboard stage (its SOL ceilings are computed at these too; B = 32 is in
    the SOL stage: quadratic self-speculation at k = 32 runs 33² tokens a forward, 4 min of the demo alone)."""
    leaderboard_thresholds: list[float] = field(default_factory=lambda: [0.7, 0.9])
    """Confidence / sampler thresholds of the leaderboard stage."""
    leaderboard_precision: str = "fp32"
    """Precision of the leaderboard stage (fp32: lossless decoders are exact; see the leaderboard's docs)."""
    task: str | None = None
    """Also run the leaderboard's decoders on a task and put its accuracy-vs-TPF plot in the report: 'humaneval'
    (the answers run as programs: needs --confirm_run_unsafe_code). Off by default."""
    task_problems: str | None = "0:20"
    """The task stage's problems (a slice such as '0:20', or task ids; null: all)."""
    task_gen_len: int = 128
    """Tokens per answer in the task stage (a multiple of every leaderboard block length)."""
    confirm_run_unsafe_code: bool = False
    """Allow the task stage's model-written code to run (a bare flag; see docs/guides/humaneval.md)."""

    BARE_FLAGS: ClassVar[tuple[str, ...]] = ("confirm_run_unsafe_code",)
    heldout_windows: int = 128
    """Validation windows (256 tokens) for the held-out loss."""
    batch_size: int = 16
    """Prompts decoded in lockstep."""
    precision: str = "auto"
    """'auto' (bf16 autocast where the CPU or GPU has native bf16 matmuls, else fp32: a CPU without AVX-512 BF16 or
    AMX emulates bf16, several times slower than fp32), 'bf16' (autocast) or 'fp32'."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    add_mask_token: bool = False
    """Add a [MASK] token (and resize the embeddings) when the checkpoint's tokenizer has none."""
    threads: int | None = None
    """torch CPU threads (default: torch's choice)."""
    progress_bar: bool = True
    """Show progress bars."""
    results_table: str | None = None
    """Also append the leaderboard stage's figures to a results table (JSON lines; the repository's is
    benchmarks/results.jsonl)."""


def check_stage_options(cfg: DemoConfig) -> None:
    """The later stages' options, checked before any work: the collection and SOL configs the stages will run
    (their own ``validate``) and the sampler's block length. Raises ``ValueError`` naming the stage."""
    stages = [("collection (--collect_*)", cfg.collect, lambda: collect_config(cfg, cfg.model, "unused")),
              ("SOL (--sol_*)", cfg.sol, lambda: sol_config(cfg, "unused")),
              ("leaderboard (--leaderboard_*)", cfg.leaderboard, lambda: leaderboard_config(cfg, cfg.model, "unused")),
              ("task (--task*)", bool(cfg.task), lambda: task_config(cfg, cfg.model, "unused"))]
    for name, enabled, make in stages:
        if enabled:
            try:
                make().validate()
            except ValueError as e:
                raise ValueError(f"demo stage {name}: {e}") from None
    if cfg.sampler and (cfg.sampler_block_length <= 0 or cfg.gen_len % cfg.sampler_block_length):
        raise ValueError(f"--sampler_block_length {cfg.sampler_block_length} must be positive and divide --gen_len "
                         f"{cfg.gen_len} (or pass --sampler false)")
    if cfg.sampler and cfg.collect and cfg.sampler_block_length not in cfg.collect_block_lengths:
        raise ValueError(f"--sampler_block_length {cfg.sampler_block_length} is not among --collect_block_lengths "
                         f"{list(cfg.collect_block_lengths)}, so no store would train the sampler; add it there")
    if cfg.sampler and cfg.leaderboard and cfg.sampler_block_length not in cfg.leaderboard_block_lengths:
        raise ValueError(f"--sampler_block_length {cfg.sampler_block_length} is not among --leaderboard_block_lengths "
                         f"{list(cfg.leaderboard_block_lengths)}, where the leaderboard decodes with the demo's sampler; "
                         "add it there")
    if cfg.headline_block_length is not None and cfg.headline_block_length not in cfg.block_lengths:
        raise ValueError(f"--headline_block_length {cfg.headline_block_length} is not among --block_lengths "
                         f"{list(cfg.block_lengths)}: add it there, or leave it unset")
    if cfg.threads is not None and cfg.threads < 0:
        raise ValueError(f"--threads must be ≥ 0 (0 or unset: torch's default), got {cfg.threads}")


def resolve_headline_block_length(cfg: DemoConfig, byte_level: bool) -> int:
    """``cfg.headline_block_length``, or when unset the targets' block length of this kind of model (16 for a
    byte-level one, :data:`HEADLINE`; 8 for a BPE one, :data:`HEADLINE_BLOCK_LENGTH_BPE`) when it is swept, else
    the largest swept one."""
    if cfg.headline_block_length is not None:
        return cfg.headline_block_length
    want = HEADLINE["block_length"] if byte_level else HEADLINE_BLOCK_LENGTH_BPE
    return want if want in cfg.block_lengths else max(cfg.block_lengths)


def collect_config(cfg: DemoConfig, model_spec, out: str):
    """The collection stage's :class:`~workbench.trajectories.collect.CollectConfig`, writing ``out``."""
    from ..trajectories.collect import CollectConfig

    return CollectConfig(model=str(model_spec), out=out, policy=cfg.collect_policy,
                         block_lengths=list(cfg.collect_block_lengths), corpus=cfg.corpus, split="train",
                         n_prompts=cfg.collect_prompts, precision=cfg.precision, progress_bar=cfg.progress_bar,
                         accelerator="cpu" if cfg.device == "cpu" else "auto")


def sol_config(cfg: DemoConfig, out_dir: str, adapter: str | None = None):
    """The SOL stage's :class:`~workbench.sol.run.SolConfig`, writing ``out_dir``."""
    from ..sol.run import SolConfig

    return SolConfig(model=cfg.model, corpus=cfg.corpus, n_prompts=cfg.sol_prompts, prompt_len=cfg.prompt_len,
                     gen_len=cfg.sol_gen_len, block_lengths=list(cfg.sol_block_lengths), out_dir=out_dir,
                     precision=cfg.precision, progress_bar=cfg.progress_bar, adapter=adapter)


def _default_decoders(cfg: DemoConfig) -> list[str]:
    """Every registered decoder, without the ablations unless ``cfg.leaderboard_ablations``, and without the released
    families' own decoders (the demo's models are the workbench's tri-mode ones)."""
    from ..decoding.registry import DECODERS, load_decoders

    load_decoders()
    return sorted(n for n, spec in DECODERS.items()
                  if (cfg.leaderboard_ablations or not spec.ablation) and not spec.reference_of)


def leaderboard_config(cfg: DemoConfig, model_spec, out_dir: str, sampler: str | None = None,
                       drafter: str | None = None, adapter: str | None = None):
    """The leaderboard stage's :class:`~workbench.leaderboard.config.LeaderboardConfig`, writing ``out_dir``."""
    from ..leaderboard.config import LeaderboardConfig

    return LeaderboardConfig(model=str(model_spec), corpus=cfg.corpus, n_prompts=cfg.leaderboard_prompts,
                             prompt_len=cfg.prompt_len, gen_len=cfg.leaderboard_gen_len,
                             block_lengths=list(cfg.leaderboard_block_lengths), thresholds=list(cfg.leaderboard_thresholds),
                             modes=list(cfg.modes), sampler=sampler, drafter=drafter, adapter=adapter,
                             real_context_decoders=cfg.leaderboard_real_context_decoders,
                             decoders=list(cfg.leaderboard_decoders or _default_decoders(cfg)),
                             skip_missing=True, precision=cfg.leaderboard_precision, batch_size=cfg.batch_size,
                             device=cfg.device, out_dir=out_dir, progress_bar=cfg.progress_bar,
                             results_table=cfg.results_table)


def task_config(cfg: DemoConfig, model_spec, out_dir: str, sampler: str | None = None, drafter: str | None = None,
                adapter: str | None = None):
    """The task stage's :class:`~workbench.leaderboard.config.LeaderboardConfig`: the leaderboard stage's decoders and
    settings on ``cfg.task``'s problems, free-running, without the SOL ceilings, writing ``out_dir``."""
    from dataclasses import replace

    return replace(leaderboard_config(cfg, model_spec, out_dir, sampler, drafter, adapter), task=cfg.task,
                   problems=cfg.task_problems, gen_len=cfg.task_gen_len, modes=["free"], sol=False,
                   confirm_run_unsafe_code=cfg.confirm_run_unsafe_code, results_table=None)
