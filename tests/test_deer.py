"""DEER (deer.txt): Stage I / II masking and loss (Eq. 1–4), block-draft attention, lossless decoding
(Alg. 1, Eq. 5–6), shared-tokenizer check, resumable teacher data, and a micro training run."""
import itertools
import json
import math
import zlib
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from scipy.stats import chi2
from transformers import LlamaConfig, LlamaForCausalLM

import workbench.deer.decode as deer_decode_mod
from workbench.decoding import ar_decode, get_policy
from workbench.decoding.base import DecodeError
from workbench.deer.attention import draft_block_logits
from workbench.deer.batches import build_span_batch
from workbench.deer.data import load_teacher
from workbench.deer.decode import deer_decode
from workbench.deer.losses import deer_loss, greedy_tau_estimate, leading_matches
from workbench.deer.masking import (full_noise, mask_span, stage1_spans, stage1_weights, stage2_spans,
                                    stage2_weights)
from workbench.deer.models import TokenizerMismatchError, build_drafter, check_shared_tokenizer
from workbench.deer.tables import by_category
from workbench.deer.teacher import META_KEY, TeacherConfig, generate_teacher
from workbench.model.presets import preset_config
from workbench.model.trimode import TriModeLM
from workbench.speculative import AcceptResult, speculative_accept
from workbench.tokenizer import EOS_ID, MASK_ID, SEP_ID, byte_tokenizer


PAD = EOS_ID


def _micro(seed: int) -> TriModeLM:
    torch.manual_seed(seed)
    return TriModeLM(LlamaForCausalLM(preset_config("micro")).eval(), MASK_ID)


