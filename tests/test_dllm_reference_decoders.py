"""The registered reference decoders of SDAR, Fast-dLLM v2 and NLD against a transcription, written here, of the
authors' own loops (SDAR ``generate.py: block_diffusion_generate``; Fast-dLLM v2 ``generate``; NLD HF
``generate_with_prefix_cache_block_diff`` with ``causal_context=True``) that recomputes the whole canvas with the
reference attention mask every forward, with no cache and no workbench adapter. Their code needs the hub or a GPU
stack (no in-process reference), so the loops are transcribed; tokens must be equal. Greedy (argmax; confidence =
softmax probability of the argmax)."""
import pytest
import torch

from workbench.decoding import get_policy
from workbench.model.families.fixtures import write_family_checkpoint
from workbench.model.io import load_checkpoint
from workbench.model.masks import to_additive

PROMPTS = [[72, 101, 108, 108, 111, 32, 119], [100, 101, 102, 32, 102], [9, 8, 7, 6, 5, 4, 3, 2]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("refdec")
    blocks = {"sdar": 4, "fast_dllm_v2": 8, "nld": 32}
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


def sdar_reference(model, prompt, gen_len, steps, threshold):
    s, m = model.block_size, model.mask_token_id
    p = len(prompt)
    n_blocks = -(-(p + gen_len) // s)
    x = prompt + [m] * (n_blocks * s - p)
    sched = [s // steps + (1 if i < s % steps else 0) for i in range(steps)]
    for nb in range(p // s, n_blocks):
        lo, hi = nb * s, (nb + 1) * s
        for step in range(steps + 1):
            cur = torch.tensor(x[lo:hi])
            mask_index = cur == m
            if not mask_index.any():
                break
            logits = _forward(model, x[:hi], _block_causal(hi, s))[lo:hi]
            x0, p0 = _greedy(logits)
            conf = torch.where(mask_index, p0, torch.tensor(float("-inf")))
            k = sched[step]
            high = conf > threshold
            take = high if int(high.sum()) >= k else torch.zeros(s, dtype=torch.bool).index_fill_(
                0, torch.topk(conf, k).indices, True)
            for j in torch.nonzero(take)[:, 0].tolist():
                x[lo + j] = int(x0[j])
    return x[p:p + gen_len]


def fast_reference(model, prompt, gen_len, sub, threshold):
    s, m = model.block_size, model.mask_token_id
    p = len(prompt)
    x = list(prompt)
    if p % s == 0:                                                # prefill of whole blocks: the AR token
        x.append(int(_forward(model, x, _block_causal(p, s))[-1].argmax()))
    while len(x) < p + gen_len:
        lo = len(x) // s * s
        hi = lo + s
        x += [m] * (hi - len(x))
        for a in range(lo, hi, sub):
            while m in x[a:a + sub]:
                logits = _forward(model, x, _block_causal(hi, s))
                logits = torch.cat([logits[:1], logits[:-1]])[a:a + sub]          # the shift
                x0, p0 = _greedy(logits)
                mask_index = torch.tensor(x[a:a + sub]) == m
                conf = torch.where(mask_index, p0, torch.tensor(float("-inf")))
                take = conf > threshold
                take[int(conf.argmax())] = True
                take &= mask_index
                for j in torch.nonzero(take)[:, 0].tolist():
                    x[a + j] = int(x0[j])
        x.append(int(_forward(model, x, _block_causal(hi, s))[-1].argmax()))     # commit → next block's token
    return x[p:p + gen_len]


def nld_reference(model, prompt, gen_len, b, threshold):
    m = model.mask_token_id
    x = list(prompt)
    while len(x) < len(prompt) + gen_len:
        c = len(x)
        ar = _forward(model, x, torch.tril(torch.ones(c, c)).bool())[-1]
        ar[m] = float("-inf")
        block = [int(ar.argmax())] + [m] * (b - 1)
        while m in block:
            n = c + b
            allowed = torch.tril(torch.ones(n, n)).bool()
            allowed[c:] = True                                    # the block sees the prefix and itself
            logits = _forward(model, x + block, allowed)[c:]
            logits[:, m] = float("-inf")
            x0, p0 = _greedy(logits)
            mask_index = torch.tensor(block) == m
            conf = torch.where(mask_index, p0, torch.tensor(float("-inf")))
            take = (conf >= threshold) & mask_index
            take[int(conf.argmax())] = True
            for j in torch.nonzero(take)[:, 0].tolist():
                block[j] = int(x0[j])
        x += block
    return x[len(prompt):len(prompt) + gen_len]


@pytest.mark.parametrize("steps,threshold", [(4, 0.85), (4, 0.2)])   # steps < S: see sdar_decode's docstring
def test_sdar_decoder_equals_block_diffusion_generate(models, steps, threshold):
    model = models["sdar"]
    res = get_policy("sdar")(model, PROMPTS, 12, steps=steps, threshold=threshold)
    assert res.tokens == [sdar_reference(model, p, 12, steps, threshold) for p in PROMPTS]
    assert res.extra_forwards == [-(-(len(p) + 12) // 4) - len(p) // 4 for p in PROMPTS]      # one commit per block


@pytest.mark.parametrize("threshold", [0.9, 0.05])
def test_fast_dllm_v2_decoder_equals_its_generate(models, threshold):
    model = models["fast_dllm_v2"]
    res = get_policy("fast_dllm_v2")(model, PROMPTS, 16, sub_block=4, threshold=threshold)
    assert res.tokens == [fast_reference(model, p, 16, 4, threshold) for p in PROMPTS]


@pytest.mark.parametrize("threshold", [0.9, 0.1])
def test_nld_ar_seeded_decoder_equals_generate_diffusion(models, threshold):
    model = models["nld"]
    res = get_policy("nld_ar_seeded")(model, PROMPTS, 16, block_length=8, threshold=threshold, pad_id=256)
    assert res.tokens == [nld_reference(model, p, 16, 8, threshold) for p in PROMPTS]


def test_reference_decoders_refuse_other_block_lengths(models):
    from workbench.decoding.base import DecodeError

    with pytest.raises(DecodeError, match="decodes the family's own blocks of 4 tokens"):
        get_policy("sdar")(models["sdar"], PROMPTS, 8, block_length=8)
