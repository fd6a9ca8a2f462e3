"""Options of ``workbench drafter eval`` and ``workbench drafter ablation`` (shared by the CLI and the commands)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..speculative.adapter import check_adapter_dir
from ..speculative.cli import check_speculation_options
from ..model.loading import ModelLoading

@dataclass
class EvalOptions:
    """Held-out prompts and linear self-speculation settings shared by ``eval`` and ``ablation``."""

    corpus: str = "stdlib"
    """Corpus of the held-out prompts."""
    split: str = "test"
    """Corpus split of the prompts."""
    n_prompts: int = 32
    """Prompts (at most one per file, spread over categories)."""
    prompt_len: int = 192
    """Maximum prompt length (tokens)."""
    gen_len: int = 128
    """Tokens generated per prompt."""
    draft_lengths: list[int] = field(default_factory=lambda: [8])
    """Draft lengths k of linear self-speculation."""
    temperature: float = 0.0
    """0 = greedy acceptance; > 0 = speculative sampling."""
    seed: int = 0
    """Sampling seed."""
    modes: list[str] = field(default_factory=lambda: ["real", "free"])
    """Context modes: 'real' and/or 'free'."""
    block_length: int = 32
    """Real-context segment length (divides gen_len)."""
    batch_size: int = 16
    """Prompts decoded in lockstep."""
    precision: str = "fp32"
    """'fp32' or 'bf16'."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    include_base: bool = True
    """Also evaluate the adapter-free drafter (named 'base'; the reference of the gains)."""
    progress_bar: bool = True
    """Show progress bars."""

    def validate(self) -> None:
        """Raise a one-line ``ValueError`` / ``DecodeError`` for inconsistent options."""
        check_speculation_options(self, list(self.draft_lengths))


@dataclass
class DrafterEvalConfig(EvalOptions, ModelLoading):
    """Linear self-speculation with vs without LoRA drafter adapters (NLD §3.3, Tab. 6)."""

    model: str = "builtin:tiny"
    """Base tri-mode checkpoint (directory or 'builtin:tiny')."""
    adapters: list[str] = field(default_factory=list)
    """Adapter directories ('name=path' or 'path'; the name defaults to the run directory's name)."""
    out_dir: str = "runs/drafter_eval"
    """Run directory."""

    def drafters(self) -> dict[str, str | None]:
        """Name → adapter directory (``None`` = base); raises ``FileNotFoundError`` for a missing adapter."""
        out: dict[str, str | None] = {"base": None} if self.include_base else {}
        for spec in self.adapters:
            name, _, path = spec.rpartition("=")
            p = check_adapter_dir(path)
            out[name or (p.parent.name if p.name == "adapter" else p.name)] = str(p)
        if not out:
            raise ValueError("nothing to evaluate: give --adapters or keep --include_base true")
        return out


@dataclass
class AblationConfig(EvalOptions, ModelLoading):
    """Loss-variant ablation: one LoRA drafter per loss (same config, steps, seed, data), then linear SS."""

    train_config: str = "workbench/configs/lora_tiny.yaml"
    """YAML of the LoRA training (LoraTrainConfig); its loss and out_dir are replaced per variant."""
    losses: list[str] = field(default_factory=lambda: ["lk_hybrid_ce", "lk_hybrid", "kl", "tv", "ce", "lk_alpha"])
    """Loss variants to train (registry names of workbench.drafter.losses)."""
    max_steps: int | None = None
    """Override of the training steps (same for every variant)."""
    init_from: str | None = None
    """Override of the base checkpoint (default: the train_config's init_from); also the evaluated model."""
    train_corpus: str | None = None
    """Override of the training corpus."""
    out_dir: str = "runs/lora_ablation"
    """Directory of the variant runs and the ablation tables."""

    def train_base(self):
        """The LoraTrainConfig shared by every variant."""
        from ..cli_args import parse_dataclass
        from .losses import check_loss_name
        from .train import LoraTrainConfig

        if not Path(self.train_config).is_file():
            raise FileNotFoundError(f"training config {self.train_config} does not exist")
        if not self.losses:
            raise ValueError("--losses is empty: the ablation trains one drafter per loss; name at least one, e.g. "
                             "[lk_hybrid_ce]")
        for loss in self.losses:
            check_loss_name(loss)
        argv = ["--config", self.train_config, "--progress_bar", str(self.progress_bar).lower()]
        for name, value in (("max_steps", self.max_steps), ("init_from", self.init_from),
                            ("corpus", self.train_corpus)):
            if value is not None:
                argv += [f"--{name}", str(value)]
        cfg = parse_dataclass("workbench drafter ablation", LoraTrainConfig, argv)
        cfg.validate()
        return cfg
