"""Training on several devices (issue 24 §3): the global-batch rule, rank sharding, DDP on CPU (gloo) against
one process, resume across device counts, gradient accumulation, and the refusals."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DistributedSampler

from conftest import run_cli
from workbench.distributed import batch_plan
from workbench.model.losses import diffusion_loss
from workbench.model.noise import mask_blocks


def test_batch_plan_rule_and_errors():
    p = batch_plan(16, 2)
    assert (p.per_device, p.world, p.accumulate) == (8, 2, 1)
    p = batch_plan(16, 2, micro_batch_size=2)
    assert (p.per_device, p.accumulate) == (2, 4) and p.per_device * p.world * p.accumulate == 16
    with pytest.raises(ValueError, match="global batch 8 is not divisible by the world size 3"):
        batch_plan(8, 3)
    with pytest.raises(ValueError, match="micro_batch_size 3 × world size 2 = 6"):
        batch_plan(16, 2, micro_batch_size=3)


def test_plan_rows_are_the_distributed_sampler_order():
    """A DistributedSampler without shuffling deals each rank the items r, r + W, ... of each step's global
    batch, forward by forward; the ranks' rows of a step partition it; and BatchPlan.micro_step, which train lm's
    logging uses, recovers the forward from its first row."""
    plan = batch_plan(12, 3, micro_batch_size=2)                 # accumulate 2
    n_steps = 3
    ds = list(range(n_steps * plan.global_batch))
    seen = {}
    for rank in range(plan.world):
        order = list(DistributedSampler(ds, num_replicas=plan.world, rank=rank, shuffle=False))
        for k in range(n_steps * plan.accumulate):               # forward k of this rank
            step, micro = divmod(k, plan.accumulate)
            items = order[k * plan.per_device:(k + 1) * plan.per_device]
            j = micro * plan.per_device + torch.arange(plan.per_device)
            rows = rank + plan.world * j                         # rank r's items: r, r + W, r + 2W, ...
            assert [i - step * plan.global_batch for i in items] == rows.tolist()
            assert plan.micro_step(rank, items[0] - step * plan.global_batch) == micro
            for i in items:
                assert i not in seen
                seen[i] = rank
    assert sorted(seen) == ds                                    # every item read exactly once


@pytest.mark.parametrize("averaging", ["global", "sequence"])
def test_diffusion_loss_shares_sum_to_the_global_batch_loss(averaging):
    """NLD Eq. 4/5 on shards: the shares of a global batch's shards, computed with the global masks, sum to
    the loss of the whole batch (value and gradient), although the shards hold different counts of masked
    tokens (Eq. 5) and of sequences with any (Eq. 4)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 11, (6, 16), generator=g)
    logits = torch.randn(6, 16, 11, generator=g, requires_grad=True)
    noisy, masked, t = mask_blocks(x, 4, 10, 1e-3, torch.Generator().manual_seed(1))
    masked[0] = False              # a sequence without masked tokens: Eq. 4's N' then differs per shard
    whole = diffusion_loss(logits, x, masked, t, averaging=averaging)
    (gw,) = torch.autograd.grad(whole, logits)
    shards = [torch.tensor([0, 3]), torch.tensor([1, 4]), torch.tensor([2, 5])]
    parts = [diffusion_loss(logits[r], x[r], masked[r], t[r], averaging=averaging, total_masked=masked)
             for r in shards]
    assert len({int(masked[r].sum()) for r in shards}) > 1       # unequal counts: a plain mean of means would differ
    total = sum(parts)
    (gs,) = torch.autograd.grad(total, logits)
    torch.testing.assert_close(total, whole)
    torch.testing.assert_close(gs, gw)
    naive = sum(diffusion_loss(logits[r], x[r], masked[r], t[r], averaging=averaging) for r in shards) / 3
    assert abs(float(naive - whole)) > 1e-4


# ------------------------------------------------------------------------------------- train lm on CPU / gloo
ARGS = ["--config", "workbench/configs/micro.yaml", "--progress_bar", "false", "--max_steps", "20",
        "--stage1_steps", "10", "--val_every", "100", "--precision", "32-true", "--log_every_n_steps", "1",
        "--accelerator", "cpu"]
#: the stated tolerance of "the same loss curve": float32 reductions in another order (gloo all-reduce)
LOSS_ATOL = 1e-5


def _train(corpus, out, *extra):
    p = run_cli("train", "lm", *ARGS, "--corpus", str(corpus), "--out_dir", str(out), *extra,
                env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def _losses(run) -> pd.Series:
    log = pd.read_csv(run / "model" / "training_log.csv").dropna(subset=["train/loss"])
    return log.set_index("step")["train/loss"]


def _max_weight_diff(a, b) -> float:
    from workbench.model.io import load_checkpoint

    ma, mb = load_checkpoint(a / "model")[0], load_checkpoint(b / "model")[0]
    return max(float((pa - pb).abs().max()) for pa, pb in zip(ma.state_dict().values(), mb.state_dict().values()))


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, small_corpus):
    return _train(small_corpus, tmp_path_factory.mktemp("one") / "run")