def _prompts(lengths, seed=0, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


# ---------------------------------------------------------------- Stage I / II masking and loss
def test_stage1_masks_only_after_sep_and_weights_by_inverse_t():
    prompts, answers = [[1, 2]], [[10, 11, 12, 13]]
    sb = build_span_batch(prompts, answers, torch.tensor([1]), torch.tensor([4]), PAD)
    assert sb.context.tolist() == [[1, 2, 10]] and sb.span.tolist() == [[11, 12, 13]]
    masked = torch.tensor([[True, False, True]])
    block, kv = sb.block_inputs(masked, SEP_ID, MASK_ID)
    assert block.tolist() == [[SEP_ID, MASK_ID, 12, MASK_ID]]          # context untouched, SEP first
    assert kv.tolist() == [[True] * 7]
    t = torch.tensor([0.5])
    w = stage1_weights(t, sb.span_valid)
    assert w.tolist() == [[2.0, 2.0, 2.0]]
    # logits with p(target) = 1/2, 1/4, 1/2 at the three span positions (V = 4)
    logits = torch.full((1, 3, 4), -1e9)
    logits[0, 0, :2] = 0.0
    logits[0, 1, :] = 0.0
    logits[0, 2, :2] = 0.0
    targets = torch.tensor([[0, 1, 1]])                                    # span ids remapped to V = 4
    loss = deer_loss(logits, targets, masked, w, sb.span_valid)
    # Σ_masked (1/t)·CE / #span = 2·(log 2 + log 2) / 3; the unmasked middle position (CE log 4) is ignored
    assert loss.item() == pytest.approx(2 * 2 * math.log(2) / 3, rel=1e-6)


def test_stage1_spans_cover_every_cut_and_the_whole_suffix():
    lens = torch.tensor([5] * 400 + [1])
    cut, end = stage1_spans(lens, torch.Generator().manual_seed(0))
    assert torch.equal(end, lens)
    assert set(cut[:400].tolist()) == {0, 1, 2, 3, 4} and cut[-1] == 0
    span_valid = torch.tensor([[True, True, True, False]])
    assert mask_span(span_valid, full_noise(1)).tolist() == [[True, True, True, False]]
    m = mask_span(span_valid.expand(2000, -1), torch.full((2000,), 0.3), torch.Generator().manual_seed(1))
    assert not m[:, 3].any() and abs(m[:, :3].float().mean().item() - 0.3) < 0.03


def test_stage2_masks_exactly_the_last_r_tokens_with_alpha_weights():
    prompts, answers = [[1, 2]], [[10, 11, 12, 13, 14, 15]]
    # cut 2, R = 3: the answer is truncated to a[:5] and its last 3 tokens form the span
    sb = build_span_batch(prompts, answers, torch.tensor([2]), torch.tensor([5]), PAD)
    assert sb.context.tolist() == [[1, 2, 10, 11]] and sb.span.tolist() == [[12, 13, 14]]
    masked = mask_span(sb.span_valid, full_noise(1))
    block, _ = sb.block_inputs(masked, SEP_ID, MASK_ID)
    assert block.tolist() == [[SEP_ID, MASK_ID, MASK_ID, MASK_ID]]
    # weights α^(R−i), i = 1..R (i = 1 right after SEP), times 1/t; zero at padding
    valid = torch.tensor([[True, True, True, False, False]])
    assert stage2_weights(torch.tensor([1.0]), valid, alpha=2.0).tolist() == [[4.0, 2.0, 1.0, 0.0, 0.0]]
    assert stage2_weights(torch.tensor([0.5]), valid, alpha=2.0).tolist() == [[8.0, 4.0, 2.0, 0.0, 0.0]]
    w = stage2_weights(torch.tensor([1.0]), sb.span_valid, alpha=1.01)
    assert w[0].tolist() == pytest.approx([1.01 ** 2, 1.01, 1.0])
    logits = torch.zeros((1, 3, 4))                                          # CE = log 4 everywhere
    loss = deer_loss(logits, torch.tensor([[0, 1, 2]]), masked, w, sb.span_valid)
    assert loss.item() == pytest.approx((1.01 ** 2 + 1.01 + 1) * math.log(4) / 3, rel=1e-6)


def test_stage2_spans_are_clipped_and_at_most_r_max():
    lens = torch.tensor([3, 50, 200] * 300)
    cut, end = stage2_spans(lens, torch.Generator().manual_seed(0), r_max=96)
    r = end - cut
    assert (r >= 1).all() and (r <= 96).all() and (end <= lens).all() and (cut >= 0).all()
    assert r[2::3].max() == 96 and r[2::3].min() == 1      # long answers reach both ends of U{1..96}
    assert (r[0::3] <= 3 - cut[0::3]).all()


def test_leading_matches_is_greedy_acceptance():
    pred = torch.tensor([[1, 2, 3, 4], [9, 2, 3, 4], [1, 2, 3, 4]])
    tgt = torch.tensor([[1, 2, 0, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    valid = torch.tensor([[True] * 4, [True] * 4, [True, True, True, False]])
    assert leading_matches(pred, tgt, valid).tolist() == [2, 0, 3]


def test_greedy_tau_estimate_matches_the_cycle_walk():
    """With drafter errors at fixed, independently drawn positions of each answer, the mean of a + 1 over
    all cuts equals the τ of walking greedy cycles s → s + a(s) + 1; the harmonic mean (the old val/tau)
    is far below it."""
    g = torch.Generator().manual_seed(0)
    length, k = 128, 16
    for p_err in (0.1, 0.3):
        wrong = torch.rand(300, length, generator=g) < p_err               # (answers, positions)
        target = torch.arange(length).expand(300, length)
        pred = torch.where(wrong, -1, target)
        # a at every cut c: leading matches of the k-token draft starting at c, capped by the answer's end
        acc = torch.stack([leading_matches(pred[:, c:c + k], target[:, c:c + k],
                                           torch.ones_like(target[:, c:c + k], dtype=torch.bool))
                           for c in range(length)], dim=1)                    # (answers, cuts)
        tokens = cycles = 0
        for row in acc.tolist():
            s = 0
            while s < length:
                tokens, cycles, s = tokens + row[s] + 1, cycles + 1, s + row[s] + 1
        exact = tokens / cycles
        est = float(greedy_tau_estimate(acc.flatten()))
        harmonic = 1 / float((1 / (acc.float() + 1)).mean())
        assert abs(est - exact) / exact < 0.03, (p_err, est, exact)
        assert harmonic < 0.8 * exact

# ---------------------------------------------------------------- the drafter's block forward
def test_block_forward_matches_extend_then_diffusion_logits(micro_model):
    prompts = _prompts([6, 3, 9])
    from workbench.decoding.base import left_pad

    ids, valid = left_pad(prompts, PAD, "cpu")
    n, k = ids.shape[0], 4
    block = torch.full((n, k + 1), MASK_ID)
    block[:, 0] = SEP_ID
    ones = torch.ones((n, k + 1), dtype=torch.bool)
    kv = torch.cat([valid, ones], 1)
    with torch.no_grad():
        cache = micro_model.new_cache()
        one = draft_block_logits(micro_model, ids, block, kv, cache)        # one forward, cache grows by the chunk
        assert cache.get_seq_length() == ids.shape[1]
        nocache = draft_block_logits(micro_model, ids, block, kv)          # the training path
        ref_cache = micro_model.new_cache()
        micro_model.extend(ids, ref_cache, valid)
        ref = micro_model.diffusion_logits(block, ref_cache, kv)
        # a ragged chunk (right padding invalid) after the cache
        chunk = torch.tensor([[5, 6], [7, PAD], [8, 9]])
        cvalid = torch.tensor([[True, True], [True, False], [True, True]])
        kv2 = torch.cat([valid, cvalid, ones], 1)
        two = draft_block_logits(micro_model, chunk, block, kv2, cache)
        micro_model.extend(chunk, ref_cache, torch.cat([valid, cvalid], 1))
        ref2 = micro_model.diffusion_logits(block, ref_cache, kv2)
        assert cache.get_seq_length() == ref_cache.get_seq_length() == ids.shape[1] + 2
    torch.testing.assert_close(one, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nocache, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(two, ref2, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- lossless greedy decoding
class _TokenCache:
    """Minimal cache of token ids for the oracle drafter (crop / batch_select like DynamicCache)."""

    def __init__(self):
        self.ids = None

    def crop(self, n):
        self.ids = self.ids[:, :n]

    def batch_select_indices(self, idx):
        self.ids = self.ids[idx]


class _OracleBackbone(torch.nn.Module):
    """Drafts the target's exact greedy continuation of the verified prefix it reads, but a wrong token at
    pseudo-random absolute positions (a quarter of them): rejections, partial and full acceptances happen."""

    def __init__(self, target, k):
        super().__init__()
        self.target, self.k = target, k
        self.wrong = torch.rand(4096, generator=torch.Generator().manual_seed(0)) < 0.25
        self.seen: list[list[int]] = []                 # every verified prefix the drafter conditioned on
        self.lm = torch.nn.Linear(1, target.backbone.config.vocab_size)   # vocabulary size / parameter count
        self.config = target.backbone.config

    def get_output_embeddings(self):
        return self.lm

    def forward(self, input_ids, position_ids, attention_mask, past_key_values, use_cache):
        cache = past_key_values
        cache.ids = input_ids if cache.ids is None else torch.cat([cache.ids, input_ids], 1)
        valid = attention_mask[:, 0, -1, :] == 0                        # a block query sees every valid key
        b = self.k + 1
        v = self.config.vocab_size
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], v)
        for r in range(input_ids.shape[0]):
            prefix = cache.ids[r, :-b][valid[r, :-b]].tolist()
            self.seen.append(prefix)
            cont = ar_decode(self.target, [prefix], self.k).tokens[0]
            for j, tok in enumerate(cont):
                wrong = bool(self.wrong[len(prefix) + j])
                logits[r, input_ids.shape[1] - self.k + j, (tok + 1) % v if wrong else tok] = 10.0
        return SimpleNamespace(logits=logits)


class _OracleDrafter:
    def __init__(self, target, k):
        self.mask_token_id, self.mask_dtype = MASK_ID, torch.float32
        self.backbone = _OracleBackbone(target, k)
        self.vocab_size = target.vocab_size

    def new_cache(self):
        return _TokenCache()

    def call_backbone(self, ids, pos, mask, cache=None):       # TriModeLM's one masked forward
        return self.backbone(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache,
                             use_cache=cache is not None).logits


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_deer_equals_ar_greedy_with_random_drafter(k):
    target, drafter = _micro(0), _micro(1)
    prompts = _prompts([5, 12, 1, 9])
    ref = ar_decode(target, prompts, 24, pad_id=PAD)
    res = deer_decode(target, drafter, prompts, 24, draft_length=k, pad_id=PAD)
    assert res.tokens == ref.tokens
    for i in range(len(prompts)):
        assert sum(res.committed_per_step[i]) == 24
        assert res.forwards[i] == res.extra_forwards[i] == len(res.committed_per_step[i])
        assert all(0 <= a <= k for a in res.accepted[i])


@pytest.mark.parametrize("k", [2, 4, 7])
def test_greedy_deer_equals_ar_greedy_with_partial_acceptance(k):
    target = _micro(0)
    prompts = _prompts([5, 12, 1, 9])
    ref = ar_decode(target, prompts, 30, pad_id=PAD)
    drafter = _OracleDrafter(target, k)
    res = deer_decode(target, drafter, prompts, 30, draft_length=k, pad_id=PAD)
    assert res.tokens == ref.tokens
    # the drafter always conditions on exactly a verified prefix: prompt + AR output so far
    verified = {tuple(p + r[:m]) for p, r in zip(prompts, ref.tokens) for m in range(30)}
    assert all(tuple(s) in verified for s in drafter.backbone.seen) and len(drafter.backbone.seen) == sum(res.forwards)
    acc = [a for row in res.accepted for a in row]
    assert 0 in acc and max(acc) == k and any(0 < a < k for a in acc)   # rejections, full and partial accepts
    assert sum(res.forwards) < 4 * 30                                  # fewer cycles than tokens


def test_deer_policy_registered():
    target, drafter = _micro(0), _micro(1)
    prompts = _prompts([4, 7])
    a = get_policy("deer")(target, prompts, 10, drafter=drafter, draft_length=3, pad_id=PAD, threshold=0.9)
    assert a.tokens == deer_decode(target, drafter, prompts, 10, draft_length=3, pad_id=PAD).tokens
    with pytest.raises(DecodeError, match="drafter"):
        get_policy("deer")(target, prompts, 10, pad_id=PAD)


# ---------------------------------------------------------------- sampling: the target's distribution
V_SMALL, P_PROMPT, GEN = 8, [0, 3, 2], 3


def _small(seed: int) -> TriModeLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V_SMALL, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=7, eos_token_id=7, bos_token_id=None,
                      initializer_range=0.5)
    return TriModeLM(LlamaForCausalLM(cfg).eval(), 6)


def _chi2(tokens, exact: np.ndarray, n: int) -> tuple[float, float]:
    idx = np.array([sum(t[j] * V_SMALL ** (GEN - 1 - j) for j in range(GEN)) for t in tokens])
    cnt = np.bincount(idx, minlength=V_SMALL ** GEN)
    e = exact * n
    big = e >= 5
    obs, exp = np.append(cnt[big], cnt[~big].sum()), np.append(e[big], e[~big].sum())
    return float(((obs - exp) ** 2 / exp).sum()), float(chi2.isf(1e-4, len(obs) - 1))


def _resample_from_p(draft, q, p, g):
    """A wrong rule: at a rejection, sample from p instead of the residual max(0, p − q)."""
    n, k = draft.shape
    p_d = p[:, :-1].gather(2, draft[..., None]).squeeze(2)
    q_d = q.gather(2, draft[..., None]).squeeze(2)
    a = (torch.rand(n, k, generator=g) * q_d < p_d).long().cumprod(1).sum(1)
    return AcceptResult(a, torch.multinomial(p[torch.arange(n), a], 1, generator=g).squeeze(1))


def test_sampled_deer_matches_ar_sampling_distribution(monkeypatch):
    target, drafter = _small(0), _small(1)
    temp, n = 0.8, 10000
    seqs = torch.tensor(list(itertools.product(range(V_SMALL), repeat=GEN)))
    ids = torch.cat([torch.tensor(P_PROMPT).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        lp = torch.log_softmax(target.causal_logits(ids).float() / temp, -1)
    p0 = len(P_PROMPT)
    exact = sum(lp[:, p0 - 1 + j].gather(1, seqs[:, j:j + 1]).squeeze(1) for j in range(GEN)).exp().numpy()
    assert exact.sum() == pytest.approx(1.0, abs=1e-4)

    def run(seed):
        return deer_decode(target, drafter, [P_PROMPT] * n, GEN, draft_length=2, temperature=temp, pad_id=7,
                           sep_id=7, seed=seed)

    res = run(0)
    stat, bound = _chi2(res.tokens, exact, n)
    assert stat < bound, (stat, bound)
    acc = [a for row in res.accepted for a in row]
    assert 0.2 < np.mean(acc) < 1.8                 # the drafter is neither always right nor always wrong
    # the same bound rejects wrong rules: residual replaced by p, and q replaced by p (accept everything)
    monkeypatch.setattr(deer_decode_mod, "speculative_accept", _resample_from_p)
    assert _chi2(run(0).tokens, exact, n)[0] > bound
    monkeypatch.setattr(deer_decode_mod, "speculative_accept",
                        lambda d, q, p, g: speculative_accept(d, p[:, :-1], p, g))
    assert _chi2(run(0).tokens, exact, n)[0] > bound


# ---------------------------------------------------------------- shared tokenizer
def test_tokenizer_mismatch_refused(tmp_path, tokenizer):
    from workbench.model.io import save_checkpoint

    check_shared_tokenizer(tokenizer, byte_tokenizer())
    other = byte_tokenizer()
    other.add_tokens(["[EXTRA]"])
    with pytest.raises(TokenizerMismatchError, match="tokenizers differ") as e:
        check_shared_tokenizer(tokenizer, other)
    assert "\n" not in str(e.value)
    swapped = byte_tokenizer()
    swapped.pad_token = "[SEP]"
    with pytest.raises(TokenizerMismatchError, match="pad_token_id"):
        check_shared_tokenizer(tokenizer, swapped)
    target = _micro(0)
    save_checkpoint(_micro(1), other, tmp_path / "d", {})
    with pytest.raises(TokenizerMismatchError):
        build_drafter(target, tokenizer, drafter_init=str(tmp_path / "d"))
    fresh, tok = build_drafter(target, tokenizer, preset="micro")
    assert tok is tokenizer and fresh.backbone.config.vocab_size == target.backbone.config.vocab_size


def test_keep_first_layers_gives_a_working_smaller_drafter(micro_model):
    from workbench.deer.models import count_parameters, keep_first_layers

    full = count_parameters(micro_model)
    ids = torch.tensor([[1, 2, 3, 4]])
    inner = micro_model.backbone.model
    with torch.no_grad():
        h = inner.embed_tokens(ids)
        h = inner.layers[0](h, position_embeddings=inner.rotary_emb(h, torch.arange(4)[None]))
        small = keep_first_layers(micro_model, 1)
        logits = small.causal_logits(ids)
        expect = small.backbone.lm_head(inner.norm(h))          # one layer left: head(norm(layer_0(embed)))
    assert len(small.backbone.model.layers) == 1 and small.backbone.config.num_hidden_layers == 1
    assert count_parameters(small) < full
    torch.testing.assert_close(logits, expect, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="init_layers"):
        keep_first_layers(small, 2)


# ---------------------------------------------------------------- teacher data
def _teacher_cfg(out, corpus, n):
    return TeacherConfig(target="micro", corpus=str(corpus), n_answers=n, prompt_len=24, gen_len=8, batch_size=2,
                         chunk_size=4, out_dir=str(out))


def _table(path):
    rows = load_teacher(path)
    return rows.prompt_id, rows.prompt, rows.answer


def test_teacher_data_resumes_and_extends(tmp_path, small_corpus, tokenizer):
    target = _micro(0)
    full = generate_teacher(_teacher_cfg(tmp_path / "full", small_corpus, 10), target, tokenizer)
    # smaller then larger count
    generate_teacher(_teacher_cfg(tmp_path / "grow", small_corpus, 6), target, tokenizer)
    assert len(load_teacher(tmp_path / "grow").answer) == 6
    generate_teacher(_teacher_cfg(tmp_path / "grow", small_corpus, 10), target, tokenizer)
    assert _table(tmp_path / "grow") == _table(full)
    # an interruption after the first chunk, then a rerun
    calls = []

    def boom(i):
        calls.append(i)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate_teacher(_teacher_cfg(tmp_path / "cut", small_corpus, 10), target, tokenizer, on_chunk=boom)
    with pytest.raises(ValueError, match="incomplete"):
        load_teacher(tmp_path / "cut")
    done = []
    generate_teacher(_teacher_cfg(tmp_path / "cut", small_corpus, 10), target, tokenizer, on_chunk=done.append)
    assert calls == [0] and done == [1, 2]                                  # chunk 0 was kept
    assert _table(tmp_path / "cut") == _table(full)
    meta = pq.ParquetFile(full / "chunk-00000.parquet").schema_arrow.metadata
    assert b'"temperature": 0.0' in meta[META_KEY]
    rows = load_teacher(full)
    assert all(len(a) == 8 for a in rows.answer) and rows.settings["split"] == "train"
    assert rows.path is not None and len(rows.path) == len(rows.answer) and all(q.endswith(".py") for q in rows.path)
    bad = _teacher_cfg(tmp_path / "full", small_corpus, 10)
    bad.temperature = 0.7
    with pytest.raises(ValueError, match="other settings"):
        generate_teacher(bad, target, tokenizer)
    with pytest.raises(ValueError, match="held out"):
        TeacherConfig(split="test").validate()


def test_document_split_keeps_every_prompt_of_a_file_on_one_side():
    """split_by 'document' holds out whole source files (the prompt split puts a file's prompts on both sides);
    teacher data without the path column is refused for it with a one-line reason."""
    from workbench.deer.data import TeacherRows, split_rows

    paths = [f"pkg/mod{f}.py" for f in range(40) for _ in range(4)]          # 40 files x 4 prompts
    rows = TeacherRows(list(range(len(paths))), ["c"] * len(paths), [[1]] * len(paths), [[2]] * len(paths), {},
                       paths)
    for by in ("prompt", "document"):
        tr, va = split_rows(rows, 20, by)
        assert sorted(tr.prompt_id + va.prompt_id) == rows.prompt_id and va.path is not None
        shared = set(tr.path) & set(va.path)
        assert (not shared) if by == "document" else shared                  # the prompt split leaks files
    tr, va = split_rows(rows, 20, "document")
    held = {zlib.crc32(q.encode()) % 100 < 20 for q in set(va.path)}
    assert held == {True} and len(va) % 4 == 0
    with pytest.raises(ValueError, match="records no source paths"):
        split_rows(TeacherRows(rows.prompt_id, rows.category, rows.prompt, rows.answer, {}), 20, "document")
    with pytest.raises(ValueError, match="valid: prompt, document"):
        split_rows(rows, 20, "file")
    from workbench.deer.train import DeerTrainConfig

    with pytest.raises(ValueError, match="valid: prompt, document"):
        DeerTrainConfig(split_by="file").validate()


# ---------------------------------------------------------------- tables
def test_by_category_pools_ratios_of_sums():
    rows = pd.DataFrame({"method": ["deer"] * 3, "category": ["a", "a", "b"], "tokens": [8, 8, 8],
                         "cycles": [2, 6, 4], "max_accepted": [5, 1, 3], "cycles_accept_ge8": [0, 0, 0],
                         "forwards": [2, 6, 4], "extra_forwards": [2, 6, 4], "cost_forwards": [2.5, 7.5, 5.0],
                         "wall_s": [1.0, 1.0, 2.0], "ar_wall_s": [3.0, 3.0, 2.0], "agree_ar": [1.0] * 3,
                         "repetition": [0.0] * 3})
    t = by_category(rows).set_index("category")
    assert t.loc["a", "tau"] == pytest.approx(16 / 8) and t.loc["all", "tau"] == pytest.approx(24 / 12)
    assert t.loc["a", "max_accepted"] == 5 and t.loc["a", "speedup"] == pytest.approx(3.0)
    assert t.loc["all", "tpf_real"] == pytest.approx(24 / 24) and t.loc["all", "tpf_cost"] == pytest.approx(24 / 15)


# ---------------------------------------------------------------- training (micro, seconds)
def test_train_deer_two_stages_micro(tmp_path, small_corpus, micro_checkpoint, tokenizer):
    from workbench.deer.train import DeerTrainConfig, train_deer
    from workbench.model.io import load_checkpoint, read_workbench_json

    cfg = TeacherConfig(target=str(micro_checkpoint), corpus=str(small_corpus), n_answers=24, prompt_len=24,
                        gen_len=12, batch_size=4, chunk_size=8, out_dir=str(tmp_path / "teacher"))
    generate_teacher(cfg, *load_checkpoint(micro_checkpoint)[:2])
    common = dict(teacher=str(tmp_path / "teacher"), batch_size=4, val_every=3, val_percent=30, warmup_steps=1,
                  checkpoint_every=3, progress_bar=False, accelerator="cpu")
    from conftest import stop_lightning_at

    with stop_lightning_at(3):                       # a run of 6 steps that stopped at step 3
        s1 = train_deer(DeerTrainConfig(stage=1, drafter_preset="micro", out_dir=str(tmp_path / "s1"), max_steps=6,
                                        **common))
    s1b = train_deer(DeerTrainConfig(stage=1, drafter_preset="micro", out_dir=str(tmp_path / "s1"), max_steps=6,
                                     **common))                                        # resumes at step 3
    assert read_workbench_json(s1b)["global_step"] == 6
    assert [p.parent.name for p in (tmp_path / "s1" / "logs").glob("version_*/metrics.csv")] == ["version_0"]
    s2 = train_deer(DeerTrainConfig(stage=2, drafter_init=str(s1), out_dir=str(tmp_path / "s2"), max_steps=3,
                                    alpha=1.05, **common))
    meta = read_workbench_json(s2)
    assert meta["deer_stage"] == 2 and meta["train_config"]["alpha"] == 1.05
    assert {"val/tau", "val/loss", "train/loss"} <= set(meta["final_metrics"])
    drafter, tok, _ = load_checkpoint(s2)
    check_shared_tokenizer(tokenizer, tok)
    target, _, _ = load_checkpoint(micro_checkpoint)
    prompts = _prompts([6, 9])
    ref = ar_decode(target, prompts, 12, pad_id=PAD).tokens
    assert deer_decode(target, drafter, prompts, 12, 4, pad_id=PAD).tokens == ref
    # evaluation: every table and figure, greedy DEER lossless against AR
    from workbench.deer.evaluate import DeerEvalConfig, run_deer_eval

    out = run_deer_eval(DeerEvalConfig(target=str(micro_checkpoint), drafter=str(s2), stage1_drafter=str(s1b),
                                       alpha_runs=[str(tmp_path / "s2")], corpus=str(small_corpus), n_prompts=3,
                                       prompt_len=24, gen_len=12, draft_length=4, batch_size=2, device="cpu",
                                       out_dir=str(tmp_path / "eval"), progress_bar=False))
    table = pd.read_parquet(out / "by_category.parquet")
    assert set(table["method"]) == {"ar", "deer", "deer_stage1", "linear_ss"}
    assert (table["agree_ar"] == 1.0).all() and (table.loc[table["method"] == "ar", "tau"] == 1.0).all()
    assert "delta_tau" in pd.read_parquet(out / "stage_table.parquet")
    assert pd.read_parquet(out / "alpha.parquet")["alpha"].tolist() == [1.05]
    assert (out / "alpha.png").is_file() and (out / "acceptance.png").is_file()
    assert not (tmp_path / "eval.partial").exists()


def test_train_deer_stage2_without_init_is_a_one_line_error(tmp_path, capsys):
    from workbench.cli import main

    assert main(["train", "deer", "--stage", "2", "--out_dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "drafter_init" in err and len(err.strip().splitlines()) == 1
    assert main(["deer", "teacher", "--split", "test", "--out_dir", str(tmp_path / "t")]) == 2
    assert "held out" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "t").exists()


def test_retrain_runs_the_recorded_commands_and_resumes(tmp_path, small_corpus, micro_checkpoint):
    """``deer retrain`` runs a shipped drafter's recorded commands (teacher, Stage I, Stage II), reports the
    retrained beside the shipped metrics, and a second run reuses every finished step (same drafter)."""
    import yaml

    from workbench.deer.retrain import DeerRetrainConfig, retrain_drafter
    from workbench.model.io import load_checkpoint

    t, s1, s2 = tmp_path / "teacher", tmp_path / "s1", tmp_path / "s2"
    common = dict(teacher=str(t), batch_size=4, val_every=3, val_percent=30, warmup_steps=1, checkpoint_every=3,
                  max_steps=3, progress_bar=False, accelerator="cpu")
    configs = {"teacher.yaml": dict(target=str(micro_checkpoint), corpus=str(small_corpus), n_answers=16,
                                    prompt_len=24, gen_len=8, batch_size=4, chunk_size=8, out_dir=str(t)),
               "stage1.yaml": dict(stage=1, drafter_preset="micro", out_dir=str(s1), **common),
               "stage2.yaml": dict(stage=2, drafter_init=str(s1 / "drafter"), out_dir=str(s2), **common)}
    for name, c in configs.items():
        (tmp_path / name).write_text(yaml.safe_dump(c))
    asset = tmp_path / "asset"
    asset.mkdir()
    record = {"commands": [f"workbench deer teacher --config {tmp_path / 'teacher.yaml'}",
                           f"workbench train deer --config {tmp_path / 'stage1.yaml'}",
                           f"workbench train deer --config {tmp_path / 'stage2.yaml'}"],
              "stages": {"stage1": {"run": str(s1), "metrics": {"val/tau": 1.5, "global_step": 3}},
                         "stage2": {"run": str(s2), "metrics": {"val/tau": 1.6, "global_step": 3}}}}
    (asset / "shipped.json").write_text(json.dumps(record))
    rows = retrain_drafter(DeerRetrainConfig(asset=str(asset)))
    assert [(r["stage"], r["retrained_steps"], r["shipped_val_tau"]) for r in rows] == [("stage1", 3, 1.5),
                                                                                        ("stage2", 3, 1.6)]
    assert all(r["retrained_val_tau"] >= 1.0 for r in rows)
    first = load_checkpoint(s2 / "drafter")[0].state_dict()
    logs = {s: (s / "logs" / "version_0" / "metrics.csv").read_text() for s in (s1, s2)}
    chunks = sorted(p.name for p in t.rglob("*.parquet"))
    assert chunks
    retrain_drafter(DeerRetrainConfig(asset=str(asset)))          # everything done: reused, not retrained
    again = load_checkpoint(s2 / "drafter")[0].state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    # no training step ran again (a rerun would log its steps) and no teacher chunk was regenerated
    assert {s: (s / "logs" / "version_0" / "metrics.csv").read_text() for s in (s1, s2)} == logs
    assert sorted(p.name for p in t.rglob("*.parquet")) == chunks
    assert json.loads((s2 / "metrics.json").read_text())["global_step"] == 3
    record["commands"].append("workbench sol --config x.yaml")          # refused before anything runs
    (asset / "shipped.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="not a DEER step; valid: deer teacher, train deer"):
        retrain_drafter(DeerRetrainConfig(asset=str(asset)))


def test_teacher_first_answers_the_rest_of_the_same_prompt_list(tmp_path, small_corpus, tokenizer):
    """``first = k`` answers prompts k, k+1, ... of the list a plain run answers (same ids, prompts and greedy
    answers); data written before ``first`` existed resumes as ``first = 0``."""
    from workbench.corpus import CorpusError

    target = _micro(0)
    full = generate_teacher(_teacher_cfg(tmp_path / "full", small_corpus, 10), target, tokenizer)
    cfg = _teacher_cfg(tmp_path / "rest", small_corpus, 6)
    cfg.first = 4
    rest = generate_teacher(cfg, target, tokenizer)
    ids, prompts, answers = _table(full)
    assert _table(rest) == (ids[4:], prompts[4:], answers[4:])
    assert load_teacher(rest).settings["first"] == 4
    cfg.first = 3                                   # another start is another data set
    with pytest.raises(ValueError, match="first: 4 vs 3"):
        generate_teacher(cfg, target, tokenizer)
    side = full / "teacher.json"                    # written before the field existed
    info = json.loads(side.read_text())
    del info["settings"]["first"]
    side.write_text(json.dumps(info))
    chunks = sorted(full.glob("chunk-*.parquet"))
    written = [c.stat().st_mtime_ns for c in chunks]
    generate_teacher(_teacher_cfg(tmp_path / "full", small_corpus, 10), target, tokenizer)
    assert [c.stat().st_mtime_ns for c in chunks] == written     # resumed: every chunk kept, none regenerated
    far = _teacher_cfg(tmp_path / "far", small_corpus, 2)
    far.first = 10_000
    with pytest.raises(CorpusError, match="none from first = 10000"):
        generate_teacher(far, target, tokenizer)
    assert not (tmp_path / "far").exists()           # nothing half-written
    with pytest.raises(ValueError, match="first must be >= 0"):
        TeacherConfig(first=-1).validate()


def test_teacher_tokens_are_prompt_answer_eos_rows_of_one_or_more_folders(tmp_path, small_corpus, tokenizer):
    """Self-distillation data (``train lm --train_data``): every row's prompt, answer and EOS, in chunk order; a list
    of folders gives them one after the other; an incomplete folder anywhere in the list is refused."""
    from workbench.cli_args import parse_dataclass
    from workbench.corpus import CorpusError
    from workbench.data import teacher_tokens
    from workbench.train.lm import LMTrainConfig

    target = _micro(0)
    a = generate_teacher(_teacher_cfg(tmp_path / "a", small_corpus, 5), target, tokenizer)
    cfg = _teacher_cfg(tmp_path / "b", small_corpus, 3)
    cfg.first = 5
    b = generate_teacher(cfg, target, tokenizer)
    eos = 7

    def expect(path):
        _, prompts, answers = _table(path)
        return [t for p, ans in zip(prompts, answers) for t in [*p, *ans, eos]]

    assert teacher_tokens(str(a), eos).tolist() == expect(a)
    both = teacher_tokens([str(a), str(b)], eos)
    assert both.dtype == np.int32 and both.tolist() == expect(a) + expect(b)
    whole = generate_teacher(_teacher_cfg(tmp_path / "whole", small_corpus, 8), target, tokenizer)
    assert both.tolist() == teacher_tokens(str(whole), eos).tolist()       # first = 5 continues the same list
    def interrupt(chunk_index):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):                           # stopped after its first chunk
        generate_teacher(_teacher_cfg(tmp_path / "cut", small_corpus, 10), target, tokenizer, on_chunk=interrupt)
    with pytest.raises(CorpusError, match="cut is incomplete"):
        teacher_tokens([str(a), str(tmp_path / "cut")], eos)
    with pytest.raises(CorpusError, match="empty list"):
        teacher_tokens([], eos)
    one = parse_dataclass("t", LMTrainConfig, ["--train_data", str(a)])
    two = parse_dataclass("t", LMTrainConfig, ["--train_data", f"[{a}, {b}]"])
    assert one.train_data == str(a) and two.train_data == [str(a), str(b)]
