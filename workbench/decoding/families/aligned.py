"""The reference samplers of the block-causal families whose blocks sit at absolute positions:

* SDAR: the evaluation harness's loop, JetAstra/SDAR
  ``evaluation/opencompass/opencompass/models/huggingface_bd3.py: block_diffusion_generate``, at the settings of
  ``evaluation/opencompass/configs/eval_sdar_hf.py`` (``temperature=1.0, top_k=1, remasking='low_confidence'``,
  ``denoising_steps = block_length``, a ``threshold``): greedy, and the ``threshold < 1`` dynamic rule. (SDAR's
  ``generate.py`` has no greedy path: with ``top_k=1`` it scores the filtered distribution, every confidence is 1
  and the whole block unmasks in one step.)
* Fast-dLLM v2: NVlabs/Fast-dLLM ``v2/generation_functions.py: Fast_dLLM_QwenForCausalLM.batch_sample`` (upstream
  8292f3c, read from the fork ydshi0/Fast-dLLM): threshold decoding in sub-blocks, temperature 0.

Both references decode one prompt at a time (SDAR's ``x = torch.full((1, total_length), …)``; Fast-dLLM v2's rows
only meet in batched forwards), so these decoders run the rows of a batch one after another, each as the reference
would.

The first decoded block holds the prompt's tail (``P mod S`` clean tokens, held back by the adapter,
:class:`~workbench.model.families.adapters.BlockCausalFamilyLM`) and ``S - P mod S`` masks; every later block is
``S`` masks. The reference generates up to the next block boundary; the first ``gen_len`` tokens are returned.
Greedy only: the argmax is the prediction and its confidence is the softmax probability of that argmax.

**EOS** (``eos_id``, the references' stop token), and the forwards spent after it:

* SDAR's loop stops after the block that holds a stop token, that block's KV-commit forward included;
* Fast-dLLM v2's row is finished once a denoising step unmasks its stop token (a block's first token, seeded from
  the commit, does not count); the block is still finished, and its KV-commit forward is not run.

Tokens are cut after the first EOS.
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths
from .stopping import cut_at_eos


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


def _row_decode(model, prompt: list[int], gen_len: int, s: int, fill, ar_first: bool, stop: str | None = None,
                eos_id: int | None = None):
    """Decode one prompt block by block; ``fill(window, cache, kv, block_start) -> (window, forwards, steps)``
    denoises one window. ``ar_first``: a block after a commit starts with the greedy next token of the commit's
    last logit (Fast-dLLM v2). ``stop`` with an ``eos_id``: ``'block'`` ends after the committed block holding it
    (SDAR), ``'row'`` after the block in which a denoising step unmasked it, without that block's commit
    (Fast-dLLM v2). Returns ``(tokens, forwards, commits, per_step, step_tokens)``."""
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
        if stop == "row" and eos_id is not None and any(eos_id in t for t in steps):
            break                                          # finished: no KV commit of this block
        last = model.extend(window, cache, w_kv, logits_to_keep=1)
        commits += 1
        kv, pos = w_kv, pos + window.shape[1]
        if stop == "block" and eos_id is not None and eos_id in out:
            break
    return out[:gen_len], forwards, commits, per_step, step_tok


def _batch(model, prompts, gen_len, precision, row, eos_id: int | None = None) -> DecodeResult:
    t0 = time.perf_counter()
    toks, fws, extra, ps, st = [], [], [], [], []
    with torch.no_grad(), autocast_for(model.device, precision):
        for prompt in prompts:
            t, f, c, a, b = row(prompt)
            toks.append(t), fws.append(f), extra.append(c), ps.append(a), st.append(b)
    return cut_at_eos(DecodeResult(tokens=toks, forwards=fws, extra_forwards=extra, committed_per_step=ps,
                                   step_tokens=st, wall_time=time.perf_counter() - t0,
                                   model_calls=sum(fws) + sum(extra)), eos_id)


def _greedy(logits: torch.Tensor, masked: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.float()
    x0 = logits.argmax(-1)
    conf = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
    return x0, torch.where(masked, conf, torch.full_like(conf, float("-inf")))


def sdar_decode(model, prompts: list[list[int]], gen_len: int, block_length: int | None = None,
                steps: int | None = None, threshold: float = 0.85, precision: str = "fp32", pad_id: int = 0,
                real_continuation: list[list[int]] | None = None, eos_id: int | None = None) -> DecodeResult:
    """SDAR's evaluation loop ``huggingface_bd3.py: block_diffusion_generate`` at its evaluation settings
    (``temperature=1.0, top_k=1, remasking='low_confidence'``; see the module docstring).

    Per block of ``S`` (the family's block size): ``k_i`` = the even schedule of ``S`` tokens over ``steps`` steps
    (the prompt's tail counted, as the reference counts ``block_length``). At step ``i`` one denoising forward; the
    prediction is the argmax and its confidence the softmax probability of it (``sample_with_temperature_topk_topp``
    with ``top_k=1``: the draw from the one-hot filtered distribution is the argmax, the confidence comes from the
    unfiltered softmax). With ``threshold < 1``: if at least ``k_i`` masked positions have confidence > ``threshold``
    all of them are unmasked, else the ``k_i`` most confident (``torch.topk``); with ``threshold = 1``, the ``k_i``
    most confident. A position that is not masked keeps its token (the reference's ``where(mask_index, x0,
    cur_x)``). When no mask is left, the block is committed.

    Args:
        model: an SDAR adapter (a block size and block-causal commits).
        prompts: prompts (token ids), decoded one at a time.
        gen_len: tokens returned per prompt.
        block_length: must be the family's block size if given.
        steps: denoising steps per block (default ``S``, the evaluation config's); must divide ``S``, as the
            reference asserts.
        threshold: confidence threshold (0.85).
        precision: 'fp32' or 'bf16'.
        pad_id: unused (rows are decoded one at a time, unpadded).
        real_continuation: must be None (the reference has no real-context mode).
        eos_id: the stop token: decoding ends after the block holding it (module docstring).

    Raises :class:`~workbench.decoding.base.DecodeError` for another block length, ``steps`` that does not divide
    ``S`` or a real continuation.
    """
    s = _family_block(model, block_length, "sdar")
    check_lengths(model, prompts, gen_len)
    steps = s if steps is None else int(steps)
    if steps < 1 or s % steps:
        raise DecodeError(f"steps must divide the block size {s} (SDAR's block_diffusion_generate asserts it), "
                          f"got {steps}")
    _no_real("sdar", real_continuation)
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

    return _batch(model, prompts, gen_len, precision,
                  lambda p: _row_decode(model, p, gen_len, s, fill, False, "block", eos_id), eos_id)


def _no_real(who: str, real_continuation) -> None:
    if real_continuation is not None:
        raise DecodeError(f"the {who} decoder has no real-context mode (its reference follows its own output)")


def fast_dllm_v2_decode(model, prompts: list[list[int]], gen_len: int, block_length: int | None = None,
                        sub_block: int = 8, threshold: float = 0.9, precision: str = "fp32", pad_id: int = 0,
                        real_continuation: list[list[int]] | None = None, eos_id: int | None = None) -> DecodeResult:
    """Fast-dLLM v2's ``batch_sample``, greedy: blocks of ``S`` (``bd_size``), each decoded sub-block by sub-block
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
        pad_id: unused (rows are decoded one at a time, unpadded).
        real_continuation: must be None (the reference has no real-context mode).
        eos_id: the stop token (``stop_token``): the row finishes with the block in which a step unmasks it
            (module docstring).

    Raises :class:`~workbench.decoding.base.DecodeError` for another block length, a sub-block that does not
    divide it or a real continuation. Not reproduced: the reference skips the prompt when it is exactly one block
    long (no prefill, only the masks are fed), and it generates ``max_new_tokens // S + P // S`` blocks in all, up
    to ``S`` tokens fewer than asked for; here the prompt is read and ``gen_len`` tokens are returned.
    """
    s = _family_block(model, block_length, "fast_dllm_v2")
    check_lengths(model, prompts, gen_len)
    _no_real("fast_dllm_v2", real_continuation)
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

    return _batch(model, prompts, gen_len, precision,
                  lambda p: _row_decode(model, p, gen_len, s, fill, True, "row", eos_id), eos_id)
