"""The decoder registry: every decoder registers a :class:`DecoderSpec` by name, from its own package.

The core decoding package registers the decoders it implements (AR, block diffusion). A higher-level package
registers its own in a module named ``decoders`` (``workbench/speculative/decoders.py``,
``workbench/deer/decoders.py``, ...); :func:`load_decoders` imports every such module it finds, so this
package never imports a higher one and a decoder added later appears in ``workbench leaderboard`` (and
anywhere else that lists :data:`DECODERS`) without any edit there.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import pkgutil
from dataclasses import dataclass
from typing import Callable

from .base import DecodeError, DecodeResult, stop_at_eos

#: What a decoder's setting sweeps over in the leaderboard.
SWEEPS = ("none", "block_length", "block_length+threshold", "draft_length")


@dataclass(frozen=True)
class DecoderSpec:
    """A registered decoder.

    Attributes:
        name: registry name (``--policy`` / leaderboard row).
        decode: ``decode(model, prompts, gen_len, **options) -> DecodeResult``.
        family: ``"ar"``, ``"diffusion"`` (block diffusion of the model itself) or ``"speculative"`` (draft and
            verify).
        sweep: the setting the leaderboard sweeps (one of :data:`SWEEPS`): nothing, the block length B, B and
            the confidence threshold τ, or the draft length k.
        block_commits: tokens become final a whole block at a time (block diffusion); decides how
            :func:`~workbench.decoding.base.stop_at_eos` recounts forwards.
        lossless: the decoder claims output equal to AR greedy of the target at temperature 0.
        ceiling: the SOL ceiling that applies: ``"serial"`` (diffusion policies), ``"ar_greedy"`` (lossless
            self-speculation) or ``None``.
        needs: name of an artefact option the decoder cannot run without (``sampler``, ``drafter``) or None.
        needs_hint: the command that makes that artefact (quoted in the error when it is missing).
        temperature: the decoder samples (its ``temperature`` option must be > 0).
        real_context: the decoder also runs in real-context mode (every segment conditioned on the real text).
        target_forwards: which counted forwards of its :class:`~workbench.decoding.base.DecodeResult` run the
            target model: ``"forwards"`` (AR, block diffusion without its KV-commit forward, one-forward
            speculation), ``"both"`` (draft and verify forwards of self-speculation) or ``"extra"`` (a separate
            drafter's decoders: only the verify forwards are the target's).
        cost: ``cost(length, drafter_ratio) -> (w_forward, w_extra)``: FLOPs of one counted forward and of one
            extra forward, in units of a one-token target forward (``length`` = B or k, ``drafter_ratio`` =
            drafter parameters ÷ target parameters). None: by family (AR ``(1, 0)``, block diffusion ``(B, B)``,
            speculation ``(k + 1, k + 1)``).
        load: ``load(path, model, tokenizer) -> artefact`` for the decoder's ``needs`` option (e.g. a loaded
            sampler), passed to ``decode`` as the keyword ``needs``.
        lora_drafter: the decoder drafts with a LoRA drafter adapter (``workbench train lora``) and verifies with
            the adapter off, so it stays lossless with one (self-speculation, NLD §3.3); the leaderboard gives it
            a second row with ``--adapter``. Decoders whose verifier would run with the adapter (ISD) leave it off.
        ablation: the decoder is an ablation of another (a component switched off); the demo's leaderboard
            leaves it out unless asked (``--leaderboard_ablations true``), ``workbench leaderboard`` runs it.
        needs_mode: the mode of the model the decoder runs (``"ar"`` or ``"diffusion"``; None: ``"ar"`` for AR and
            speculative decoders, whose verifier is the model's AR mode, ``"diffusion"`` otherwise). A model of a
            family without it (:attr:`~workbench.model.families.adapters.FamilyLM.modes`) is refused in one line.
        reference_of: the released model families (:mod:`workbench.model.families`) whose authors ship this
            decoder; the default decoder lists (leaderboard, demo) include it only for a model of those families.
        approximates: the decoder whose exact computation this one approximates (a cache that is not exact); the
            leaderboard reports their agreement (``agree_exact``).
        description: one line for listings.
        reference: what the decoder reproduces: ``"<repository> <file>: <function>"`` (a released family's own
            sampler, with the settings it is reproduced at), a paper (``"<paper> (arXiv <id>) §<section>"``), or
            ``"own: ..."`` saying how it differs from the nearest published loop.
        options: the keyword options the decoder takes; :func:`get_policy` refuses any other in one line. None:
            the parameters of ``decode`` after ``(model, prompts, gen_len)`` (those a ``functools.partial`` binds
            excluded); a ``decode`` that takes ``**kwargs`` must list them, or nothing is checked (every built-in
            decoder lists or states them: ``tests/test_decoder_options.py``).
        own_eos_rule: the decoder takes ``eos_id`` and stops at it as its reference does (forward counts
            included; see :func:`get_policy`); otherwise :func:`get_policy` cuts its result with
            :func:`~workbench.decoding.base.stop_at_eos`.
    """

    name: str
    decode: Callable[..., DecodeResult]
    family: str = "diffusion"
    sweep: str = "none"
    block_commits: bool = False
    lossless: bool = False
    ceiling: str | None = None
    needs: str | None = None
    needs_hint: str | None = None
    temperature: bool = False
    real_context: bool = True
    target_forwards: str = "forwards"
    cost: Callable[[int, float], tuple[float, float]] | None = None
    load: Callable | None = None
    lora_drafter: bool = False
    ablation: bool = False
    needs_mode: str | None = None
    reference_of: tuple[str, ...] = ()
    approximates: str | None = None
    description: str = ""
    reference: str = ""
    options: tuple[str, ...] | None = None
    own_eos_rule: bool = False

    def __post_init__(self):
        if self.sweep not in SWEEPS:
            raise ValueError(f"decoder {self.name}: unknown sweep {self.sweep!r}; valid: {', '.join(SWEEPS)}")
        if self.target_forwards not in ("forwards", "both", "extra"):
            raise ValueError(f"decoder {self.name}: target_forwards must be forwards, both or extra")

    def accepted_options(self) -> frozenset[str] | None:
        """The keyword options :func:`get_policy` lets through to ``decode`` (see :attr:`options`), or None when
        they cannot be known (a ``**kwargs`` function without :attr:`options`); ``eos_id`` is :func:`get_policy`'s
        own and never in it."""
        if self.options is not None:
            return frozenset(self.options) - {"eos_id"}
        if _takes_var_keywords(self.decode):
            return None
        return frozenset(_keyword_parameters(self.decode)) - {"eos_id"}

    def check_options(self, options: dict) -> None:
        """Raise :class:`DecodeError` (one line) for an option this decoder does not take, instead of letting it
        be dropped or fail as a ``TypeError``."""
        accepted = self.accepted_options()
        unknown = [] if accepted is None else sorted(set(options) - accepted)
        if unknown:
            raise DecodeError(f"decoder {self.name} has no option {', '.join(unknown)}; its options: "
                              f"{', '.join(sorted(accepted))}")

    @property
    def mode(self) -> str:
        """The model mode this decoder runs: :attr:`needs_mode`, or ``"ar"`` for AR and speculative decoders and
        ``"diffusion"`` for block-diffusion ones."""
        return self.needs_mode or ("diffusion" if self.family == "diffusion" else "ar")

    def runs_by_default_on(self, model) -> bool:
        """Whether a default decoder list (every registered decoder) includes this one for ``model``: a family's
        reference decoder (:attr:`reference_of`) only on that family's models."""
        family = getattr(getattr(model, "family", None), "name", None)
        return not self.reference_of or family in self.reference_of

    def check_model(self, model) -> None:
        """Raise :class:`DecodeError` (one line) when ``model`` lacks the mode this decoder runs (a released
        diffusion LM without an AR mode given an AR or speculative decoder, an AR checkpoint without a mask token
        given a diffusion one)."""
        family = getattr(model, "family", None)
        modes = getattr(model, "modes", None)
        if self.mode == "diffusion" and not getattr(model, "has_mask_token", True):
            raise DecodeError(f"this checkpoint's tokenizer has no mask token, and decoder {self.name} decodes in "
                              "diffusion mode, which needs one: pass --add_mask_token true (a new, untrained row: "
                              "mechanics only) or pick an AR decoder")
        if family is None or modes is None or self.mode in modes:
            return
        raise DecodeError(f"decoder {self.name} needs the {self.mode} mode, which the {family.name} family does not "
                          f"have (its modes: {', '.join(sorted(modes))}); pick a decoder of those modes")

    def forward_cost(self, length: int | None, drafter_ratio: float = 0.0) -> tuple[float, float]:
        """``(w_forward, w_extra)``: :attr:`cost`, or the family default (see the class docstring)."""
        if self.cost is not None:
            return self.cost(length, drafter_ratio)
        if self.family == "ar":
            return 1.0, 0.0
        n = float(length or 1)
        return (n, n) if self.family == "diffusion" else (n + 1, n + 1)


def _takes_var_keywords(fn: Callable) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


def _keyword_parameters(fn: Callable) -> list[str]:
    """Names of ``fn``'s parameters after ``(model, prompts, gen_len)`` that a caller may pass by keyword, less
    those a ``functools.partial`` already binds."""
    bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [p.name for p in params[3:] if p.name not in bound]


#: Registered decoders by name.
DECODERS: dict[str, DecoderSpec] = {}
_loaded = False


def register_decoder(spec: DecoderSpec) -> DecoderSpec:
    """Add ``spec`` to :data:`DECODERS` (a later registration under the same name replaces it)."""
    DECODERS[spec.name] = spec
    return spec


def load_decoders() -> dict[str, DecoderSpec]:
    """Import the ``decoders`` module of every ``workbench`` sub-package that has one (once), so that every
    decoder is registered; returns :data:`DECODERS`."""
    global _loaded
    if not _loaded:
        _loaded = True
        root = __name__.split(".")[0]                     # 'workbench', imported without a static edge
        for info in pkgutil.iter_modules(importlib.import_module(root).__path__):
            if info.ispkg and importlib.util.find_spec(f"{root}.{info.name}.decoders") is not None:
                importlib.import_module(f"{root}.{info.name}.decoders")
    return DECODERS


def get_decoder(name: str) -> DecoderSpec:
    """The :class:`DecoderSpec` of ``name``; raises :class:`DecodeError` listing the valid names."""
    if name not in DECODERS:
        load_decoders()
    if name not in DECODERS:
        raise DecodeError(f"unknown decoding policy {name!r}; valid: {', '.join(sorted(DECODERS))}")
    return DECODERS[name]


def get_policy(name: str) -> Callable[..., DecodeResult]:
    """The decode function of decoder ``name``; raises :class:`DecodeError` listing the valid names.

    The function takes ``(model, prompts, gen_len, **options)`` and refuses, in one line, an option the decoder
    does not take (:meth:`DecoderSpec.check_options`). With ``eos_id=<id>`` a free-running decode (no
    ``real_continuation``) stops each row at that token: a decoder with its reference's own stopping rule
    (:attr:`DecoderSpec.own_eos_rule`) receives ``eos_id`` and applies that rule, forward counts included; the
    others are cut by :func:`~workbench.decoding.base.stop_at_eos`."""
    spec = get_decoder(name)

    def decode(model, prompts, gen_len, eos_id: int | None = None, **kw) -> DecodeResult:
        spec.check_model(model)
        spec.check_options(kw)
        free = kw.get("real_continuation") is None
        if spec.own_eos_rule:
            return spec.decode(model, prompts, gen_len, **kw, **({"eos_id": eos_id} if free and eos_id is not None
                                                                 else {}))
        res = spec.decode(model, prompts, gen_len, **kw)
        if eos_id is None or not free:
            return res
        return stop_at_eos(res, eos_id, kw.get("block_length") if spec.block_commits else None)

    decode.__doc__ = spec.decode.__doc__
    return decode


__all__ = ["DecoderSpec", "DECODERS", "SWEEPS", "register_decoder", "load_decoders", "get_decoder", "get_policy"]