def test_ddp_two_processes_equal_one_process(tmp_path, small_corpus, one_device):
    """Two gloo processes at the same global batch (4 windows each) give one process's loss curve for 20
    steps (10 AR steps, then 10 joint AR + diffusion steps whose noise and Eq. 5 normaliser are global),
    and the same weights."""
    two = _train(small_corpus, tmp_path / "two", "--devices", "2", "--strategy", "ddp")
    a, b = _losses(one_device), _losses(two)
    assert list(a.index) == list(b.index) == list(range(20))
    np.testing.assert_allclose(b.to_numpy(), a.to_numpy(), rtol=0, atol=LOSS_ATOL)
    assert _max_weight_diff(one_device, two) < 1e-5
    cfg = (two / "config.yaml").read_text()
    assert "devices: 2" in cfg and "strategy: ddp" in cfg


def test_resume_two_devices_on_one(tmp_path, small_corpus, one_device):
    """A run started on two devices and stopped at step 14 resumes on one device with the next losses (and
    the final weights) of the uninterrupted one-device run; the log is one across both legs."""
    run = tmp_path / "leg"
    _train(small_corpus, run, "--devices", "2", "--strategy", "ddp", "--stop_at_step", "14",
           "--checkpoint_every", "7")
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 14
    _train(small_corpus, run, "--checkpoint_every", "7")
    a, b = _losses(one_device), _losses(run)
    assert list(b.index) == list(range(20))
    np.testing.assert_allclose(b.to_numpy(), a.to_numpy(), rtol=0, atol=LOSS_ATOL)
    assert _max_weight_diff(one_device, run) < 1e-5


def test_gradient_accumulation_equals_the_full_batch(tmp_path, small_corpus, one_device):
    """micro_batch_size 2 (four accumulated forwards per step) logs the same per-step loss and reaches the
    same weights as the full batch of 8."""
    acc = _train(small_corpus, tmp_path / "acc", "--micro_batch_size", "2")
    np.testing.assert_allclose(_losses(acc).to_numpy(), _losses(one_device).to_numpy(), rtol=0, atol=LOSS_ATOL)
    assert _max_weight_diff(one_device, acc) < 1e-5


def test_resume_with_another_accumulation_is_refused(cli, tmp_path, small_corpus):
    """Lightning counts the forwards it restores, so a run resumed with another gradient accumulation would
    start a step part-way through its global batch: refused in one line, naming the micro_batch_size to use."""
    run = tmp_path / "run"
    _train(small_corpus, run, "--stop_at_step", "7", "--checkpoint_every", "7")
    p = cli("train", "lm", *ARGS, "--corpus", str(small_corpus), "--out_dir", str(run), "--checkpoint_every", "7",
            "--micro_batch_size", "2")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "written with gradient accumulation 1 and this run would use 4" in p.stderr
    assert "micro_batch_size = batch_size / (devices × num_nodes × 1) = 8" in p.stderr


@pytest.mark.parametrize("extra,message", [
    (["--devices", "3"], "global batch 8 is not divisible by the world size 3"),
    (["--micro_batch_size", "3"], "global batch 8 is not a multiple of micro_batch_size 3"),
    (["--accelerator", "gpu", "--devices", "2"], "gpu"),
    (["--strategy", "horovod"], "unknown strategy 'horovod'"),
])
def test_bad_device_settings_fail_before_any_output(cli, tmp_path, small_corpus, extra, message):
    out = tmp_path / "run"
    p = cli("train", "lm", *ARGS, "--corpus", str(small_corpus), "--out_dir", str(out), *extra)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.startswith("workbench")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in p.stderr
    assert not out.exists()


@pytest.mark.gpu
def test_fsdp_needs_a_gpu():
    """FSDP: Lightning 2.6 refuses ``strategy='fsdp'`` with ``accelerator='cpu'`` ("requires a GPU
    accelerator"), so its equivalence with one device can only run where CUDA is; this test is a GPU test."""
    if not torch.cuda.is_available():
        pytest.skip("FSDP needs CUDA in Lightning")
    from workbench.distributed import DeviceConfig, make_trainer

    trainer, plan = make_trainer(DeviceConfig(accelerator="gpu", devices=1, strategy="fsdp"), 8)
    assert plan.accumulate == 1 and type(trainer.strategy).__name__ == "FSDPStrategy"
