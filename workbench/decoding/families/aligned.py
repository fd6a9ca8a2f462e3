"""The reference samplers of the block-causal families whose blocks sit at absolute positions: SDAR's
``block_diffusion_generate`` (``low_confidence_dynamic``) and Fast-dLLM v2's ``generate`` (threshold decoding in
sub-blocks). Both references decode one prompt at a time (``x = torch.full((1, total_length), …)``), so these
decoders run the rows of a batch one after another, each exactly as the reference would.

The first decoded block holds the prompt's tail (``P mod S`` clean tokens, held back by the adapter,
:class:`~workbench.model.families.adapters.BlockCausalFamilyLM`) and ``S - P mod S`` masks; every later block is
``S`` masks. The reference generates up to the next block boundary; the first ``gen_len`` tokens are returned.
Greedy only: the argmax is the prediction and its confidence is the softmax probability of that argmax.
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths


def even_schedule(length: int, steps: int) -> list[int]:
    """``length`` tokens over ``steps`` steps, the remainder first (SDAR ``get_num_transfer_tokens``)."""
    return [length // steps + (1 if i < length % steps else 0) for i in range(steps)]


def _family_block(model, block_length: int | None, who: str) -> int:
    s = getattr(model, "block_size", None)
    if not s:
        raise DecodeError(f"the {who} decoder needs a model with a trained block size (a block-causal family)")
    if block_length not in (None, s):
        raise DecodeError(f"the {who} decoder decodes the family's own blocks of {s} tokens (its attention is "
                          f"block-causal at multiples of {s}); got --block_length {block_length}: pass {s}")
    return s


def _row_decode(model, prompt: list[int], gen_len: int, s: int, fill, ar_first: bool):
    """Decode one prompt block by block; ``fill(window, cache, kv, block_start) -> (window, forwards, steps)``
    denoises one window. ``ar_first``: a block after a commit starts with the greedy next token of the commit's
    last logit (Fast-dLLM v2). Returns ``(tokens, forwards, commits, per_step, step_tokens)``."""
    dev, m = model.device, model.mask_token_id
    p = len(prompt)
    ids = torch.tensor([prompt], device=dev)
    kv = torch.ones((1, p), dtype=torch.bool, device=dev)
    cache = model.new_cache()
    last = model.extend(ids, cache, kv, logits_to_keep=1)
    out: list[int] = []
    forwards = commits = 0
    per_step: list[int] = []
    step_tok: list[list[int]] = []
    pos = p
    while len(out) < gen_len:
        offset = pos % s                                   # prompt tail in the first block, 0 afterwards
        window = torch.full((1, s - offset), m, dtype=torch.long, device=dev)
        if ar_first and offset == 0:                       # Fast-dLLM v2: position 0 is the greedy next token
            window[0, 0] = last[0, -1].argmax()
        w_kv = torch.cat([kv, torch.ones_like(window, dtype=torch.bool)], 1)
        window, n_fw, steps = fill(window, cache, w_kv, offset)
        forwards += n_fw
        per_step += [len(t) for t in steps]
        step_tok += steps
        out += window[0].tolist()
        last = model.extend(window, cache, w_kv, logits_to_keep=1)
        commits += 1
        kv, pos = w_kv, pos + window.shape[1]
    return out[:gen_len], forwards, commits, per_step, step_tok


def _batch(model, prompts, gen_len, precision, row) -> DecodeResult:
    t0 = time.perf_counter()
    toks, fws, extra, ps, st = [], [], [], [], []
    with torch.no_grad(), autocast_for(model.device, precision):
        for prompt in prompts:
            t, f, c, a, b = row(prompt)
            toks.append(t), fws.append(f), extra.append(c), ps.append(a), st.append(b)
    return DecodeResult(tokens=toks, forwards=fws, extra_forwards=extra, committed_per_step=ps, step_tokens=st,
                        wall_time=time.perf_counter() - t0, model_calls=sum(fws) + sum(extra))


def _greedy(logits: torch.Tensor, masked: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.float()
    x0 = logits.argmax(-1)
    conf = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
    return x0, torch.where(masked, conf, torch.full_like(conf, float("-inf")))


def sdar_decode(model, prompts: list[list[int]], gen_len: int, block_length: int | None = None,
                steps: int | None = None, threshold: float = 0.85, precision: str = "fp32", **_) -> DecodeResult:
    """SDAR's ``block_diffusion_generate`` with ``remasking_strategy='low_confidence_dynamic'``, greedy.

    Per block of ``S`` (the family's block size): ``k_i`` = the even schedule of ``S`` tokens over ``steps`` steps
    (the prompt's tail counted, as the reference counts ``block_length``). At step ``i`` one denoising forward; if
    at least ``k_i`` masked positions have confidence > ``threshold`` all of them are unmasked, else the ``k_i`` most
    confident (``torch.topk``); when no mask is left, the block is committed.

    Args:
        model: an SDAR adapter (a block size and block-causal commits).
        prompts: prompts (token ids), decoded one at a time.
        gen_len: tokens returned per prompt.
        block_length: must be the family's block size if given.
        steps: denoising steps per block (default ``S``, the reference CLI's).
        threshold: confidence threshold (0.85).
        precision: 'fp32' or 'bf16'.

    Raises :class:`~workbench.decoding.base.DecodeError` for another block length or ``steps`` < 1.

    Not reproduced: with ``steps < S`` a step's ``k_i`` can exceed the masks left, and the reference's ``topk`` over
    the whole block then picks clean positions (the prompt's tail included) and overwrites them with their argmax;
    here only masks are unmasked. With the reference's defaults (``steps = S``) it cannot happen.
    """
    s = _family_block(model, block_length, "sdar")
    check_lengths(model, prompts, gen_len)
    steps = s if steps is None else int(steps)
    if steps < 1:
        raise DecodeError(f"steps must be ≥ 1, got {steps}")
    schedule = even_schedule(s, steps)
    m = model.mask_token_id

    def fill(window, cache, kv, offset):
        n_fw, record = 0, []
        for i in range(steps):
            masked = window == m
            if not masked.any():
                break
            x0, conf = _greedy(model.diffusion_logits(window, cache, kv)[0], masked[0], m)
            n_fw += 1
            k = schedule[i]
            high = conf > threshold
            take = high if int(high.sum()) >= k else torch.zeros_like(high).index_fill_(
                0, torch.topk(conf, min(k, conf.numel())).indices, True)
            take &= masked[0]
            window = window.clone()
            window[0, take] = x0[take]
            record.append(x0[take].tolist())
        return window, n_fw, record

    return _batch(model, prompts, gen_len, precision, lambda p: _row_decode(model, p, gen_len, s, fill, False))


def fast_dllm_v2_decode(model, prompts: list[list[int]], gen_len: int, block_length: int | None = None,
                        sub_block: int = 8, threshold: float = 0.9, precision: str = "fp32", **_) -> DecodeResult:
    """Fast-dLLM v2's ``generate``, greedy: blocks of ``S`` (``bd_size``), each decoded sub-block by sub-block
    (``small_block_size`` positions at block offsets ``[8j, 8j + 8)``). While a sub-block has masks, one forward of
    the whole block; in the sub-block every masked position with probability > ``threshold`` is unmasked, and always
    the most confident one. A block after a commit starts with the greedy token of the commit's last (shifted)
    logit; the first block starts with the prompt's tail (or, after a prompt of whole blocks, with the prefill's
    greedy token).

    Args:
        model: a Fast-dLLM v2 adapter (shifted logits, block-causal commits).
        prompts, gen_len, block_length, precision: as :func:`sdar_decode`.
        sub_block: ``small_block_size`` (8); must divide ``S`` (a block shorter than it is one sub-block).
        threshold: the unmasking threshold (``eval.py``'s 0.9; 1.0 gives one token per forward).

    Raises :class:`~workbench.decoding.base.DecodeError` for another block length or a sub-block that does not
    divide it. The reference skips the prompt when it is exactly one block long (no prefill, only the masks are
    fed); that bug is not reproduced.
    """
    s = _family_block(model, block_length, "fast_dllm_v2")
    check_lengths(model, prompts, gen_len)
    sub_block = min(int(sub_block), s)                    # a block shorter than a sub-block is one sub-block
    if sub_block < 1 or s % sub_block:
        raise DecodeError(f"sub-block {sub_block} does not divide the block size {s}")
    m = model.mask_token_id

    def fill(window, cache, kv, offset):
        n_fw, record = 0, []
        w = window.shape[1]
        for lo in range(0, s, sub_block):
            a, b = max(lo - offset, 0), min(lo + sub_block - offset, w)    # the sub-block's columns in the window
            if b <= 0:
                continue
            while (window[0, a:b] == m).any():
                masked = torch.zeros(w, dtype=torch.bool, device=window.device)
                masked[a:b] = window[0, a:b] == m
                x0, conf = _greedy(model.diffusion_logits(window, cache, kv)[0], masked, m)
                n_fw += 1
                take = (conf > threshold) & masked
                take[int(conf.argmax())] = True
                take &= masked
                window = window.clone()
                window[0, take] = x0[take]
                record.append(x0[take].tolist())
        return window, n_fw, record

    return _batch(model, prompts, gen_len, precision, lambda p: _row_decode(model, p, gen_len, s, fill, True))
