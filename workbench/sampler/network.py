"""The confidence sampler network (NLD App. A): a small Transformer encoder over one block of per-position
features with a per-position linear head; its sigmoid is the probability that committing a position's
current top-1 token now gives the token the policy would finally commit there.

NLD App. A: 4 layers, d = 384, bidirectional attention over the current block, input = 144-dim features,
≈ 4.8 M parameters. Preset ``default`` reproduces that (6 heads, FFN 2·d, pre-norm, dropout 0.1:
4.82 M parameters); ``micro`` (d = 32, depth 1) is for tests. ``kind="mlp"`` is the paper's MLP-only
ablation: the same projection, position embedding and depth, with per-position MLP blocks and no attention.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

KINDS = ("attention", "mlp")


class SamplerError(ValueError):
    """A one-line, user-facing problem with a sampler config or a saved sampler directory."""


@dataclass
class SamplerConfig:
    """Shape of a :class:`SamplerNet` (stored in ``sampler.json``)."""

    kind: str = "attention"
    """'attention' (Transformer encoder, NLD App. A) or 'mlp' (per-position MLP blocks, the ablation)."""
    feature_dim: int = 144
    """Input features per position (12 + 3·PCA dims; see ``trajectories.features``)."""
    d_model: int = 384
    """Hidden width d."""
    depth: int = 4
    """Number of encoder (or MLP) blocks."""
    heads: int = 6
    """Attention heads (must divide d_model; unused by kind='mlp')."""
    ffn_mult: int = 2
    """Feed-forward width = ffn_mult · d_model."""
    dropout: float = 0.1
    """Dropout in attention, feed-forward and after the input projection."""
    max_block_length: int = 64
    """Size of the learned block-position embedding: the largest block length B the sampler accepts."""

    def validate(self) -> None:
        """Raise :class:`SamplerError` (one line) for an inconsistent shape."""
        if self.kind not in KINDS:
            raise SamplerError(f"unknown sampler kind {self.kind!r}; valid: {', '.join(KINDS)}")
        for name in ("feature_dim", "d_model", "depth", "heads", "ffn_mult", "max_block_length"):
            if getattr(self, name) <= 0:
                raise SamplerError(f"sampler {name} must be positive, got {getattr(self, name)}")
        if self.kind == "attention" and self.d_model % self.heads:
            raise SamplerError(f"sampler d_model {self.d_model} is not divisible by heads {self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise SamplerError(f"sampler dropout must lie in [0, 1), got {self.dropout}")


SAMPLER_PRESETS: dict[str, dict] = {
    "default": {},  # NLD App. A: 4 layers, d = 384, ~4.8 M parameters
    "micro": {"d_model": 32, "depth": 1, "heads": 2},
}


def sampler_preset(name: str, **overrides) -> SamplerConfig:
    """The :class:`SamplerConfig` of preset ``name`` with ``overrides`` (None values ignored).

    Raises :class:`SamplerError` listing the valid names for an unknown preset, or for an invalid result."""
    if name not in SAMPLER_PRESETS:
        raise SamplerError(f"unknown sampler preset {name!r}; valid: {', '.join(SAMPLER_PRESETS)}")
    cfg = SamplerConfig(**{**SAMPLER_PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}})
    cfg.validate()
    return cfg


class _MLPBlock(nn.Module):
    """Pre-norm residual per-position feed-forward block: ``x + FFN(LN(x))``."""

    def __init__(self, d: int, hidden: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, d),
                                nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class SamplerNet(nn.Module):
    """features ``(N, B, F)`` → commit logits ``(N, B)`` (NLD App. A).

    Input projection F → d, plus a learned embedding of the position j ∈ [0, B) inside the block, then
    ``depth`` pre-norm blocks (bidirectional self-attention over the B positions, no mask, + FFN; or FFN
    only for ``kind='mlp'``), a final LayerNorm and a per-position linear head d → 1.
    """

    def __init__(self, cfg: SamplerConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d = cfg.d_model
        self.proj = nn.Linear(cfg.feature_dim, d)
        self.pos = nn.Embedding(cfg.max_block_length, d)
        self.drop = nn.Dropout(cfg.dropout)
        if cfg.kind == "attention":
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(d, cfg.heads, cfg.ffn_mult * d, cfg.dropout, activation="gelu",
                                           batch_first=True, norm_first=True) for _ in range(cfg.depth))
        else:
            self.blocks = nn.ModuleList(_MLPBlock(d, cfg.ffn_mult * d, cfg.dropout) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` (N, B, F) float → logits (N, B) float32-or-autocast dtype.

        Raises :class:`SamplerError` if F differs from ``cfg.feature_dim`` or B > ``cfg.max_block_length``."""
        if features.ndim != 3 or features.shape[-1] != self.cfg.feature_dim:
            raise SamplerError(f"sampler expects features (N, B, {self.cfg.feature_dim}), got {tuple(features.shape)}")
        b = features.shape[1]
        if b > self.cfg.max_block_length:
            raise SamplerError(f"block length {b} exceeds the sampler's max_block_length {self.cfg.max_block_length}")
        x = self.proj(features) + self.pos.weight[:b]
        x = self.drop(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)).squeeze(-1)

    @torch.no_grad()
    def probs(self, features: torch.Tensor) -> torch.Tensor:
        """Commit probabilities ``sigmoid(forward(features))``: (N, B) float32 in (0, 1), no grad."""
        return torch.sigmoid(self.forward(features).float())


def count_parameters(net: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


# ------------------------------------------------------------------------------------------------- save / load
WEIGHTS, META = "sampler.safetensors", "sampler.json"


def save_sampler(net: SamplerNet, cfg: SamplerConfig, out_dir, meta: dict | None = None) -> Path:
    """Write ``out_dir/sampler.safetensors`` (weights) and ``out_dir/sampler.json`` =
    ``{"config": SamplerConfig fields, **meta}``; ``meta`` should carry the store's ``feature_spec`` and
    ``model_fingerprint`` so decoding can check them. Returns ``out_dir``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(out / WEIGHTS))
    (out / META).write_text(json.dumps({"config": asdict(cfg), **(meta or {})}, indent=2, default=str) + "\n")
    return out


def load_sampler(path, device: str | torch.device = "cpu") -> tuple[SamplerNet, SamplerConfig, dict]:
    """Load a directory written by :func:`save_sampler` → ``(net in eval mode, config, meta without 'config')``.

    Raises :class:`SamplerError` (one line) if the directory or a file is missing, ``sampler.json`` is not valid
    JSON / has an invalid config, or the weights do not match the config."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_dir():
        raise SamplerError(f"no sampler directory at {p}: train one with `workbench train sampler`")
    for f in (META, WEIGHTS):
        if not (p / f).is_file():
            raise SamplerError(f"{p} is not a sampler directory (no {f}): pass the 'sampler' folder of a training run")
    try:
        meta = json.loads((p / META).read_text())
        names = {f.name for f in fields(SamplerConfig)}
        cfg = SamplerConfig(**{k: v for k, v in meta.pop("config").items() if k in names})
        cfg.validate()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SamplerError(f"{p / META} is corrupt ({type(e).__name__}: {' '.join(str(e).split())[:120]}); "
                           "re-save the sampler") from None
    net = SamplerNet(cfg)
    try:
        net.load_state_dict(load_file(str(p / WEIGHTS)))
    except (SafetensorError, RuntimeError, OSError) as e:
        raise SamplerError(f"{p / WEIGHTS} is corrupt or does not match {META} ({type(e).__name__}); "
                           "re-save the sampler") from None
    return net.to(device).eval(), cfg, meta
