"""Sequence-level unlikelihood (Welleck et al. 2020): candidate mask, hand-computed loss values, and the
training step that uses it."""
import math

import pytest
import torch

from workbench.model.unlikelihood import repeated_ngram_mask, unlikelihood_loss
from workbench.train.lm import LMTrainConfig, unlikelihood_step
from workbench.utils import step_generator


def test_repeated_ngram_mask_by_hand():
    # bigrams of a b a b c: (a b) (b a) (a b)* (b c) -> the second "a b" (positions 2, 3) repeats
    toks = torch.tensor([[1, 2, 1, 2, 3], [7, 7, 7, 7, 8]])
    m = repeated_ngram_mask(toks, 2)
    assert m.tolist() == [[False, False, True, True, False],
                          # (7 7) seen at 0, again at 1 and 2 (overlapping, as repetition_rate counts them)
                          [False, True, True, True, False]]
    assert not repeated_ngram_mask(torch.tensor([[1, 2, 3, 4]]), 1).any()
    # skipped ids (whitespace) are never marked, the rest of a repeated n-gram still is
    assert repeated_ngram_mask(toks, 2, frozenset({2, 7})).tolist() == [[False, False, True, False, False],
                                                                       [False] * 5]
    with pytest.raises(ValueError, match="n-gram length"):
        repeated_ngram_mask(toks, 0)


def test_unlikelihood_loss_hand_computed():
    # one row, vocabulary 2; probabilities of the target: 0.5, 0.9, 0.2
    p = torch.tensor([0.5, 0.9, 0.2])
    logits = torch.stack([torch.log(1 - p), torch.log(p)], -1)[None]          # (1, 3, 2), target id 1
    targets = torch.ones(1, 3, dtype=torch.long)
    cand = torch.tensor([[True, True, False]])
    valid = torch.tensor([[True, True, True]])
    expected = (-math.log(0.5) - math.log(0.1)) / 3                          # candidates only, / valid count
    assert float(unlikelihood_loss(logits, targets, cand, valid)) == pytest.approx(expected, rel=1e-5)
    # candidates outside `valid` do not count; nothing valid -> 0
    assert float(unlikelihood_loss(logits, targets, cand, torch.tensor([[False, True, True]]))) == \
        pytest.approx(-math.log(0.1) / 2, rel=1e-5)
    assert float(unlikelihood_loss(logits, targets, cand, torch.zeros_like(valid))) == 0.0
    # p -> 1 stays finite (1 - p floored at eps)
    sure = torch.tensor([[[-30.0, 30.0]]])
    assert float(unlikelihood_loss(sure, torch.ones(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool),
                                   torch.ones(1, 1, dtype=torch.bool))) == pytest.approx(-math.log(1e-5), rel=1e-4)


def test_ul_config_validation():
    with pytest.raises(ValueError, match="ul_prob"):
        LMTrainConfig(ul_prob=1.5).validate()
    with pytest.raises(ValueError, match="must divide ul_prefix_len"):
        LMTrainConfig(ul_prob=0.5, ul_prefix_len=100, ul_gen_len=100).validate()
    with pytest.raises(ValueError, match="ul_gen_len ≥ ul_ngram"):
        LMTrainConfig(ul_prob=0.5, ul_gen_len=4, ul_ngram=8, block_lengths=[4]).validate()
    LMTrainConfig(ul_prob=0.5).validate()


def _looping_model():
    """A micro TriModeLM trained for a few steps on one repeated pattern, so greedy decoding loops."""
    from transformers import LlamaForCausalLM

    from workbench.model.presets import preset_config
    from workbench.model.trimode import TriModeLM
    from workbench.tokenizer import MASK_ID

    torch.manual_seed(0)
    model = TriModeLM(LlamaForCausalLM(preset_config("micro")), MASK_ID)
    data = torch.tensor([[ord(c) for c in ("abcd" * 16)]] * 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model.causal_logits(data)[:, :-1].flatten(0, 1), data[:, 1:].flatten())
        opt.zero_grad(); loss.backward(); opt.step()
    return model, data


def _loop_probability(model, seq, prefix):
    """Mean probability of the continuation ``seq[:, prefix:]`` under AR mode and under diffusion mode
    (continuation fully masked, block length = its length)."""
    with torch.no_grad():
        p_ar = torch.softmax(model.causal_logits(seq)[:, prefix - 1:-1].float(), -1)
        p_ar = p_ar.gather(-1, seq[:, prefix:, None]).mean()
        noisy = seq.clone()
        noisy[:, prefix:] = model.mask_token_id
        _, diff = model.dual_stream_logits(seq, noisy, seq.shape[1] - prefix)
        p_diff = torch.softmax(diff[:, prefix:].float(), -1).gather(-1, seq[:, prefix:, None]).mean()
    return float(p_ar), float(p_diff)


def test_unlikelihood_steps_lower_probability_of_repeats():
    """A few gradient steps on the UL loss lower the probability of the looped continuation in both modes,
    and each step decodes, marks and scores the continuation as documented."""
    model, data = _looping_model()
    cfg = LMTrainConfig(seq_len=64, block_lengths=[16], ul_prob=1.0, ul_prefix_len=16, ul_gen_len=16, ul_ngram=4,
                        precision="32-true")
    cfg.validate()
    loop = data[:, :32]                                  # prompt "abcd"*4 + the looped continuation "abcd"*4
    ar0, diff0 = _loop_probability(model, loop, 16)
    loss0, logs0 = unlikelihood_step(model, data, cfg, step_generator(0, 0, 4))
    # the model continues the loop: 12 of the 16 generated tokens lie in a repeated 4-gram
    assert logs0["train/ul_repeat_share"] == pytest.approx(12 / 16) and ar0 > 0.5
    assert loss0.item() == pytest.approx(logs0["train/ul_ar"] + logs0["train/ul_diff"], rel=1e-5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(5):
        loss, _ = unlikelihood_step(model, data, cfg, step_generator(0, i, 4))
        opt.zero_grad(); loss.backward(); opt.step()
    ar1, diff1 = _loop_probability(model, loop, 16)
    assert ar1 < ar0 and diff1 < diff0
