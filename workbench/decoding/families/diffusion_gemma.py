"""DiffusionGemma's own sampler, re-implemented on the workbench adapter: entropy-bound acceptance with re-noising,
a linear temperature schedule, self-conditioning and the stable-and-confident stopping rule, canvas after canvas.

Source: transformers 5.24, ``models/diffusion_gemma/generation_diffusion_gemma.py``
(``DiffusionGemmaGenerationMixin.generate``, ``_denoising_step``, ``_finalize_canvas``, ``EntropyBoundSampler``,
``LinearTemperatureScheduleLogitsProcessor``, ``StableAndConfidentStoppingCriteria``). :func:`entropy_bound_decode`
is token-for-token equal to ``generate`` with the same seed (tests/test_family_diffusion_gemma.py); it calls
the adapter's :meth:`~workbench.model.families.diffusion_gemma.DiffusionGemmaLM.extend` and
:meth:`~workbench.model.families.diffusion_gemma.DiffusionGemmaLM.canvas_logits`, never ``generate``.

Unlike the workbench's mask-based decoders the sampler is **non-absorbing**: a position accepted at one step is
accepted again, or re-noised, at the next (the accepted set is recomputed every step from the new logits), and the
canvas that is kept is the *argmax* of the last step's logits, not the accepted tokens.
"""
from __future__ import annotations

import math
import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, left_pad

#: ``generate``'s global defaults (``DiffusionGemmaGenerationConfig._get_default_generation_params``), used for a
#: setting that neither the call nor the checkpoint's ``generation_config`` sets.
GENERATE_DEFAULTS = dict(max_denoising_steps=48, entropy_bound=0.1, t_min=0.4, t_max=0.8, stability_threshold=1,
                         confidence_threshold=0.005, eos_token_id=None, pad_token_id=None)


def resolve_settings(model, **given) -> dict:
    """The sampler's settings, resolved as ``generate`` resolves them: a value given here (not ``None``) wins over
    the checkpoint's ``generation_config``, which wins over :data:`GENERATE_DEFAULTS`. ``entropy_bound`` comes from
    the generation config's ``sampler_config.entropy_bound``. Raises :class:`DecodeError` for a value that
    ``DiffusionGemmaGenerationConfig.validate`` would reject."""
    gc = getattr(model.backbone, "generation_config", None)
    out = {}
    for key, default in GENERATE_DEFAULTS.items():
        value = given.get(key)
        if value is None and gc is not None:
            value = (getattr(getattr(gc, "sampler_config", None), "entropy_bound", None) if key == "entropy_bound"
                     else getattr(gc, key, None))
        out[key] = default if value is None else value
    steps = out["max_denoising_steps"]
    if not isinstance(steps, int) or steps <= 0:
        raise DecodeError(f"max_denoising_steps must be a positive integer, got {steps}")
    if not float(out["entropy_bound"]) > 0:
        raise DecodeError(f"entropy_bound must be > 0, got {out['entropy_bound']}")
    if out["t_min"] < 0 or out["t_max"] <= out["t_min"]:
        raise DecodeError(f"the temperatures need 0 <= t_min < t_max, got t_min={out['t_min']}, t_max={out['t_max']}")
    if not isinstance(out["stability_threshold"], int) or out["stability_threshold"] < 0:
        raise DecodeError(f"stability_threshold must be an integer >= 0, got {out['stability_threshold']}")
    if not out["confidence_threshold"] > 0:
        raise DecodeError(f"confidence_threshold must be > 0, got {out['confidence_threshold']}")
    eos = out["eos_token_id"]
    out["eos_token_id"] = None if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    return out


