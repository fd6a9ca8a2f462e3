"""The learned-sampler decoding policy (NLD §3.2, App. A): each forward, features from the live logits
→ the sampler → commit every masked position whose sampler probability ≥ threshold, and at least one.

That one (the *fallback*, when no position reaches the threshold) is by default the model's most confident masked
position, the position serial decoding (confidence, k = 1) commits. The sampler's label is agreement with the
token the collection policy finally commits there (NLD App. A, "under the same policy"); for a store collected
with serial decoding, the workbench's default and every shipped sampler's, that is the serial decode (NLD §3.2:
"the token that will eventually be committed at this position when decoding only the highest-confidence token at
each step"), so with this fallback a threshold above every sampler probability decodes exactly the serial target.
(Rows from a hybrid store, ``--extra_stores``, are labelled against the hybrid policy's commits, which lean towards
the ground truth.) ``fallback="sampler"`` commits the sampler's own top position instead (the workbench's
earlier rule, kept for the ablation): its trajectory leaves serial order even at a threshold near 1.

The features come from :func:`workbench.trajectories.features.block_features` applied to
:func:`~workbench.trajectories.features.step_record` of the live probabilities, i.e. exactly the
function and quantisation used on store rows at training time.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..trajectories.features import block_features, step_record
from ..decoding.base import DecodeError, DecodeResult
from ..decoding.diffusion import diffusion_decode
from ..decoding.rules import most_confident, passed_or_fallback


@dataclass
class LoadedSampler:
    """A sampler network ready for decoding: ``net`` maps ``(N, B, F)`` features to ``(N, B)`` logits."""

    net: torch.nn.Module
    token_pca: np.ndarray
    feature_dim: int
    meta: dict
    _matched_models: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False)

    @classmethod
    def load(cls, path: str | Path, device="cpu") -> "LoadedSampler":
        """Load a sampler directory written by ``workbench train sampler`` (weights, ``sampler.json``,
        ``token_pca.npy``). Raises ``FileNotFoundError`` / ``ValueError`` with a one-line reason."""
        from .network import load_sampler

        net, cfg, meta = load_sampler(path)
        pca_file = Path(path) / "token_pca.npy"
        if not pca_file.is_file():
            raise FileNotFoundError(f"{pca_file} is missing: the sampler directory must hold the store's token_pca")
        return cls(net.to(device).eval(), np.load(pca_file), int(cfg.feature_dim), meta)

    def check_compatible(self, model, block_length: int) -> None:
        """Refuse to decode outside what the sampler was trained on: another block length (its position
        embeddings past the trained B were never trained) or another model (its features and labels came
        from that model's trajectories). ``block_length`` and ``model_fingerprint`` come from the
        ``sampler.json`` metadata that ``workbench train sampler`` writes; a missing key is not checked.
        The fingerprint (a hash of every weight) is computed once per model object.

        Raises:
            DecodeError: one line naming the mismatch and the fix.
        """
        trained_b = self.meta.get("block_length")
        if trained_b is not None and int(trained_b) != block_length:
            raise DecodeError(f"the sampler was trained at block length {trained_b}, not {block_length}: decode at "
                              f"B = {trained_b} or train a sampler on a store's B = {block_length} group")
        expected = self.meta.get("model_fingerprint")
        if expected and model not in self._matched_models:
            from ..model.fingerprint import model_fingerprint

            got = model_fingerprint(model)
            if got != expected:
                raise DecodeError(f"the sampler was trained on trajectories of model {expected}, but this model's "
                                  f"fingerprint is {got}: train a sampler on a store collected from this model")
            self._matched_models.add(model)


#: Which single position the sampler rule commits when none reaches the threshold (see the module docstring).
SAMPLER_FALLBACKS = ("confidence", "sampler")


def check_fallback(fallback: str) -> None:
    """Raises :class:`DecodeError` (one line, listing the valid names) for an unknown sampler fallback."""
    if fallback not in SAMPLER_FALLBACKS:
        raise DecodeError(f"unknown sampler fallback {fallback!r}; valid: {', '.join(SAMPLER_FALLBACKS)}")


class SamplerRule:
    """Commit rule backed by a trained sampler. Stateful: tracks the step index of each row inside its
    block (0 at the all-mask state) and the seconds spent in feature extraction + sampler forward.

    ``fallback``: the one position committed when no sampler probability reaches the threshold: the model's
    most confident masked position (``"confidence"``, serial decoding's choice) or the sampler's top one
    (``"sampler"``). Raises :class:`DecodeError` for a negative threshold or an unknown fallback."""

    def __init__(self, sampler: LoadedSampler, threshold: float, fallback: str = "confidence"):
        if threshold < 0:
            raise DecodeError(f"sampler threshold must be ≥ 0, got {threshold}")
        check_fallback(fallback)
        self.s, self.threshold, self.fallback = sampler, float(threshold), fallback
        self.steps: torch.Tensor | None = None
        self.seconds = 0.0
        self.calls = 0
        self._pca = torch.as_tensor(sampler.token_pca)

    @torch.no_grad()
    def __call__(self, probs: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        n, b = masked.shape
        fresh = masked.all(dim=1)
        if self.steps is None or self.steps.shape[0] != n:
            self.steps = torch.zeros(n, dtype=torch.long, device=masked.device)
        self.steps = torch.where(fresh, torch.zeros_like(self.steps), self.steps + 1)
        rec = step_record(probs, masked)
        feats = block_features(rec["top_ids"], rec["top_probs"], rec["entropy"], rec["masked"], self.steps,
                               self._pca.to(masked.device), self.s.feature_dim)
        # the sampler was trained in fp32: keep the decode's bf16 autocast off its forward
        with torch.autocast(masked.device.type, enabled=False):
            logits = self.s.net(feats.float().to(next(self.s.net.parameters()).device))
        p = torch.sigmoid(logits.float()).to(masked.device)
        passed = (p >= self.threshold) & masked
        # serial decoding's choice from the top-1 probabilities step_record already took (no second max over V)
        one = most_confident(rec["top_probs"][..., 0] if self.fallback == "confidence" else p, masked)
        commit = passed_or_fallback(passed, one)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return commit


def sampler_decode(model, prompts, gen_len: int, block_length: int, threshold: float = 0.5,
                   sampler: LoadedSampler | str | None = None, fallback: str = "confidence", **kw) -> DecodeResult:
    """Block-diffusion decoding with the sampler policy. ``sampler`` is a :class:`LoadedSampler` or a
    sampler directory. The returned result carries ``sampler_seconds`` and ``sampler_calls``
    (feature extraction + sampler forward, for the overhead report). Threshold 0 commits every masked
    position in one forward; a threshold > 1 commits exactly one position per forward: with the default
    ``fallback="confidence"`` that is the serial decode (NLD §4.1). Raises :class:`DecodeError` without a
    sampler, for a sampler of another model or block length, or an unknown ``fallback``."""
    if sampler is None:
        raise DecodeError("the sampler policy needs --sampler <trained sampler directory>")
    if not isinstance(sampler, LoadedSampler):
        sampler = LoadedSampler.load(sampler, model.device)
    sampler.check_compatible(model, block_length)
    rule = SamplerRule(sampler, threshold, fallback)
    res = diffusion_decode(model, prompts, gen_len, block_length, rule, **kw)
    res.sampler_seconds = rule.seconds
    res.sampler_calls = rule.calls
    return res
