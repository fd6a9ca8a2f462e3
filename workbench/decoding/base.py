"""Shared pieces of every decoding policy: the result record, batching of prompts, commit rules."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from ..model.fingerprint import SOURCE_FINGERPRINT_ATTR, model_fingerprint


class DecodeError(ValueError):
    """Raised for invalid decoding arguments (block length, threshold, lengths)."""


@dataclass
class DecodeResult:
    """What every decode returns, one entry per prompt (row).

    Attributes:
        tokens: generated ids per row, ``gen_len`` each.
        forwards: denoising / AR forwards per row (the papers' NFE; prefill not counted).
        extra_forwards: forwards that commit nothing by themselves per row (the per-block KV-commit
            forward of block diffusion; the verify forward of self-speculation). ``tpf_real`` counts them.
        committed_per_step: per row, the number of tokens committed at each forward.
        step_tokens: per row, the token ids committed at each forward (for the whitespace analysis).
        wall_time: seconds for the whole batch (all rows decoded in lockstep).
        model_calls: batched model forwards actually run (prefill excluded; KV-commit forwards included).
        sampler_seconds, sampler_calls: time in and calls of a learned sampler (sampler policy only).
        token_probs: per row, for each generated token, the probability the decoder's distribution gave it
            where the decoder drew or picked it (``q_k(x_k)`` of I-DLM §2; one float32 per token, never whole
            distributions); empty when the decoder does not record it.
        drafter_forwards: per row, forwards of a separate drafter model counted in neither ``forwards`` nor
            ``extra_forwards`` (SimSD's); empty when there are none. ``tpf_real`` counts them.
    """

    tokens: list[list[int]]
    forwards: list[int]
    extra_forwards: list[int]
    committed_per_step: list[list[int]] = field(default_factory=list)
    step_tokens: list[list[list[int]]] = field(default_factory=list)
    wall_time: float = 0.0
    model_calls: int = 0
    sampler_seconds: float = 0.0
    sampler_calls: int = 0
    token_probs: list[list[float]] = field(default_factory=list)
    drafter_forwards: list[int] = field(default_factory=list)

    @classmethod
    def concat(cls, parts: "list[DecodeResult]") -> "DecodeResult":
        """One result of the rows of ``parts`` (batches decoded one after another), in order: per-row lists joined,
        times and call counts summed; rows of a part without ``token_probs`` get empty ones, and without
        ``drafter_forwards`` zeros."""
        out = cls(tokens=[], forwards=[], extra_forwards=[], committed_per_step=[], step_tokens=[])
        for r in parts:
            out.tokens += r.tokens
            out.forwards += r.forwards
            out.extra_forwards += r.extra_forwards
            out.committed_per_step += r.committed_per_step
            out.step_tokens += r.step_tokens
            out.wall_time += r.wall_time
            out.model_calls += r.model_calls
            out.sampler_seconds += r.sampler_seconds
            out.sampler_calls += r.sampler_calls
            out.token_probs += r.token_probs if r.token_probs else [[] for _ in r.tokens]
            out.drafter_forwards += r.drafter_forwards if r.drafter_forwards else [0] * len(r.tokens)
        return out

    def drafter_forwards_of(self, row: int) -> int:
        """Separate-drafter forwards of ``row`` (0 when the decoder has none)."""
        return self.drafter_forwards[row] if self.drafter_forwards else 0

    def tpf(self, row: int) -> float:
        """Tokens per (denoising) forward of ``row``."""
        return len(self.tokens[row]) / max(1, self.forwards[row])

    def tpf_real(self, row: int) -> float:
        """Tokens per forward of ``row`` counting the KV-commit / verify forwards and any separate drafter's too."""
        return len(self.tokens[row]) / max(1, self.forwards[row] + self.extra_forwards[row]
                                           + self.drafter_forwards_of(row))


def stop_at_eos(res: DecodeResult, eos_id: int | Collection[int], block_length: int | None = None) -> DecodeResult:
    """Cut every row of ``res`` after its first ``eos_id`` (kept; with several ids, the first of any), as
    ``generate`` stops, and recount the row's forwards to those that committed tokens up to it (a separate drafter's
    forwards in proportion to the blocks or cycles kept).

    Decoders run rows in lockstep, so a row that emitted EOS was carried along; its later commits are
    dropped here. Tokens are final in order of position for AR and speculative decoders
    (``block_length=None``): the forwards kept are those until the EOS position is committed. A block-diffusion
    decoder (``block_length`` = B) finishes the whole block holding EOS before it is final, so its forwards
    are kept up to the end of that block, with one KV-commit forward per kept block. Returns a new result.
    """
    out = DecodeResult(tokens=[], forwards=[], extra_forwards=[], committed_per_step=[], step_tokens=[],
                       wall_time=res.wall_time, model_calls=res.model_calls, sampler_seconds=res.sampler_seconds,
                       sampler_calls=res.sampler_calls)
    stops = {int(eos_id)} if isinstance(eos_id, int) else {int(i) for i in eos_id}
    for r, toks in enumerate(res.tokens):
        per_step = res.committed_per_step[r] if res.committed_per_step else []
        steps = res.step_tokens[r] if res.step_tokens else []
        first = next((i for i, t in enumerate(toks) if t in stops), None)
        if first is None or not per_step:
            out.tokens.append(list(toks))
            out.forwards.append(res.forwards[r])
            out.extra_forwards.append(res.extra_forwards[r])
            out.committed_per_step.append(list(per_step))
            out.step_tokens.append(list(steps))
            if res.drafter_forwards:
                out.drafter_forwards.append(res.drafter_forwards[r])
            continue
        end = first + 1                                    # tokens kept
        need = end if block_length is None else -(-end // block_length) * block_length
        total, kept = 0, 0
        while kept < len(per_step) and total < need:
            total += per_step[kept]
            kept += 1
        fw, ex = res.forwards[r], res.extra_forwards[r]
        if block_length is not None:
            extra = min(ex, need // block_length)
        elif ex >= fw:                                     # one verify forward per draft forward (+ any others)
            extra = kept + (ex - fw)
        else:
            extra = min(ex, kept)
        out.tokens.append(list(toks[:end]))
        out.forwards.append(min(fw, kept))
        out.extra_forwards.append(extra)
        out.committed_per_step.append(list(per_step[:kept]))
        out.step_tokens.append(list(steps[:kept]))
        if res.drafter_forwards:                           # a drafter drafts every block (cycle) alike: keep its
            units = -(-len(toks) // block_length) if block_length is not None else len(per_step)   # kept share
            kept_units = need // block_length if block_length is not None else kept
            out.drafter_forwards.append(res.drafter_forwards[r] * kept_units // max(1, units))
    if res.token_probs:
        out.token_probs = [list(q[:len(t)]) for q, t in zip(res.token_probs, out.tokens)]
    return out


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts to one length. Returns ``ids`` ``(N, P)`` and ``valid`` ``(N, P)`` bool."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DecodeError("every prompt needs at least one token")
    p_len = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), p_len), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompts), p_len), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, p_len - len(p):] = torch.tensor(p, dtype=torch.long)
        valid[i, p_len - len(p):] = True
    return ids.to(device), valid.to(device)


def check_lengths(model, prompts: list[list[int]], gen_len: int, block_length: int | None = None) -> None:
    """Validate lengths against the model context. Raises :class:`DecodeError` with a one-line reason."""
    ctx = int(getattr(model.backbone.config, "max_position_embeddings", 1 << 30))
    if gen_len <= 0:
        raise DecodeError(f"generation length must be positive, got {gen_len}")
    if block_length is not None:
        if block_length <= 0:
            raise DecodeError(f"block length must be positive, got {block_length}")
        if block_length > ctx:
            raise DecodeError(f"block length {block_length} is larger than the model context ({ctx} tokens)")
        if gen_len % block_length:
            raise DecodeError(f"block length {block_length} does not divide the generation length {gen_len}")
    longest = max(len(p) for p in prompts) + gen_len
    if longest > ctx:
        raise DecodeError(f"prompt + generation = {longest} tokens exceeds the model context ({ctx}); "
                          "shorten the prompt or the generation")


def check_threshold(threshold: float) -> float:
    """Confidence thresholds live in (0, 1]. Raises :class:`DecodeError` otherwise."""
    if not (0.0 < float(threshold) <= 1.0):
        raise DecodeError(f"threshold must be in (0, 1], got {threshold}")
    return float(threshold)


#: Decoding precisions, named as Lightning names them: 'fp32'; 'bf16' (bf16-mixed: fp32 weights, bf16 autocast);
#: 'bf16-true' (weights stored in bf16, see :func:`cast_for_precision`, and the same autocast).
PRECISIONS = ("fp32", "bf16", "bf16-true")
#: What a command's ``--precision`` option takes: :data:`PRECISIONS` or 'auto' (:func:`resolve_precision`).
PRECISION_OPTIONS = ("auto", *PRECISIONS)
#: Environment variable that overrides the CPU's native-bf16 check (``1`` / ``0``): to reproduce the behaviour of
#: a machine of the other kind (the test suite runs both), never to make bf16 fast.
NATIVE_BF16_ENV = "WORKBENCH_NATIVE_BF16"


def check_precision(precision: str, allow_auto: bool = False) -> str:
    """Return ``precision``; raises :class:`DecodeError` listing the valid names otherwise (with ``allow_auto``,
    'auto' is valid too: a command's option, resolved by :func:`resolve_precision` once the device is known)."""
    valid = PRECISION_OPTIONS if allow_auto else PRECISIONS
    if precision not in valid:
        raise DecodeError(f"unknown precision {precision!r}; valid: {', '.join(valid)}")
    return precision


def native_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` multiplies bf16 matrices natively. A CPU without AVX-512 BF16 or AMX (oneDNN's check)
    emulates them: on a 2-core AMD EPYC with AVX2 only, a ``(512, 576) × (576, 1536)`` product took 120 ms in bf16
    against 18 ms in fp32, so bf16 there is slower, not faster. On a CPU, :data:`NATIVE_BF16_ENV` (``0`` or ``1``)
    overrides the check."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        forced = os.environ.get(NATIVE_BF16_ENV, "").strip()
        if forced in ("0", "1"):
            return forced == "1"
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return True


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``'auto'`` → ``'bf16'`` (autocast) where :func:`native_bf16`, else ``'fp32'`` (the precision guide: a CPU
    that emulates bf16 runs it several times slower than fp32); any other name is returned after
    :func:`check_precision`, unchanged and without a notice: the user chose it. Raises :class:`DecodeError` for an
    unknown name."""
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return check_precision(precision)


def autocast_for(device: torch.device, precision: str):
    """``torch.autocast`` context for ``precision`` on ``device``: bf16 autocast for 'bf16' and 'bf16-true'
    (on bf16 weights it casts nothing, and it keeps mixed-dtype helpers such as an fp32 sampler working), none
    for 'fp32'. Raises :class:`DecodeError` for an unknown precision."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def cast_for_precision(model, precision: str):
    """Store ``model``'s weights (a :class:`~workbench.model.trimode.TriModeLM`, adapter included) in bf16, in
    place, for 'bf16-true'; other precisions leave it as it is. Returns ``model``.

    Why both bf16 modes exist: decoding a 135 M model on a CPU is memory-bound, and 'bf16' autocast re-casts
    every fp32 weight at every forward, so a one-token step of SmolLM2-135M on 2 cores takes 50 ms in 'bf16'
    against 23 ms in 'bf16-true' (and 42 ms in fp32; ``benchmarks/bench_gated_inference.py``). Wall-clock
    comparisons should use 'bf16-true'.
    Buffers (RoPE's ``inv_freq``) stay fp32, and the model keeps the fingerprint of its loaded weights
    (:func:`~workbench.model.fingerprint.model_fingerprint`). Raises :class:`DecodeError` for an unknown precision."""
    if check_precision(precision) == "bf16-true":
        if getattr(model, SOURCE_FINGERPRINT_ATTR, None) is None:      # stores and samplers name these weights
            setattr(model, SOURCE_FINGERPRINT_ATTR, model_fingerprint(model))
        with torch.no_grad():
            for p in model.parameters():                   # parameters only: RoPE's inv_freq buffer stays fp32
                if p.is_floating_point():
                    p.data = p.data.to(torch.bfloat16)
    return model
