"""Loss values against hand-computed examples (NLD Eq. 1–5)."""
import math

import pytest
import torch

from workbench.model.losses import ar_loss, diffusion_loss, joint_loss
from workbench.model.noise import mask_blocks


def _logits_with_probs(p):
    """Logits whose softmax is exactly ``p`` (..., V)."""
    return torch.log(torch.tensor(p, dtype=torch.float32))


def test_ar_loss_hand_computed():
    # one sequence [0, 1, 1]; position 0 predicts 1 with p=0.5, position 1 predicts 1 with p=0.25
    logits = _logits_with_probs([[[0.5, 0.5], [0.75, 0.25], [0.5, 0.5]]])
    ids = torch.tensor([[0, 1, 1]])
    expected = (-math.log(0.5) - math.log(0.25)) / 2
    assert ar_loss(logits, ids).item() == pytest.approx(expected, rel=1e-6)


def test_diffusion_loss_weights_by_inverse_t_and_ignores_unmasked():
    # 1 sequence, 4 positions, masked at 0 and 2; t = 0.5 for block 0 (pos 0,1), 0.25 for block 1 (pos 2,3)
    probs = [[[0.8, 0.2], [0.5, 0.5], [0.1, 0.9], [0.5, 0.5]]]
    logits = _logits_with_probs(probs)
    ids = torch.tensor([[0, 1, 1, 0]])
    masked = torch.tensor([[True, False, True, False]])
    t = torch.tensor([[0.5, 0.5, 0.25, 0.25]])
    l0, l2 = -math.log(0.8) / 0.5, -math.log(0.9) / 0.25
    assert diffusion_loss(logits, ids, masked, t).item() == pytest.approx((l0 + l2) / 2, rel=1e-6)
    # changing logits at unmasked positions changes nothing
    logits2 = logits.clone()
    logits2[0, 1] = torch.tensor([5.0, -5.0])
    logits2[0, 3] = torch.tensor([-3.0, 3.0])
    assert diffusion_loss(logits2, ids, masked, t).item() == pytest.approx((l0 + l2) / 2, rel=1e-6)


def test_global_vs_sequence_averaging_eq4_eq5():
    # two sequences: seq A has 1 masked token with loss a, seq B has 3 masked tokens with losses b1..b3
    p = [[[0.5, 0.5]] * 4, [[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.5, 0.5]]]
    logits = _logits_with_probs(p)
    ids = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 0]])
    masked = torch.tensor([[True, False, False, False], [True, True, True, False]])
    t = torch.ones(2, 4)
    a = -math.log(0.5)
    b = [-math.log(0.9), -math.log(0.6), -math.log(0.7)]
    glob = (a + sum(b)) / 4                      # Eq. 5: every contributing token weighs the same
    seq = (a / 1 + sum(b) / 3) / 2               # Eq. 4: average within sequence, then over sequences
    assert diffusion_loss(logits, ids, masked, t, "global").item() == pytest.approx(glob, rel=1e-6)
    assert diffusion_loss(logits, ids, masked, t, "sequence").item() == pytest.approx(seq, rel=1e-6)
    assert glob != pytest.approx(seq)
    with pytest.raises(ValueError, match="valid: global, sequence"):
        diffusion_loss(logits, ids, masked, t, "token")


def test_joint_loss_eq3():
    assert joint_loss(torch.tensor(2.0), torch.tensor(10.0), 0.3).item() == pytest.approx(5.0)
    assert joint_loss(torch.tensor(2.0), torch.tensor(10.0), 0.0).item() == pytest.approx(2.0)


def test_mask_blocks_per_block_noise_level():
    g = torch.Generator().manual_seed(0)
    clean = torch.arange(64).repeat(200, 1) % 250
    noisy, masked, t = mask_blocks(clean, 16, 256, 1e-3, g)
    # t is constant inside each block and masked positions hold the mask token
    assert torch.equal(t.view(200, 4, 16), t.view(200, 4, 16)[..., :1].expand(-1, -1, 16))
    assert (noisy[masked] == 256).all() and torch.equal(noisy[~masked], clean[~masked])
    # masking rate tracks t (law of large numbers over 12800 positions)
    assert abs(masked.float().mean().item() - t.mean().item()) < 0.02
    with pytest.raises(ValueError, match="divide"):
        mask_blocks(clean, 12, 256)


def test_mask_blocks_per_sequence_noise_level_is_nld_eq2():
    """NLD Eq. 2 draws one t per sequence: t is constant along each row, and the masked count per row spreads
    far more than with one t per block (the case §2.1 makes for global averaging)."""
    clean = torch.arange(256).repeat(400, 1) % 250
    _, masked_s, t_s = mask_blocks(clean, 16, 256, 1e-3, torch.Generator().manual_seed(0), per="sequence")
    _, masked_b, _ = mask_blocks(clean, 16, 256, 1e-3, torch.Generator().manual_seed(0), per="block")
    assert torch.equal(t_s, t_s[:, :1].expand_as(t_s)) and len(t_s[:, 0].unique()) == 400
    assert abs(masked_s.float().mean().item() - t_s.mean().item()) < 0.02
    cv = [m.sum(1).float().std().item() / m.sum(1).float().mean().item() for m in (masked_s, masked_b)]
    assert cv[0] > 0.45 and cv[1] < 0.25          # U(0, 1): 0.58 per sequence; about 0.58/sqrt(16) per block
    with pytest.raises(ValueError, match="valid: sequence, block"):
        mask_blocks(clean, 16, 256, per="window")
