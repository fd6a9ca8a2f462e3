"""The confidence sampler (NLD App. A): loss, network shape, streaming store data, training, save / load, resume."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from workbench.sampler import (SamplerError, SamplerNet, count_parameters, load_sampler, masked_bce, sampler_preset,
                               save_sampler)
from workbench.sampler.data import SamplerDataModule, StoreRowStream, check_store_matches
from workbench.trajectories import ShardWriter, StoreError, StoreReader, create_store
from workbench.trajectories.features import feature_spec

V = 50


def synth_item(item: int, B: int, t: int = 8):
    """``t`` trajectories whose label is learnable: label = (top-1 prob + noise > 0.5), and top-1 id = final id
    exactly where the label is 1 (so the store is consistent, as ``verify_store`` demands)."""
    rng = np.random.default_rng(item)
    steps = rng.integers(1, B + 1, t)
    traj = np.repeat(np.arange(t), steps)
    step = np.concatenate([np.arange(s) for s in steps])
    n = len(traj)
    p1 = rng.random((n, B))
    p2 = rng.random((n, B)) * (1 - p1)
    p3 = rng.random((n, B)) * (1 - p1 - p2)
    label = p1 + 0.15 * rng.standard_normal((n, B)) > 0.5
    final = rng.integers(0, V, (t, B)).astype(np.int32)
    top = rng.integers(0, V, (n, B, 3)).astype(np.int32)
    top[..., 0] = np.where(label, final[traj], (final[traj] + 1) % V)
    rows = {"top_ids": top, "top_probs": np.stack([p1, p2, p3], -1), "entropy": rng.random((n, B)) * 3,
            "masked": rng.random((n, B)) < (1 - step / steps[traj])[:, None], "label": label, "traj": traj,
            "step": step}
    trajs = {"prompt_id": item * t + np.arange(t), "category": np.zeros(t), "block_index": np.zeros(t),
             "final_ids": final}
    return rows, trajs


def make_store(path, B: int = 8, items: int = 20, shards: int = 2, fingerprint: str = "m1"):
    attrs = {"model_fingerprint": fingerprint, "tokenizer_hash": "t1", "policy": "serial",
             "feature_spec": feature_spec(144), "categories": ["code"]}
    create_store(path, attrs, [B], token_pca=np.random.default_rng(0).standard_normal((V, 44)))
    for r in range(shards):
        with ShardWriter(path, B, rank=r, rows_per_chunk=64, traj_per_chunk=16) as w:
            for i in range(r, items, shards):
                w.append(i, *synth_item(i, B))
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("sampler") / "s.zarr")


# ------------------------------------------------------------------------------------------------------ loss
def test_masked_bce_ignores_unmasked_and_matches_hand_value():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]], requires_grad=True)
    labels = torch.tensor([[True, False, True], [False, True, True]])
    masked = torch.tensor([[True, True, False], [False, True, False]])
    loss = masked_bce(logits, labels, masked)
    sp = lambda x: float(np.log1p(np.exp(x)))  # noqa: E731  softplus
    hand = (sp(-2.0) + sp(-1.0) + sp(-3.0)) / 3  # BCE = softplus(-z) for label 1, softplus(z) for label 0
    assert float(loss) == pytest.approx(hand, rel=1e-6)
    other = logits.detach().clone()
    other[~masked] = torch.tensor([-9.0, 7.0, 100.0])
    assert float(masked_bce(other, labels ^ ~masked, masked)) == pytest.approx(float(loss), rel=1e-6)
    loss.backward()
    assert torch.all(logits.grad[~masked] == 0)
    zero = masked_bce(logits, labels, torch.zeros_like(masked))
    assert float(zero) == 0.0 and zero.requires_grad
    full = masked_bce(logits, labels, torch.ones_like(masked))
    assert float(full) == pytest.approx(float(F.binary_cross_entropy_with_logits(logits, labels.float())))


# --------------------------------------------------------------------------------------------------- network
def test_default_preset_has_paper_size():
    n = count_parameters(SamplerNet(sampler_preset("default")))
    assert abs(n - 4.8e6) / 4.8e6 < 0.1, n  # NLD App. A: 4.8 M
    assert count_parameters(SamplerNet(sampler_preset("micro"))) < 50_000
    with pytest.raises(SamplerError, match="valid: default, micro"):
        sampler_preset("huge")


@pytest.mark.parametrize("kind", ["attention", "mlp"])
def test_cross_position_mixing_only_with_attention(kind):
    torch.manual_seed(0)
    net = SamplerNet(sampler_preset("micro", kind=kind)).eval()
    x = torch.randn(2, 8, 144)
    y = x.clone()
    y[:, 3] += 1.0
    a, b = net(x), net(y)
    assert a.shape == (2, 8)
    assert not torch.allclose(a[:, 3], b[:, 3])
    others = [j for j in range(8) if j != 3]
    mixes = not torch.allclose(a[:, others], b[:, others], atol=1e-6)
    assert mixes == (kind == "attention")
    # the same features at two positions differ only through the position embedding
    z = torch.randn(1, 1, 144).expand(1, 8, 144).contiguous()
    assert not torch.allclose(net(z)[0, 0], net(z)[0, 5])
    with torch.no_grad():
        net.pos.weight.zero_()
    assert torch.allclose(net(z)[0], net(z)[0, :1].expand(8), atol=1e-5)


def test_save_load_errors(tmp_path):
    net = SamplerNet(sampler_preset("micro")).eval()
    d = save_sampler(net, net.cfg, tmp_path / "s", {"model_fingerprint": "m1"})
    net2, cfg2, meta = load_sampler(d)
    x = torch.randn(3, 8, 144)
    assert torch.equal(net(x), net2(x)) and cfg2 == net.cfg and meta == {"model_fingerprint": "m1"}
    with pytest.raises(SamplerError, match="no sampler directory"):
        load_sampler(tmp_path / "nope")
    (d / "sampler.json").write_text("{not json")
    with pytest.raises(SamplerError, match="corrupt") as e:
        load_sampler(d)
    assert "\n" not in str(e.value)
    (d / "sampler.json").write_text(json.dumps({"config": {**net.cfg.__dict__, "d_model": 64}}))
    with pytest.raises(SamplerError, match="does not match"):
        load_sampler(d)


# ------------------------------------------------------------------------------------------------------ data
def _rows(loader):
    return np.concatenate([b["row"].numpy() for b in loader])


def test_datamodule_every_row_once_per_epoch(store):
    dm = SamplerDataModule(store, 8, batch_size=16, val_fraction=0.3, split_by="traj", num_workers=2,
                           block_rows=64, buffer_blocks=2)
    reader = StoreReader(store, 8)
    assert len(reader.shard_names) == 2
    traj = reader.read_row_range(0, reader.n_rows)["traj"]
    train_rows, val_rows = np.flatnonzero(~dm.val_traj[traj]), np.flatnonzero(dm.val_traj[traj])
    loader = dm.train_dataloader()
    e0, e1 = _rows(loader), _rows(loader)
    for e in (e0, e1):
        assert len(e) == len(train_rows) and np.array_equal(np.sort(e), train_rows)
    assert not np.array_equal(e0, e1)  # a new shuffle each epoch
    v = _rows(dm.val_dataloader())
    assert len(v) == len(val_rows) and np.array_equal(np.sort(v), val_rows)
    assert not set(traj[e0]) & set(traj[v]) and len(e0) + len(v) == reader.n_rows
    assert dm.n_train_rows == len(train_rows) and dm.n_val_rows == len(val_rows)
    b = next(iter(loader))
    assert b["features"].shape == (16, 8, 144) and b["features"].dtype == torch.float32
    assert b["masked"].dtype == torch.bool and b["label"].dtype == torch.bool and b["top1_prob"].shape == (16, 8)
    np.testing.assert_allclose(b["top1_prob"].numpy(), b["features"][..., 132].numpy())


def test_ddp_ranks_disjoint_and_equal_batches(store):
    dm = SamplerDataModule(store, 8, batch_size=16, val_fraction=0.3, block_rows=64, buffer_blocks=1)
    per_rank = []
    for rank in (0, 1):
        ds = StoreRowStream(store, 8, ~dm.val_traj, dm._counts["train"], 16, 144, shuffle=True, block_rows=64,
                            buffer_blocks=1, rank=rank, world_size=2, equalize=True)
        per_rank.append([b["row"].numpy() for b in ds])
    assert len(per_rank[0]) == len(per_rank[1])
    r0, r1 = (np.concatenate(p) for p in per_rank)
    assert not set(r0) & set(r1) and dm.n_train_rows - 2 * 16 < len(r0) + len(r1) <= dm.n_train_rows


def test_document_split_keeps_each_file_on_one_side(tmp_path):
    """``split_by='document'``: every prompt cut from one source file (the store's ``prompt_document``) lands on the
    same side; a store that records no documents is refused in one line; ``record_prompt_documents`` is a
    no-op for the same record, grows for a longer one and refuses a different one."""
    from workbench.trajectories.store import record_prompt_documents

    path = make_store(tmp_path / "d.zarr", items=12)
    with pytest.raises(StoreError, match="split_by prompt"):
        SamplerDataModule(path, 8, batch_size=16, val_fraction=0.3, split_by="document")
    n_prompts = 12 * 8
    docs = np.arange(n_prompts, dtype=np.int64) // 6 * 7919          # 6 cuts per file
    record_prompt_documents(path, docs[:48])
    record_prompt_documents(path, docs)                               # a larger plan grows the record
    record_prompt_documents(path, docs[:10])                          # a prefix: nothing to do
    np.testing.assert_array_equal(StoreReader(path, 8).prompt_documents, docs)
    with pytest.raises(StoreError, match="other source files"):
        record_prompt_documents(path, docs + 1)
    dm = SamplerDataModule(path, 8, batch_size=16, val_fraction=0.3, split_by="document")
    trajs = StoreReader(path, 8).trajectories()
    side = dict()
    for doc, val in zip(docs[trajs["prompt_id"].to_numpy()], dm.val_traj):
        assert side.setdefault(int(doc), bool(val)) == bool(val)
    assert set(side.values()) == {True, False}
    by_prompt = SamplerDataModule(path, 8, batch_size=16, val_fraction=0.3, split_by="prompt").val_traj
    assert not np.array_equal(by_prompt, dm.val_traj)                 # prompts of one file split apart there
    # stores read together: the longer record, when the other is its prefix; one without a record → none
    other = make_store(tmp_path / "e.zarr", items=12, shards=1)
    record_prompt_documents(other, docs[:30])
    np.testing.assert_array_equal(StoreReader([other, path], 8).prompt_documents, docs)
    assert StoreReader([path, make_store(tmp_path / "f.zarr", items=4, shards=1)], 8).prompt_documents is None
    bad = make_store(tmp_path / "g.zarr", items=4, shards=1)
    record_prompt_documents(bad, docs[:30] + 1)
    with pytest.raises(StoreError, match="other source files"):
        StoreReader([path, bad], 8)


def test_store_mismatch_errors(store):
    with pytest.raises(StoreError, match="feature_dim 144.*feature_dim 132") as e:
        SamplerDataModule(store, 8, feature_dim=132)
    assert "\n" not in str(e.value)
    with pytest.raises(StoreError, match="was collected with model m1, not m2; collect a store for this model"):
        SamplerDataModule(store, 8, model_fingerprint="m2")
    check_store_matches({"model_fingerprint": "m1", "feature_spec": feature_spec(144)}, "m1", 144)
    with pytest.raises(StoreError, match="no trajectory store"):
        SamplerDataModule(store.parent / "nope", 8)


def test_two_stores_read_as_one_dataset(tmp_path):
    """A second store of the same model (NLD App. A's second trajectory policy) follows the first: rows and
    trajectories keep their content with ids shifted by the first store's counts; the data workers read the
    snapshot the held-out split was made on while a store grows; stores given twice, of other prompt plans (split by
    prompt) or of another model are refused in one line."""
    import zarr

    store = make_store(tmp_path / "serial.zarr", items=8, shards=2)
    other = make_store(tmp_path / "hybrid.zarr", items=6, shards=1)
    zarr.open_group(other, mode="r+").update_attributes({"policy": "hybrid"})
    a, b, both = StoreReader(store, 8), StoreReader(other, 8), StoreReader([store, other], 8)
    assert (both.n_rows, both.n_traj) == (a.n_rows + b.n_rows, a.n_traj + b.n_traj)
    assert both.attrs["policy"] == "serial+hybrid" and both.attrs["stores"] == [str(store), str(other)]
    tail = both.read_rows(np.arange(a.n_rows, both.n_rows))
    own = b.read_rows(np.arange(b.n_rows))
    for k, v in own.items():
        assert np.array_equal(tail[k], v + (a.n_traj if k == "traj" else 0)), k
    df, df_b = both.trajectories(), b.trajectories()
    assert np.array_equal(df["row_start"].to_numpy()[a.n_traj:], df_b["row_start"].to_numpy() + a.n_rows)
    assert df["store"].tolist() == [0] * a.n_traj + [1] * b.n_traj
    assert np.array_equal(both.final_ids()[a.n_traj:], b.final_ids())
    dm = SamplerDataModule([store, other], 8, batch_size=16, val_fraction=0.3, block_rows=64)
    assert dm.val_traj[a.n_traj:].any() and dm.n_train_rows + dm.n_val_rows == both.n_rows
    # the data workers read the snapshot the split was made on, though the first store grows meanwhile
    with ShardWriter(store, 8, rank=0, rows_per_chunk=64, traj_per_chunk=16) as w:
        w.append(99, *synth_item(99, 8))
    assert StoreReader([store, other], 8).n_traj > both.n_traj
    train = _rows(dm.train_dataloader())
    held_out = dm.val_traj[both.read_rows(np.arange(both.n_rows))["traj"]]
    assert np.array_equal(np.sort(train), np.flatnonzero(~held_out))
    with pytest.raises(StoreError, match="given twice"):
        StoreReader([store, store], 8)
    plan = make_store(tmp_path / "plan.zarr", items=2, shards=1)
    zarr.open_group(plan, mode="r+").update_attributes({"context_len": 64})
    with pytest.raises(StoreError, match=r"different prompt plans \(context_len"):
        SamplerDataModule([store, plan], 8, batch_size=16, val_fraction=0.3)
    SamplerDataModule([store, plan], 8, batch_size=16, val_fraction=0.3, split_by="traj")
    foreign = make_store(tmp_path / "foreign.zarr", items=2, shards=1, fingerprint="m2")
    with pytest.raises(StoreError, match="differ in model_fingerprint") as e:
        StoreReader([store, foreign], 8)
    assert "\n" not in str(e.value)


# -------------------------------------------------------------------------------------------------- training
def test_train_reaches_auc_saves_and_resumes(store, tmp_path, monkeypatch):
    from conftest import REPO
    from workbench.sampler.train import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "run"
    argv = ["--config", "workbench/configs/sampler_micro.yaml", "--store", str(store), "--out_dir", str(out),
            "--progress_bar", "false", "--max_epochs", "12"]
    assert main(argv) == 0
    m1 = json.loads((out / "metrics.json").read_text())
    assert m1["best_val_auc"] > 0.8 and m1["val/auc_top1_prob"] > 0.7, m1
    assert (out / "config.yaml").exists() and (out / "logs/version_0/metrics.csv").exists()
    assert (out / "checkpoints/last.ckpt").exists()
    net, cfg, meta = load_sampler(out / "sampler")
    assert meta["model_fingerprint"] == "m1" and meta["feature_spec"]["feature_dim"] == 144
    assert cfg.d_model == 32 and cfg.depth == 1
    best = SamplerNet(cfg).eval()
    state = torch.load(meta["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    best.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net.")})
    x = torch.randn(4, 8, 144)
    assert torch.equal(net(x), best(x))
    # max_epochs sets the cosine horizon: a resume with another one is refused by name (issue 56 §2)
    from workbench.run_folder import RunFolderError

    with pytest.raises(RunFolderError, match=r"max_epochs 12 \(now 13\).*--max_epochs 12"):
        main(argv[:-1] + ["13"])
    # the same command resumes the finished run from last.ckpt and exports it again, into one log (issue 27 §3)
    assert main(argv) == 0 and not (out / "logs/version_1").exists()
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["global_step"] == m1["global_step"] and m2["best_val_auc"] == m1["best_val_auc"]


def test_validation_interval_rule():
    from workbench.sampler.train import SamplerTrainConfig, validation_interval

    assert validation_interval(SamplerTrainConfig(val_every=7, max_steps=3), 10) == 7
    assert validation_interval(SamplerTrainConfig(max_steps=3), 10) == 3            # ends inside epoch 1
    assert validation_interval(SamplerTrainConfig(max_steps=25), 10) is None        # epoch ends validate
    assert validation_interval(SamplerTrainConfig(), 10) is None


def test_max_steps_inside_first_epoch_still_validates(store, tmp_path, monkeypatch):
    """A store larger than ``max_steps`` batches (the 409 k-row SmolLM2 store at 1,300 steps) once ended with
    no validation, so early stopping raised for a missing val/auc; the last step now validates."""
    from conftest import REPO
    from workbench.cli_args import parse_dataclass
    from workbench.sampler.train import SamplerTrainConfig, main, sampler_data

    monkeypatch.chdir(REPO)
    out = tmp_path / "run"
    argv = ["--config", "workbench/configs/sampler_micro.yaml", "--store", str(store), "--out_dir", str(out),
            "--progress_bar", "false"]
    spe = sampler_data(parse_dataclass("test", SamplerTrainConfig, argv)).train_steps_per_epoch()
    assert spe >= 3
    assert main(argv + ["--max_steps", str(spe - 1)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["global_step"] == spe - 1
    assert m["best_val_auc"] is not None and "val/auc" in m
    assert (out / "checkpoints/last.ckpt").exists()


def test_safe_prefix_and_oracle_hand_values():
    from workbench.sampler.ranking import oracle_commits, safe_prefix

    scores = torch.tensor([[0.9, 0.8, 0.7, 0.1],     # ranked 0, 1, 2, 3: labels T, T, F, T → 2
                           [0.2, 0.9, 0.5, 0.4],     # ranked 1, 2, 3, 0: labels F first → 0
                           [0.9, 0.1, 0.8, 0.3],     # position 0 committed (ignored): ranked 2, 3, 1 → T, T, T → 3
                           [0.5, 0.5, 0.5, 0.5]])    # all committed → 0
    labels = torch.tensor([[True, True, False, True],
                           [True, False, True, True],
                           [False, True, True, True],
                           [True, True, True, True]])
    masked = torch.tensor([[True, True, True, True],
                           [True, True, True, True],
                           [False, True, True, True],
                           [False, False, False, False]])
    assert safe_prefix(scores, labels, masked).tolist() == [2, 0, 3, 0]
    assert oracle_commits(labels, masked).tolist() == [3, 3, 3, 0]
    # an oracle score (the label itself) reaches the oracle count
    assert safe_prefix(labels.float(), labels, masked).tolist() == [3, 3, 3, 0]
    # ties are ranked in position order: equal scores over labels T, F, T, T stop after the first
    tied, every = torch.full((1, 4), 0.5), torch.ones(1, 4, dtype=torch.bool)
    assert safe_prefix(tied, torch.tensor([[True, False, True, True]]), every).tolist() == [1]
    assert safe_prefix(tied, torch.tensor([[False, True, True, True]]), every).tolist() == [0]
    with pytest.raises(ValueError, match="one \\(N, B\\) shape"):
        safe_prefix(scores[:, :3], labels, masked)
    with pytest.raises(ValueError, match="one \\(N, B\\) shape"):
        oracle_commits(labels[0], masked[0])


def test_threshold_commits_hand_values():
    from workbench.sampler.ranking import commits_at_error_rate, threshold_commits

    scores = torch.tensor([[0.9, 0.8, 0.7, 0.1],     # labels T, T, F, T
                           [0.2, 0.9, 0.5, 0.4],     # labels T, F, T, T
                           [0.9, 0.1, 0.8, 0.3]])    # position 0 committed
    labels = torch.tensor([[True, True, False, True],
                           [True, False, True, True],
                           [False, True, True, True]])
    masked = torch.tensor([[True, True, True, True],
                           [True, True, True, True],
                           [False, True, True, True]])
    commits, errors = threshold_commits(scores, labels, masked, [0.75, 0.45, 0.95])
    # τ = 0.75: {0, 1}, {1}, {2}; τ = 0.45: {0, 1, 2}, {1, 2}, {2}; τ = 0.95: only the forced top position
    assert commits.tolist() == [[2, 1, 1], [3, 2, 1], [1, 1, 1]]
    assert errors.tolist() == [[0, 1, 0], [1, 1, 0], [0, 1, 0]]
    # another fallback score picks the forced commit: by the label, it is always right
    _, err = threshold_commits(scores, labels, masked, [0.95], fallback=labels.float())
    assert err.tolist() == [[0, 0, 0]]
    # the fallback commits only where no position passes, as the sampler decoder does: with sampler scores
    # (0.1, 0.9, 0.2) and top-1 probabilities (0.95, 0.3, 0.2), τ = 0.5 commits position 1 alone
    one = torch.ones(1, 3, dtype=torch.bool)
    c, _ = threshold_commits(torch.tensor([[0.1, 0.9, 0.2]]), one, one, [0.5, 0.95],
                             fallback=torch.tensor([[0.95, 0.3, 0.2]]))
    assert c.tolist() == [[1], [1]]
    # a state with nothing masked commits nothing, whatever the threshold
    c, _ = threshold_commits(scores[:1], labels[:1], torch.zeros(1, 4, dtype=torch.bool), [0.0])
    assert c.tolist() == [[0]]
    # error rates 1/4, 2/6, 1/3 at 4/3, 2, 1 commits per state: at ≤ 0.34 the best is τ = 0.45, at ≤ 0.3 only
    # τ = 0.75 qualifies, at ≤ 0.2 none
    best = commits_at_error_rate(commits, errors, [0.34, 0.3, 0.2])
    assert best[0] == 2.0 and best[1] == pytest.approx(4 / 3) and best[2] is None
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        commits_at_error_rate(commits, errors, [1.5])
    with pytest.raises(ValueError, match="one \\(N, B\\) shape"):
        threshold_commits(scores[:, :3], labels, masked, [0.5])
    # weights: state 0 twice and state 2 dropped equals the sweep over the states [0, 0, 1]
    w = torch.tensor([2.0, 1.0, 0.0])
    rep = [0, 0, 1]
    levels = [0.5, 0.34, 0.3, 0.2, 0.0]
    assert commits_at_error_rate(commits, errors, levels, weights=w) == \
        commits_at_error_rate(commits[:, rep], errors[:, rep], levels)
    with pytest.raises(ValueError, match="non-negative"):
        commits_at_error_rate(commits, errors, [0.5], weights=torch.tensor([1.0, -1.0, 1.0]))


def test_scripts_take_the_block_length_the_store_holds(store, tmp_path):
    """The scripts' --block_length defaults to the store's one block length; a store of several needs it named."""
    from workbench.trajectories.store import StoreError, store_block_length

    assert store_block_length(store) == 8 and store_block_length(store, 32) == 32
    two = tmp_path / "two.zarr"
    create_store(two, {"model_fingerprint": "m1", "tokenizer_hash": "t1", "policy": "serial",
                       "feature_spec": feature_spec(144), "categories": ["code"]}, [8, 32],
                 token_pca=np.zeros((V, 44)))
    with pytest.raises(StoreError, match=r"holds block lengths \[8, 32\]: pass --block_length"):
        store_block_length(two)


def test_sampler_store_auc_script_reports_ranking(store, tmp_path, monkeypatch, capsys):
    import runpy
    from pathlib import Path

    torch.manual_seed(0)
    net = SamplerNet(sampler_preset("micro")).eval()
    d = save_sampler(net, net.cfg, tmp_path / "s", {"model_fingerprint": "m1"})
    script = Path(__file__).resolve().parents[1] / "scripts" / "sampler_store_auc.py"
    monkeypatch.setattr("sys.argv", [str(script), "--store", str(store), "--samplers", str(d),
                                     "--val_fraction", "0.5"])
    runpy.run_path(str(script), run_name="__main__")
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [x["score"] for x in lines] == ["top1_prob", str(d)]
    top1, samp = lines
    # the synthetic label is "top-1 probability + noise > 0.5": the top-1 probability ranks it well
    assert top1["auc"] > 0.8 and top1["states"] == samp["states"] > 0
    assert top1["oracle_commits_mean"] == samp["oracle_commits_mean"] > 0
    for x in lines:
        assert 0 <= x["safe_prefix_mean"] <= x["oracle_commits_mean"] and 0 <= x["top_rank_correct"] <= 1
        # a looser error rate never commits fewer tokens; every state commits at least its forced position
        best = [v for v in x["global_commits"].values() if v is not None]
        assert best == sorted(best) and all(v >= 1.0 for v in best)
    # a better ranking commits more before its first error: the informative score beats an untrained sampler
    assert top1["safe_prefix_mean"] > samp["safe_prefix_mean"]
    # the sampler's ratio to confidence at each level: the point value is the two global_commits' quotient, and
    # its prompt-bootstrap interval brackets the resamples' median
    assert "global_commits_ratio" not in top1
    for level, r in samp["global_commits_ratio"].items():
        a, b = samp["global_commits"][level], top1["global_commits"][level]
        if a is not None and b:
            assert r["ratio"] == pytest.approx(a / b)
            assert r["p05"] <= r["p50"] <= r["p95"] and r["prompts"] > 1