def entropy_accept(logits: torch.Tensor, entropy_bound: float) -> torch.Tensor:
    """``EntropyBoundSampler.accept_canvas``'s selection: per row, the k lowest-entropy positions such that
    ``Σ_{i≤k} H_i − max_{i≤k} H_i ≤ entropy_bound`` (an upper bound on their mutual information, arXiv 2505.24857).

    Args: logits ``(N, C, V)`` after the temperature. Returns ``(N, C)`` bool; at least one True per row (the
    lowest-entropy position always passes, its left side being 0). Entropy in nats
    (``torch.distributions.Categorical``, as in the reference, so ties and rounding agree)."""
    entropy = torch.distributions.Categorical(logits=logits).entropy()             # (N, C)
    sorted_h, order = torch.sort(entropy, dim=-1, descending=False)
    keep_sorted = torch.cumsum(sorted_h, dim=-1) - sorted_h <= entropy_bound       # sorted_h = running max
    return torch.scatter(input=torch.zeros_like(keep_sorted), dim=-1, index=order, src=keep_sorted)


@torch.no_grad()
def entropy_bound_decode(model, prompts: list[list[int]], gen_len: int, seed: int = 0,
                         max_denoising_steps: int | None = None, *, entropy_bound: float | None = None,
                         t_min: float | None = None, t_max: float | None = None,
                         stability_threshold: int | None = None, confidence_threshold: float | None = None,
                         eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None,
                         pad_id: int = 0, precision: str = "fp32") -> DecodeResult:
    """Decode ``gen_len`` tokens per prompt with DiffusionGemma's sampler, canvas by canvas.

    Per canvas of ``C = model.canvas_length`` positions (``ceil(gen_len / C)`` canvases, as ``generate`` with
    ``max_new_tokens=gen_len``):

    1. the encoder commits the new clean tokens to the cache (the prompt; then the previous canvas);
    2. the canvas starts as ``C`` tokens drawn uniformly from the vocabulary;
    3. for ``s = S, S-1, …, 1`` (``S = max_denoising_steps``; ``s`` counts the steps *remaining*): decoder logits
       of the canvas with the previous step's (tempered) logits as self-conditioning; divide by the temperature
       ``t_min + (t_max − t_min)·s/S``; sample every position from the softmax (``multinomial``); accept the
       sampled tokens at the positions :func:`entropy_accept` picks; re-noise every other position with a fresh
       uniform token; the argmax of the tempered logits is the row's current answer. A row stops when its argmax
       canvas equals the one of the previous ``stability_threshold`` steps and the mean per-position entropy
       of the tempered logits is below ``confidence_threshold`` (nats); a stopped row is frozen (canvas, argmax
       and self-conditioning logits) while the others go on; the canvas ends when every row stopped or after
       ``S`` steps;
    4. the **argmax** canvas is appended. A row with an EOS in it is finished: with a ``pad_token_id``, tokens
       after its first EOS become pad, and every canvas of a finished row after that is all pad (the row is
       still decoded with the batch); decoding ends early once every row is finished.

    RNG: one ``torch.Generator`` on the model's device seeded with ``seed``, drawn from in ``generate``'s order and
    shapes: per canvas ``randint (N, C)`` (initial canvas), then per step ``multinomial`` of ``N·C`` rows and
    ``randint (N, C)`` (re-noise), for the whole batch every step (stopped rows too). The result equals
    ``torch.manual_seed(seed); backbone.generate(ids, attention_mask=valid, max_new_tokens=gen_len, ...)`` token
    for token; the global RNG is not touched. A different batch composition gives different draws.

    Args:
        model: a :class:`~workbench.model.families.diffusion_gemma.DiffusionGemmaLM`.
        prompts: N prompts of token ids (any lengths; left-padded, the padding masked as ``generate`` masks an
            ``attention_mask``, position ids counting the padding as ``generate`` does).
        gen_len: tokens per row (``max_new_tokens``).
        seed: RNG seed (above).
        max_denoising_steps: ``generate``'s settings, with ``entropy_bound``, ``t_min``, ``t_max``,
            ``stability_threshold``, ``confidence_threshold``, ``eos_token_id`` and ``pad_token_id``: ``None``
            takes the checkpoint's generation config, else ``generate``'s defaults: 48 steps, entropy bound 0.1
            nats, temperature 0.8 → 0.4, stability 1 step, confidence 0.005 nats, no EOS, no pad
            (:func:`resolve_settings`).
        pad_id: id written at left padding (masked; any id).
        precision: 'fp32' (what ``generate`` runs, the only one equal to it), 'bf16' or 'bf16-true' (autocast).

    Returns a :class:`DecodeResult`:

    * ``tokens``: ``gen_len`` per row: ``generate``'s new tokens (``ceil(gen_len / C)·C`` of them) cut to
      ``gen_len``; when every row finished early the missing tail is ``pad_token_id`` (the first EOS id if
      there is no pad id), where ``generate`` returns a shorter sequence;
    * ``forwards``: decoder forwards per row, counted as ``generate``'s ``tokens_per_forward`` counts them: only
      steps where the row had neither stopped denoising nor finished at an EOS;
    * ``extra_forwards``: encoder commits of finished canvases per row (the prompt's prefill is not counted,
      nor commits after the row finished; the last canvas is never committed);
    * ``committed_per_step`` / ``step_tokens``: per counted step, the size of the accepted set and its sampled
      tokens in canvas order. **Non-absorbing**: a position may be accepted at many steps and re-noised between
      them, so these counts sum to more than ``C`` per canvas and
      :func:`~workbench.decoding.base.stop_at_eos`'s recount by commits does not apply;
    * ``wall_time``; ``model_calls``: batched decoder forwards plus encoder commits (prefill excluded).

    Raises :class:`DecodeError` for an empty prompt, an id outside the vocabulary, a length beyond the model's
    positions, or a setting ``generate`` would reject.
    """
    cfg = resolve_settings(model, max_denoising_steps=max_denoising_steps, entropy_bound=entropy_bound, t_min=t_min,
                           t_max=t_max, stability_threshold=stability_threshold,
                           confidence_threshold=confidence_threshold, eos_token_id=eos_token_id,
                           pad_token_id=pad_token_id)
    steps, bound = cfg["max_denoising_steps"], float(cfg["entropy_bound"])
    lo, hi = cfg["t_min"], cfg["t_max"]
    stab, conf = cfg["stability_threshold"], cfg["confidence_threshold"]
    eos_ids, pad = cfg["eos_token_id"], cfg["pad_token_id"]
    if gen_len <= 0:
        raise DecodeError(f"generation length must be positive, got {gen_len}")
    dev = model.device
    ids, valid = left_pad(prompts, pad_id, dev)
    n, p = ids.shape
    v, c = model.vocab_size, model.canvas_length
    if int(ids.min()) < 0 or int(ids.max()) >= v:
        raise DecodeError(f"prompt ids must lie in [0, {v}), the model vocabulary")
    n_canvas = math.ceil(gen_len / c)
    ctx = int(model.backbone.config.get_text_config().max_position_embeddings)
    if p + n_canvas * c > ctx:
        raise DecodeError(f"prompt + {n_canvas} canvases of {c} = {p + n_canvas * c} tokens exceeds the model's "
                          f"{ctx} positions; shorten the prompt or the generation")
    gen = torch.Generator(device=dev).manual_seed(seed)
    eos = torch.tensor(eos_ids, device=dev) if eos_ids is not None else None
    emb_dtype = model.backbone.model.decoder.embed_tokens.weight.dtype
    finished_seq = torch.zeros(n, dtype=torch.bool, device=dev)
    forwards = torch.zeros(n, dtype=torch.long, device=dev)
    extra = torch.zeros(n, dtype=torch.long, device=dev)
    per_step: list[list[int]] = [[] for _ in range(n)]
    step_tok: list[list[list[int]]] = [[] for _ in range(n)]
    canvases: list[torch.Tensor] = []
    ones = torch.ones((n, c), dtype=torch.bool, device=dev)
    calls = 0
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        cache = model.new_cache()
        new_ids, key_valid = ids, valid
        for k in range(n_canvas):
            # 1. encoder commit (the prompt at k = 0: prefill, not counted)
            model.extend(new_ids, cache, key_valid, logits_to_keep=1)            # logits unread
            if k > 0:
                calls += 1
                extra += (~finished_seq).long()
            kv = torch.cat([key_valid, ones], dim=1)                              # (N, P_k + C)
            # 2. uniform initial canvas
            canvas = torch.randint(0, v, (n, c), device=dev, generator=gen)
            argmax_canvas = canvas
            sc_logits = None
            stopped = torch.zeros(n, dtype=torch.bool, device=dev)
            history = None                                                        # (stab, N, C) argmax canvases
            # 3. denoising steps, s = S … 1 (steps remaining)
            for s in range(steps, 0, -1):
                active = ~(stopped | finished_seq)
                forwards += active.long()
                raw = model.canvas_logits(canvas, cache, kv, sc_logits)          # (N, C, V) fp32
                calls += 1
                step_t = torch.tensor(s, device=dev, dtype=torch.int32)
                logits = raw / (lo + ((hi - lo) * (step_t / steps)))              # linear temperature schedule
                probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
                sampled = torch.multinomial(probs.view(-1, v), num_samples=1, generator=gen).squeeze(-1).view(n, c)
                new_argmax = torch.argmax(logits, dim=-1)
                accepted = entropy_accept(logits, bound)                          # (N, C) bool
                noise = torch.randint(0, v, (n, c), device=dev, generator=gen)
                new_canvas = torch.where(accepted, sampled, noise)                # accept, re-noise the rest
                counts = accepted.sum(dim=1).tolist()
                act = active.tolist()
                for r in range(n):
                    if act[r]:
                        per_step[r].append(int(counts[r]))
                        step_tok[r].append(sampled[r][accepted[r]].tolist())
                if stopped.any():                                                 # stopped rows stay frozen
                    new_argmax = torch.where(stopped[:, None], argmax_canvas, new_argmax)
                    new_canvas = torch.where(stopped[:, None], canvas, new_canvas)
                    logits = torch.where(stopped[:, None, None], sc_logits, logits)
                # stable (argmax unchanged for `stab` steps) and confident (mean entropy < conf)
                if stab == 0:
                    stable = torch.ones(n, dtype=torch.bool, device=dev)
                else:
                    if history is None:
                        history = torch.full((stab, n, c), -1, dtype=new_argmax.dtype, device=dev)
                    stable = (history == new_argmax[None]).all(dim=-1).all(dim=0)
                    history = torch.roll(history, shifts=-1, dims=0)
                    history[-1] = new_argmax
                entropy = torch.distributions.Categorical(logits=logits).entropy()
                stopped |= stable & (entropy.mean(dim=-1) < conf)
                sc_logits = logits.to(emb_dtype)                                  # self-conditioning of the next step
                canvas, argmax_canvas = new_canvas, new_argmax
                if bool(stopped.all()):
                    break
            # 4. append the argmax canvas; EOS → finished, pad after it
            block = argmax_canvas.clone()
            finished_now = torch.isin(block, eos).any(dim=-1) if eos is not None \
                else torch.zeros(n, dtype=torch.bool, device=dev)
            before = finished_seq
            finished_seq = before | finished_now
            if pad is not None and bool(finished_seq.any()):
                block[before] = pad
                if eos is not None and bool(finished_now.any()):
                    is_eos = torch.isin(block, eos)
                    run = is_eos.cumsum(dim=-1)
                    block[(run > 0) & ~((run == 1) & is_eos)] = pad
            canvases.append(block)
            if bool(finished_seq.all()):
                break
            new_ids, key_valid = block, kv
    wall = time.perf_counter() - t0
    out = torch.cat(canvases, dim=1)[:, :gen_len]
    if out.shape[1] < gen_len:                                                    # every row finished early
        fill = pad if pad is not None else eos_ids[0]
        out = torch.cat([out, torch.full((n, gen_len - out.shape[1]), fill, dtype=out.dtype, device=dev)], dim=1)
    return DecodeResult(tokens=out.tolist(), forwards=forwards.tolist(), extra_forwards=extra.tolist(),
                        committed_per_step=per_step, step_tokens=step_tok, wall_time=wall, model_calls=calls)
