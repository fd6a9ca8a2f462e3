"""AR decoding (NLD §3.1): greedy or sampled next-token generation with a KV cache."""
from __future__ import annotations

import time
from collections.abc import Collection

import torch

from .base import DecodeResult, autocast_for, check_lengths, left_pad
from .sampling import NO_TOP_K, NO_TOP_P, check_sampling, sampling_probs


@torch.no_grad()
def ar_decode(model, prompts: list[list[int]], gen_len: int, temperature: float = 0.0, use_cache: bool = True,
              real_continuation: list[list[int]] | None = None, block_length: int | None = None,
              pad_id: int = 0, precision: str = "fp32", seed: int = 0, top_k: int = NO_TOP_K,
              top_p: float = NO_TOP_P, stop_ids: Collection[int] | None = None) -> DecodeResult:
    """Generate ``gen_len`` tokens per prompt, one token per forward.

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM`.
        prompts: N prompts of token ids (any lengths; left-padded internally).
        gen_len: tokens to generate per prompt.
        temperature: 0 → greedy (argmax); > 0 → sample from ``softmax(logits / temperature)``, filtered by
            ``top_k`` / ``top_p`` (:func:`~workbench.decoding.sampling.sampling_probs`).
        use_cache: False recomputes the full sequence every step (reference for the cache test).
        real_continuation: real-context mode: after every ``block_length`` generated tokens the context
            is reset to the *real* continuation (the generated block is discarded from the context),
            so degenerate output cannot feed itself. ``None`` → free-running.
        block_length: block size of the real-context mode (``None``: one segment of ``gen_len``, as in ``ar_nll``).
        pad_id: id used for left padding (never attended to).
        precision: 'fp32' or 'bf16' (autocast).
        seed: sampling seed.
        top_k: sample among the ``top_k`` most likely tokens only (0 = all; ignored at temperature 0).
        top_p: sample from the nucleus of probability ``top_p`` only (1 = all; ignored at temperature 0).
        stop_ids: free-running only: stop once every row has produced one of these ids (a task's end-of-turn
            tokens), as ``generate`` stops a batch; every row then holds one, and
            :func:`~workbench.decoding.base.stop_at_eos` cuts each at its own. ``None``: always ``gen_len`` tokens.

    Returns a :class:`DecodeResult` (``forwards`` = tokens per row: ``gen_len``, or fewer when ``stop_ids`` ended the
    batch; no extra forwards). Raises :class:`DecodeError` for lengths that do not fit the model or an out-of-range
    sampling option.
    """
    check_sampling(temperature, top_k, top_p)
    check_lengths(model, prompts, gen_len, block_length if real_continuation is not None else None)
    dev = model.device
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids, valid = left_pad(prompts, pad_id, dev)
    n = ids.shape[0]
    real = torch.tensor(real_continuation, dtype=torch.long, device=dev) if real_continuation is not None else None
    seg = (block_length or gen_len) if real is not None else gen_len
    out = torch.zeros((n, gen_len), dtype=torch.long, device=dev)
    qs = torch.zeros((n, gen_len), dtype=torch.float32, device=dev)     # q_k(x_k) of every token (I-DLM §2)
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=dev) if stop_ids and real is None else None
    ended = torch.zeros(n, dtype=torch.bool, device=dev)
    steps = gen_len
    t0 = time.perf_counter()

    def pick(logits: torch.Tensor, j: int | None = None) -> torch.Tensor:
        probs = sampling_probs(logits, temperature, top_k, top_p)
        if temperature <= 0:
            tok = logits.argmax(-1)
        else:
            tok = torch.multinomial(probs.cpu(), 1, generator=g).squeeze(-1).to(dev)
        if j is not None:
            qs[:, j] = probs.gather(-1, tok[:, None]).squeeze(-1)
        return tok

    with autocast_for(dev, precision):
        if use_cache:
            cache = model.new_cache()
            logits = model.extend(ids, cache, valid, logits_to_keep=1)[:, -1]
            ctx_valid = valid
            for start in range(0, gen_len, seg):
                for j in range(start, start + seg):
                    tok = pick(logits, j)
                    out[:, j] = tok
                    if stops is not None:
                        ended |= torch.isin(tok, stops)
                        if bool(ended.all()):
                            steps = j + 1
                            break
                    kv = torch.cat([ctx_valid, torch.ones((n, 1), dtype=torch.bool, device=dev)], 1)
                    if j + 1 < start + seg:
                        logits = model.extend(tok[:, None], cache, kv, logits_to_keep=1)[:, -1]
                        ctx_valid = kv
                    elif real is not None and j + 1 < gen_len:
                        # real-context reset: drop the generated segment (all but its last token is
                        # cached), then append the real segment
                        if seg > 1:
                            cache.crop(-(seg - 1))
                            ctx_valid = ctx_valid[:, : ctx_valid.shape[1] - (seg - 1)]
                        kv = torch.cat([ctx_valid, torch.ones((n, seg), dtype=torch.bool, device=dev)], 1)
                        logits = model.extend(real[:, start:start + seg], cache, kv, logits_to_keep=1)[:, -1]
                        ctx_valid = kv
                    elif j + 1 < gen_len:
                        logits = model.extend(tok[:, None], cache, kv, logits_to_keep=1)[:, -1]
                        ctx_valid = kv
                if steps < gen_len:
                    break
        else:
            for start in range(0, gen_len, seg):
                base = real[:, :start] if real is not None else out[:, :start]
                for j in range(start, start + seg):
                    seq = torch.cat([ids, base, out[:, start:j]], 1)
                    v = torch.cat([valid, torch.ones((n, seq.shape[1] - ids.shape[1]), dtype=torch.bool, device=dev)], 1)
                    cache = model.new_cache()
                    out[:, j] = pick(model.extend(seq, cache, v)[:, -1], j)
                    if stops is not None:
                        ended |= torch.isin(out[:, j], stops)
                        if bool(ended.all()):
                            steps = j + 1
                            break
                if steps < gen_len:
                    break
    wall = time.perf_counter() - t0
    toks = out[:, :steps].tolist()
    return DecodeResult(tokens=toks, forwards=[steps] * n, extra_forwards=[0] * n,
                        committed_per_step=[[1] * steps for _ in range(n)],
                        step_tokens=[[[t] for t in row] for row in toks], wall_time=wall,
                        token_probs=qs[:, :steps].tolist(),
                        model_calls=steps - 1 if use_cache else steps)   # the cached prefill made token 1
