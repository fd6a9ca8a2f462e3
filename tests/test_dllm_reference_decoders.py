"""The registered reference decoders of SDAR, Fast-dLLM v2, NLD and Fast-dLLM v1's prefix cache against
transcriptions, written here, of the authors' own loops:

* SDAR: the evaluation harness's ``huggingface_bd3.py: block_diffusion_generate`` at ``eval_sdar_hf.py``'s settings
  (``temperature=1.0, top_k=1``: a one-hot filtered draw, the confidence from the unfiltered softmax);
* Fast-dLLM v2: ``v2/generation_functions.py: batch_sample`` (temperature 0);
* NLD: the HF remote code's ``generate_with_prefix_cache_block_diff`` with ``causal_context=True`` (the argmax and
  the softmax over the whole vocabulary, at most ``steps / blocks`` forwards per block, the EOS break);
* Fast-dLLM v1: ``llada/generate.py: generate_with_prefix_cache`` and ``dream/model/generation_utils_block.py:
  _sample`` (``alg='confidence_threshold'``), with the backbone's own KV cache cropped to the prefix.

The SDAR, Fast-dLLM v2 and NLD transcriptions recompute the whole canvas with the reference attention mask every
forward, with no cache and no workbench adapter; the Fast-dLLM v1 ones keep the stale prefix keys as the reference
does. The authors' code needs the hub or a GPU stack (no in-process reference), so the loops are transcribed; tokens
and forward counts must be equal, the counts after an EOS included (each reference's stopping rule)."""
import pytest
import torch
from transformers import DynamicCache

from workbench.decoding import DecodeError, get_policy
from workbench.model.families.fixtures import write_family_checkpoint
from workbench.model.io import load_checkpoint
from workbench.model.masks import to_additive
from workbench.model.trimode import cache_keyword

