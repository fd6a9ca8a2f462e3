"""The warm-up + cosine learning-rate multiplier shared by every trainer (workbench/train/schedule.py)."""
import math

import pytest
import torch

from workbench.schedule import optimizer_config, warmup_cosine


def test_warmup_cosine_hand_values():
    f = warmup_cosine(warmup_steps=4, max_steps=14, min_lr_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)  # cosine starts at its peak
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way: cos(pi/2) = 0
    assert f(14) == pytest.approx(0.1)
    assert f(1000) == pytest.approx(0.1)  # held at the floor past max_steps
    after = [f(s) for s in range(4, 15)]
    assert all(a >= b for a, b in zip(after, after[1:]))


def test_no_warmup_starts_on_the_cosine():
    f = warmup_cosine(warmup_steps=0, max_steps=10, min_lr_ratio=0.0)
    assert f(0) == pytest.approx(1.0)
    assert f(5) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(10) == pytest.approx(0.0)


@pytest.mark.parametrize("kwargs", [dict(warmup_steps=-1, max_steps=10, min_lr_ratio=0.1),
                                    dict(warmup_steps=2, max_steps=10, min_lr_ratio=1.5)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        warmup_cosine(**kwargs)


def test_optimizer_config_steps_the_learning_rate():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=2.0)
    cfg = optimizer_config(opt, warmup_steps=2, max_steps=4, min_lr_ratio=0.5)
    assert cfg["lr_scheduler"]["interval"] == "step"
    sched = cfg["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1.0, 2.0, 2.0, 1.5, 1.0])