PROMPTS = [[72, 101, 108, 108, 111, 32, 119], [100, 101, 102, 32, 102], [9, 8, 7, 6, 5, 4, 3, 2]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("refdec")
    blocks = {"sdar": 4, "fast_dllm_v2": 8, "nld": 32, "llada": None, "dream": None}
    return {f: load_checkpoint(write_family_checkpoint(f, root / f, block_size=b, seed=3))[0]
            for f, b in blocks.items()}


def _forward(model, canvas: list[int], allowed: torch.Tensor) -> torch.Tensor:
    n = len(canvas)
    with torch.no_grad():
        return model.backbone(input_ids=torch.tensor([canvas]), position_ids=torch.arange(n)[None],
                              attention_mask=to_additive(allowed), use_cache=False).logits[0].float()


def _block_causal(n: int, s: int) -> torch.Tensor:
    """SDAR's ``block_mask = tril(ones(num_blocks, num_blocks))`` repeated by the block length (positions from 0)."""
    nb = -(-n // s)
    return torch.tril(torch.ones(nb, nb)).repeat_interleave(s, 0).repeat_interleave(s, 1)[:n, :n].bool()


def _greedy(logits):
    x0 = logits.argmax(-1)
    return x0, torch.softmax(logits, -1).gather(-1, x0[:, None])[:, 0]


def _cut(tokens, eos):
    return tokens[:tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens


def sdar_reference(model, prompt, gen_len, steps, threshold, eos=None):
    """``huggingface_bd3.py: block_diffusion_generate`` (batch of one) with ``temperature=1.0, top_k=1``. Returns
    ``(tokens, denoising forwards, KV-commit forwards)``."""
    s, m = model.block_size, model.mask_token_id
    p = len(prompt)
    n_blocks = -(-(p + gen_len) // s)
    x = torch.tensor(prompt + [m] * (n_blocks * s - p))
    assert s % steps == 0 and s >= steps
    num_transfer_tokens = [s // steps + (1 if i < s % steps else 0) for i in range(steps)]
    g = torch.Generator().manual_seed(0)
    fw = commits = 0
    for nb in range(p // s, n_blocks):
        lo, hi = nb * s, (nb + 1) * s
        cur_x = x[lo:hi].clone()
        for i in range(steps + 1):
            mask_index = cur_x == m
            if mask_index.sum() == 0:
                commits += 1                                              # the store_kv forward
                break
            x[lo:hi] = cur_x
            logits = _forward(model, x[:hi].tolist(), _block_causal(hi, s))[lo:hi]
            fw += 1
            # sample_with_temperature_topk_topp(logits, temperature=1.0, top_k=1, top_p=1.0)
            ori_probs = torch.softmax(logits, dim=-1)
            values, _ = torch.topk(logits, 1)
            filtered = torch.where(logits < values[..., -1, None], torch.full_like(logits, float("-inf")), logits)
            x0 = torch.multinomial(torch.softmax(filtered, dim=-1), num_samples=1, generator=g)
            x0_p = torch.gather(ori_probs, -1, x0)[:, 0]
            x0 = torch.where(mask_index, x0[:, 0], cur_x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(float("-inf")))
            if threshold < 1.0:
                high_conf_mask = confidence > threshold
                if high_conf_mask.sum() >= num_transfer_tokens[i]:
                    transfer_index = high_conf_mask
                else:
                    transfer_index = torch.zeros(s, dtype=torch.bool)
                    transfer_index[torch.topk(confidence, num_transfer_tokens[i]).indices] = True
            else:
                transfer_index = torch.zeros(s, dtype=torch.bool)
                transfer_index[torch.topk(confidence, num_transfer_tokens[i]).indices] = True
            cur_x[transfer_index] = x0[transfer_index]
        x[lo:hi] = cur_x
        if eos is not None and eos in x[p:].tolist():
            break
    return _cut(x[p:p + gen_len].tolist(), eos), fw, commits


def fast_reference(model, prompt, gen_len, sub, threshold, eos=None):
    """``batch_sample`` (batch of one, temperature 0). Returns ``(tokens, denoising forwards, commits)``."""
    s, m = model.block_size, model.mask_token_id
    p = len(prompt)
    x = list(prompt)
    fw = commits = 0
    if p % s == 0:                                                # prefill of whole blocks: the AR token
        x.append(int(_forward(model, x, _block_causal(p, s))[-1].argmax()))
    while len(x) < p + gen_len:
        lo = len(x) // s * s
        hi = lo + s
        x += [m] * (hi - len(x))
        finished = False
        for a in range(lo, hi, sub):
            while m in x[a:a + sub]:
                logits = _forward(model, x, _block_causal(hi, s))
                fw += 1
                logits = torch.cat([logits[:1], logits[:-1]])[a:a + sub]          # the shift
                x0, p0 = _greedy(logits)
                mask_index = torch.tensor(x[a:a + sub]) == m
                conf = torch.where(mask_index, p0, torch.tensor(float("-inf")))
                take = conf > threshold
                take[int(conf.argmax())] = True
                take &= mask_index
                for j in torch.nonzero(take)[:, 0].tolist():
                    x[a + j] = int(x0[j])
                finished |= eos is not None and bool(((x0 == eos) & take).any())
        if finished:                                              # finished_flag.all(): no commit forward
            break
        x.append(int(_forward(model, x, _block_causal(hi, s))[-1].argmax()))     # commit → next block's token
        commits += 1
    return _cut(x[p:p + gen_len], eos), fw, commits


def nld_reference(model, prompt, gen_len, b, threshold, steps=None, eos=None, exclude_mask=False):
    """``generate_with_prefix_cache_block_diff`` (batch of one; causal_context=True, shift_logits=False, temperature
    0, remasking='low_confidence'). ``exclude_mask``: the workbench's former reading, the mask id removed from the
    argmax and the softmax (not the reference). Returns ``(tokens, denoising forwards, commit forwards)``."""
    m = model.mask_token_id
    steps_per_block = (steps or gen_len) // (gen_len // b)
    x = list(prompt)
    fw = commits = 0

    def causal_next(seq):
        ar = _forward(model, seq, torch.tril(torch.ones(len(seq), len(seq))).bool())[-1]
        if exclude_mask:
            ar[m] = float("-inf")
        return int(ar.argmax())

    next_token = causal_next(x)                                   # the causal prefill's next token
    for _ in range(gen_len // b):
        block = torch.tensor([next_token] + [m] * (b - 1))
        c = len(x)
        for _ in range(steps_per_block):
            mask_index = block == m
            if mask_index.sum() == 0:
                break
            fw += 1
            allowed = torch.tril(torch.ones(c + b, c + b)).bool()
            allowed[c:] = True                                    # the block sees the cached prefix and itself
            logits = _forward(model, x + block.tolist(), allowed)[c:]
            if exclude_mask:
                logits[:, m] = float("-inf")
            # get_transfer_index with a threshold
            x0 = torch.argmax(logits, dim=-1)
            x0_p = torch.softmax(logits, dim=-1).gather(-1, x0[:, None])[:, 0]
            x0 = torch.where(mask_index, x0, block)
            confidence = torch.where(mask_index, x0_p, torch.tensor(float("-inf")))
            k = int(mask_index.sum())
            _, select_index = torch.topk(confidence, k=k)
            transfer_index = torch.zeros(b, dtype=torch.bool)
            transfer_index[select_index] = True
            for kk in range(1, k):
                if confidence[select_index[kk]] < threshold:
                    transfer_index[select_index[kk]] = False
            block[transfer_index] = x0[transfer_index]
            if eos is not None:
                eos_mask = block == eos
                if eos_mask.any():
                    mask_before = (block == m) & ~eos_mask.cumsum(0).bool()
                    if not mask_before.any():
                        break
        x += block.tolist()
        commits += 1
        next_token = causal_next(x)
        if eos is not None and eos in x[len(prompt):]:
            break
    return _cut(x[len(prompt):len(prompt) + gen_len], eos), fw, commits


def _bidirectional(model, ids: list[int], start: int, cache: DynamicCache) -> torch.Tensor:
    """The backbone over ``ids`` at positions ``start..``, every query seeing every key of ``cache`` and of ``ids``;
    appends to ``cache``."""
    q = len(ids)
    with torch.no_grad():
        return model.backbone(input_ids=torch.tensor([ids]), position_ids=torch.arange(start, start + q)[None],
                              attention_mask=to_additive(torch.ones(q, start + q, dtype=torch.bool)),
                              use_cache=True, **{cache_keyword(model.backbone): cache}).logits[0].float()


def _crop(cache: DynamicCache, keep: int) -> None:
    cache.crop(keep - cache.get_seq_length())             # transformers 5: crop(-K) drops the last K


def prefix_cache_reference(model, prompt, gen_len, b, threshold, dream):
    """Fast-dLLM v1, batch of one, temperature 0: LLaDA's ``generate_with_prefix_cache(threshold)`` or Dream's
    ``_sample(alg='confidence_threshold', dual_cache=False)``. Returns ``(tokens, nfe)``."""
    m = model.mask_token_id
    p = len(prompt)
    x = torch.tensor(prompt + [m] * gen_len)
    nfe = 0

    def shift(logits):
        return torch.cat([logits[:1], logits[:-1]]) if dream else logits

    def transfer(logits, mask_index, k):
        """LLaDA get_transfer_index (threshold): float64 softmax; Dream sample_tokens + its topk loop alike."""
        x0 = logits.argmax(-1)
        conf = torch.softmax(logits.double() if not dream else logits, -1).gather(-1, x0[:, None])[:, 0]
        confidence = torch.where(mask_index, conf, torch.tensor(float("-inf"), dtype=conf.dtype))
        index = torch.zeros(len(logits), dtype=torch.bool)
        selected, select_index = torch.topk(confidence, k)
        index[select_index] = True
        for kk in range(1, k):
            if selected[kk] < threshold:
                index[select_index[kk]] = False
        return x0, index

    for nb in range(gen_len // b):
        bs, be = p + nb * b, p + (nb + 1) * b
        cache = DynamicCache()
        logits = shift(_bidirectional(model, x.tolist(), 0, cache))           # update cache (the whole canvas)
        nfe += 1
        if dream:
            x[bs] = logits[bs].argmax()
        else:
            mask_index = x == m
            mask_index[be:] = False
            x0, index = transfer(logits, mask_index, int(mask_index.sum()))
            x[index] = x0[index]
        _crop(cache, bs)                                                      # the prefix's keys only
        while True:
            nfe += 1
            logits = shift(_bidirectional(model, x[bs:].tolist(), bs, cache))
            _crop(cache, bs)
            mask_index = x[bs:] == m
            mask_index[b:] = False
            x0, index = transfer(logits, mask_index, int((x[bs:be] == m).sum()))
            x[bs:][index] = x0[index]
            if (x[bs:be] == m).sum() == 0:
                break
    return x[p:].tolist(), nfe


@pytest.mark.parametrize("steps,threshold", [(4, 0.85), (4, 0.2), (2, 0.85), (4, 1.0)])
def test_sdar_decoder_equals_the_evaluation_loop(models, steps, threshold):
    model = models["sdar"]
    res = get_policy("sdar")(model, PROMPTS, 12, steps=steps, threshold=threshold)
    want = [sdar_reference(model, p, 12, steps, threshold) for p in PROMPTS]
    assert res.tokens == [w[0] for w in want]
    assert res.forwards == [w[1] for w in want]
    assert res.extra_forwards == [w[2] for w in want] == [-(-(len(p) + 12) // 4) - len(p) // 4 for p in PROMPTS]


def test_sdar_decoder_refuses_what_the_evaluation_loop_asserts(models):
    with pytest.raises(DecodeError, match="steps must divide the block size 4"):
        get_policy("sdar")(models["sdar"], PROMPTS, 8, steps=3)


@pytest.mark.parametrize("threshold", [0.9, 0.05])
def test_fast_dllm_v2_decoder_equals_its_batch_sample(models, threshold):
    model = models["fast_dllm_v2"]
    res = get_policy("fast_dllm_v2")(model, PROMPTS, 16, sub_block=4, threshold=threshold)
    want = [fast_reference(model, p, 16, 4, threshold) for p in PROMPTS]
    assert res.tokens == [w[0] for w in want] and res.forwards == [w[1] for w in want]


@pytest.mark.parametrize("threshold,steps", [(0.9, None), (0.1, None), (0.9, 4)])
def test_nld_ar_seeded_decoder_equals_generate_with_prefix_cache_block_diff(models, threshold, steps):
    """Token-equal to the reference loop over the whole vocabulary (the mask id can be the argmax of this random
    model), forwards capped at steps / blocks per block (steps=4: 2 per block of 8, masks left)."""
    model = models["nld"]
    res = get_policy("nld_ar_seeded")(model, PROMPTS, 16, block_length=8, threshold=threshold, pad_id=256,
                                      steps=steps)
    want = [nld_reference(model, p, 16, 8, threshold, steps) for p in PROMPTS]
    assert res.tokens == [w[0] for w in want]
    assert res.forwards == [w[1] for w in want] and res.extra_forwards == [w[2] for w in want]
    if steps is not None:
        assert any(model.mask_token_id in t for t in res.tokens)            # the cap left masks, as upstream


def test_the_nld_transcription_tells_the_mask_exclusion_apart(models):
    """The reference and the former reading (mask id excluded from the argmax and the softmax) differ on this
    fixture, so the equality above checks the full vocabulary."""
    model = models["nld"]
    full = [nld_reference(model, p, 16, 8, 0.9)[0] for p in PROMPTS]
    excluded = [nld_reference(model, p, 16, 8, 0.9, exclude_mask=True)[0] for p in PROMPTS]
    assert sum(f != e for f, e in zip(full, excluded)) >= 1


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("threshold", [0.9, 0.3])
def test_confidence_prefix_cache_equals_fast_dllm_v1(models, family, threshold):
    """Fast-dLLM v1's loops with their stale prefix cache; on Dream block position 0 comes from the block's first
    forward (one token committed there, whatever the threshold)."""
    model = models[family]
    res = get_policy("confidence_prefix_cache")(model, PROMPTS, 8, block_length=4, threshold=threshold, pad_id=256)
    want = [prefix_cache_reference(model, p, 8, 4, threshold, family == "dream") for p in PROMPTS]
    assert res.tokens == [w[0] for w in want] and res.forwards == [w[1] for w in want]
    if family == "dream":
        assert all(r[0] == 1 for r in res.committed_per_step)


def _eos_of(tokens: list[int], at: int = 6) -> int:
    return tokens[at]


def test_sdar_stops_after_the_block_holding_eos(models):
    """The evaluation loop stops after the block that holds the stop token, that block's KV commit included: the
    forwards of later blocks are not spent."""
    model = models["sdar"]
    free = get_policy("sdar")(model, PROMPTS, 16)
    eos = _eos_of(free.tokens[0])
    res = get_policy("sdar")(model, PROMPTS, 16, eos_id=eos)
    want = [sdar_reference(model, p, 16, 4, 0.85, eos) for p in PROMPTS]
    assert res.tokens == [w[0] for w in want]
    assert res.forwards == [w[1] for w in want] and res.extra_forwards == [w[2] for w in want]
    assert res.forwards[0] < free.forwards[0] and res.extra_forwards[0] < free.extra_forwards[0]


def test_fast_dllm_v2_finishes_the_row_at_eos(models):
    """batch_sample finishes a row when a step unmasks its stop token: the block is completed, its commit forward
    is not run."""
    model = models["fast_dllm_v2"]
    free = get_policy("fast_dllm_v2")(model, PROMPTS, 24, sub_block=4)
    eos = _eos_of(free.tokens[0], 9)
    res = get_policy("fast_dllm_v2")(model, PROMPTS, 24, sub_block=4, eos_id=eos)
    want = [fast_reference(model, p, 24, 4, 0.9, eos) for p in PROMPTS]
    assert res.tokens == [w[0] for w in want]
    assert res.forwards == [w[1] for w in want] and res.extra_forwards == [w[2] for w in want]
    assert res.forwards[0] < free.forwards[0]


def test_nld_breaks_at_eos(models):
    """generate_with_prefix_cache_block_diff stops denoising a block once its EOS has no mask before it, commits
    it, and stops (each row as alone)."""
    model = models["nld"]
    free = get_policy("nld_ar_seeded")(model, PROMPTS, 24, block_length=8, pad_id=256)
    eos = _eos_of(free.tokens[0], 9)
    res = get_policy("nld_ar_seeded")(model, PROMPTS, 24, block_length=8, pad_id=256, eos_id=eos)
    want = [nld_reference(model, p, 24, 8, 0.9, eos=eos) for p in PROMPTS]
    assert res.tokens == [w[0] for w in want]
    assert res.forwards == [w[1] for w in want] and res.extra_forwards == [w[2] for w in want]
    assert res.forwards[0] < free.forwards[0] and res.extra_forwards[0] < free.extra_forwards[0]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_prefix_cache_has_no_eos_rule(models, family):
    """Neither Fast-dLLM v1 loop stops at an EOS: every forward still runs; the tokens end at the first EOS."""
    model = models[family]
    free = get_policy("confidence_prefix_cache")(model, PROMPTS, 8, block_length=4, pad_id=256)
    eos = _eos_of(free.tokens[0], 2)
    res = get_policy("confidence_prefix_cache")(model, PROMPTS, 8, block_length=4, pad_id=256, eos_id=eos)
    assert res.forwards == free.forwards
    assert res.tokens == [t[:t.index(eos) + 1] if eos in t else t for t in free.tokens]


def test_reference_decoders_refuse_other_block_lengths(models):
    with pytest.raises(DecodeError, match="decodes the family's own blocks of 4 tokens"):
        get_policy("sdar")(models["sdar"], PROMPTS, 8, block_length=8)


def test_prefix_cache_never_repeats_a_state_for_ever():
    """Fast-dLLM v1's loop runs while the block holds a mask; a forward whose commits are all mask-token predictions
    leaves the state unchanged, so the reference would repeat it for ever. Only such a row changes: its most
    confident masked position takes its best token other than the mask."""
    from workbench.decoding.families.fast_dllm_v1 import threshold_commit, unstick

    m = 5
    logits = torch.full((2, 3, 6), -5.0)
    logits[:, :, m] = 4.0                          # every position predicts the mask token...
    logits[0, 1, 2], logits[0, 2, 3] = 3.0, 1.0    # ...row 0's position 1 has the best other token (2)
    logits[1, 0, 0] = 9.0                          # row 1's position 0 predicts token 0, confidently
    masked = torch.tensor([[True, True, True], [True, True, False]])
    commit, top = threshold_commit(logits, masked, 0.9, torch.float64)
    block = torch.full((2, 3), m)
    stuck = masked.any(1) & (torch.where(commit, top, block) == block).all(1)
    assert stuck.tolist() == [True, False]
    commit2, top2 = unstick(logits, masked, commit, top, stuck, m)
    assert torch.where(commit2, top2, block)[0].tolist() == [m, 2, m]        # row 0: progress, one position
    assert torch.equal(commit2[1], commit[1]) and torch.equal(top2[1], top[1])  # row 1: as the reference
