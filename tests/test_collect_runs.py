"""`workbench collect` end to end: resume after SIGTERM and SIGKILL, 2-rank DDP sharding, verify, --extend."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from conftest import REPO, run_cli
from workbench.trajectories.store import StoreReader, verify_store


def _args(ckpt, corpus, out, *extra, n_prompts: int = 12):
    return ["collect", "--model", str(ckpt), "--corpus", str(corpus), "--out", str(out), "--n_prompts", str(n_prompts),
            "--blocks_per_prompt", "2", "--block_lengths", "[4,8]", "--batch_size", "4", "--rows_per_chunk", "16",
            "--context_len", "48", "--precision", "fp32", "--accelerator", "cpu", "--progress_bar", "false", *extra]


def _committed_items(out) -> int:
    """Work items committed so far over both B groups (a shard not created yet counts 0; zarr replaces
    zarr.json atomically, so a file that exists is always complete JSON)."""
    total = 0
    for b in (4, 8):
        f = out / f"B{b}" / "shard-000" / "zarr.json"
        if f.is_file():
            total += json.loads(f.read_text()).get("attributes", {}).get("commit", {}).get("items", 0)
    return total


def _shard_locked(shard_dir) -> bool:
    """Whether a collection holds the shard writer's flock on ``shard_dir`` (taken when its writers open), read from
    ``/proc/locks`` (``id: FLOCK ADVISORY WRITE pid maj:min:inode start end``): probing with a flock of our own
    could make the writer's non-blocking flock fail."""
    try:
        st = os.stat(shard_dir)
    except FileNotFoundError:
        return False
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return any(len(w) > 5 and w[1] == "FLOCK" and w[5] == dev for w in map(str.split, f))


def _canonical(path) -> dict:
    """{(B, prompt_id, block_index): (final_ids, rows in step order)} — independent of row order / shards."""
    out = {}
    for b in (4, 8):
        r = StoreReader(path, b)
        trajs = r.trajectories()
        final = r.final_ids()
        rows = r.read_row_range(0, r.n_rows)
        for t, tr in trajs.iterrows():
            sel = slice(int(tr["row_start"]), int(tr["row_end"]))
            key = (b, int(tr["prompt_id"]), int(tr["block_index"]))
            out[key] = (final[t].tolist(), {k: v[sel].tolist() for k, v in rows.items() if k != "traj"})
    return out


def _assert_same_arrays(a, b):
    import zarr

    ga, gb = zarr.open_group(a, mode="r"), zarr.open_group(b, mode="r")
    for bl in (4, 8):
        for sub in ("rows", "trajectories"):
            g1, g2 = ga[f"B{bl}/shard-000/{sub}"], gb[f"B{bl}/shard-000/{sub}"]
            for name in g1.array_keys():
                np.testing.assert_array_equal(g1[name][:], g2[name][:], err_msg=f"B{bl}/{sub}/{name}")


def test_collect_resume_after_sigkill(tmp_path, micro_checkpoint, small_corpus):
    ref = tmp_path / "ref.zarr"
    one = {"OMP_NUM_THREADS": "1"}  # the same command in the same environment (thread count changes float results)
    p = run_cli(*_args(micro_checkpoint, small_corpus, ref), env=one)
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "killed.zarr"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKBENCH_TEST_ITEM_DELAY": "0.3"}
    # SIGTERM (a plain `kill`) stops the run after the item in flight, commits what it decoded and exits 143
    # (Lightning's predict loop ignores SIGTERM: the collection used to run on to the end)
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", *_args(micro_checkpoint, small_corpus, out)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not _shard_locked(out / "B4" / "shard-000") and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)                                  # the writers are open: the predict loop has started
    time.sleep(0.8)                                       # an item (0.3 s delay each) is decoded
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "SIGTERM: stopped" in err, err[-2000:]
    assert 0 < _committed_items(out) < 12
    for kill_at in (1, 5, 9):  # committed work items (of 12) when the kill lands
        proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", *_args(micro_checkpoint, small_corpus, out)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while _committed_items(out) < kill_at and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        proc.kill()                                       # (nothing, if the collection has already ended)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, f"the collection ended before the kill (exit {proc.returncode})"
    p = run_cli(*_args(micro_checkpoint, small_corpus, out), env=one)
    assert p.returncode == 0, p.stderr[-2000:]
    _assert_same_arrays(ref, out)
    verify_store(out)


def test_two_rank_ddp_equals_single_process(tmp_path, micro_checkpoint, small_corpus):
    single, ddp = tmp_path / "single.zarr", tmp_path / "ddp.zarr"
    p = run_cli(*_args(micro_checkpoint, small_corpus, single), env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    p = run_cli(*_args(micro_checkpoint, small_corpus, ddp, "--devices", "2", "--strategy", "ddp"),
                env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert (ddp / "B4" / "shard-001").is_dir() and (ddp / "B8" / "shard-000").is_dir()
    a, b = _canonical(single), _canonical(ddp)
    assert len(a) == 48 and a == b
    verify_store(ddp)
    # resuming the 2-rank store with one process would collect shard-001's items again: refused in one line
    p = run_cli(*_args(micro_checkpoint, small_corpus, ddp), env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 2 and "another number of processes" in p.stderr, p.stderr[-2000:]
    assert _canonical(ddp) == a


def test_verify_cli_rejects_other_model(cli, tmp_path, micro_checkpoint, small_corpus):
    out = tmp_path / "s.zarr"
    assert cli(*_args(micro_checkpoint, small_corpus, out)).returncode == 0
    ok = cli("store", "verify", "--store", str(out), "--model", str(micro_checkpoint))
    assert ok.returncode == 0 and '"ok": true' in ok.stdout
    # a different model (re-initialised weights) must be refused in one line
    import torch
    from transformers import LlamaForCausalLM
    from workbench.model.io import save_checkpoint
    from workbench.model.presets import preset_config
    from workbench.model.trimode import TriModeLM
    from workbench.tokenizer import byte_tokenizer

    torch.manual_seed(1)
    other = tmp_path / "other"
    save_checkpoint(TriModeLM(LlamaForCausalLM(preset_config("micro")), 256), byte_tokenizer(), other, {})
    bad = cli("store", "verify", "--store", str(out), "--model", str(other))
    assert bad.returncode == 2 and "collect a new store" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    info = cli("store", "info", "--store", str(out))
    assert info.returncode == 0 and json.loads(info.stdout)["block_lengths"]["4"]["trajectories"] == 24


def test_collect_with_another_feature_dim(tmp_path, micro_checkpoint, small_corpus):
    """``--feature_dim 24`` (PCA of 4 dims): the store's token_pca has 4 columns, it verifies, and its rows give
    24-dim features (the store used to demand 44 PCA columns whatever the feature_dim)."""
    import zarr

    from workbench.trajectories.collect import CollectConfig, run_collect
    from workbench.trajectories.features import block_features

    out = tmp_path / "s.zarr"
    run_collect(CollectConfig(model=str(micro_checkpoint), corpus=str(small_corpus), out=str(out), n_prompts=2,
                              blocks_per_prompt=1, block_lengths=[4], batch_size=2, context_len=32, feature_dim=24,
                              precision="fp32", accelerator="cpu", progress_bar=False))
    verify_store(out)
    pca = zarr.open_group(out, mode="r")["token_pca"][:]
    assert pca.shape[1] == 4
    rows = StoreReader(out, 4).read_row_range(0, 4)
    feats = block_features(rows["top_ids"], rows["top_probs"], rows["entropy"], rows["masked"], rows["step"], pca,
                           feature_dim=24)
    assert feats.shape == (4, 4, 24)


def _grow_args(ckpt, corpus, out, n_prompts: int, *extra):
    return _args(ckpt, corpus, out, *extra, n_prompts=n_prompts)


def test_extend_grows_a_store_into_the_larger_plan(cli, tmp_path, micro_checkpoint, small_corpus):
    """A store of 10 prompts (every category of the corpus) extended to 16 (`--extend true`) equals the 16-prompt
    store collected at once, array for array; without --extend the larger plan is refused with the hint, and an
    extension never shrinks a store. Every run is in this process, so all of them use the same torch threads."""
    import zarr

    ref, grown = tmp_path / "ref.zarr", tmp_path / "grown.zarr"
    assert cli(*_grow_args(micro_checkpoint, small_corpus, ref, 16)).returncode == 0
    assert cli(*_grow_args(micro_checkpoint, small_corpus, grown, 10)).returncode == 0
    p = cli(*_grow_args(micro_checkpoint, small_corpus, grown, 16))
    assert p.returncode == 2 and "n_prompts: 10 != 16" in p.stderr and "--extend true" in p.stderr, p.stderr[-2000:]
    assert zarr.open_group(grown, mode="r").attrs["n_prompts"] == 10
    p = cli(*_grow_args(micro_checkpoint, small_corpus, grown, 16, "--extend", "true"))
    assert p.returncode == 0, p.stderr[-2000:]
    attrs = zarr.open_group(grown, mode="r").attrs
    assert attrs["n_prompts"] == 16 and attrs["work_items"] == {"4": 8, "8": 8}
    _assert_same_arrays(ref, grown)
    assert verify_store(grown)["block_lengths"][4]["trajectories"] == 32
    # every prompt's source file is recorded, and the extension grew the record to the larger plan's prompts
    docs = zarr.open_group(grown, mode="r")["prompt_document"][:]
    np.testing.assert_array_equal(docs, zarr.open_group(ref, mode="r")["prompt_document"][:])
    assert len(docs) == 16 and (docs >= 0).all() and len(set(docs.tolist())) > 1
    p = cli(*_grow_args(micro_checkpoint, small_corpus, grown, 12, "--extend", "true"))
    assert p.returncode == 2 and "cannot shrink" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_extend_refuses_a_partial_last_item_and_a_changed_prompt_order(tmp_path, micro_checkpoint, small_corpus,
                                                                       monkeypatch):
    import pytest

    from workbench.trajectories import collect
    from workbench.trajectories.store import StoreError

    kw = dict(model=str(micro_checkpoint), corpus=str(small_corpus), blocks_per_prompt=2, block_lengths=[4],
              batch_size=4, context_len=48, precision="fp32", accelerator="cpu", progress_bar=False)
    partial = str(tmp_path / "partial.zarr")                     # 9 prompts × 2 blocks = 18 trajectories: 4·4 + 2
    collect.run_collect(collect.CollectConfig(out=partial, n_prompts=9, **kw))
    with pytest.raises(StoreError, match="last work item at B = 4 is partial"):
        collect.run_collect(collect.CollectConfig(out=partial, n_prompts=12, extend=True, **kw))
    few = str(tmp_path / "few.zarr")                             # 2 prompts: 2 of the corpus's categories
    collect.run_collect(collect.CollectConfig(out=few, n_prompts=2, **kw))
    with pytest.raises(StoreError, match="other prompt categories"):
        collect.run_collect(collect.CollectConfig(out=few, n_prompts=12, extend=True, **kw))
    whole = str(tmp_path / "whole.zarr")
    collect.run_collect(collect.CollectConfig(out=whole, n_prompts=10, **kw))
    real = collect.make_prompts
    # only the larger plan changes order: the old plan rebuilt is still the one collected (same prompt digest)
    monkeypatch.setattr(collect, "make_prompts",
                        lambda docs, n, *a, **k: real(docs, n, *a, **k)[::-1 if n == 12 else 1])
    with pytest.raises(StoreError, match="not prefix-stable"):
        collect.run_collect(collect.CollectConfig(out=whole, n_prompts=12, extend=True, **kw))


def test_resume_and_extend_refuse_a_changed_corpus(tmp_path, micro_checkpoint, small_corpus):
    """The store records the digest of its prompt plan: a resume or an --extend on a corpus changed since is
    refused in one line (its work items would no longer be the committed ones); a store from before the digest
    records it at its next resume. A resume in another precision is refused too."""
    import shutil

    import pytest
    import zarr

    from workbench.trajectories import collect
    from workbench.trajectories.store import StoreError

    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    kw = dict(model=str(micro_checkpoint), corpus=str(corpus), blocks_per_prompt=2, block_lengths=[4],
              batch_size=4, context_len=48, precision="fp32", accelerator="cpu", progress_bar=False)
    out = tmp_path / "s.zarr"
    collect.run_collect(collect.CollectConfig(out=str(out), n_prompts=10, **kw))
    digest = zarr.open_group(out, mode="r").attrs["prompt_digest"]
    assert len(digest) == 16
    collect.run_collect(collect.CollectConfig(out=str(out), n_prompts=10, **kw))          # resume: same prompts
    files = lambda: {f: f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}  # noqa: E731
    before = files()
    # the decode's precision is part of the store: resuming in another one would mix two trajectory sources
    with pytest.raises(StoreError, match="different settings \\(precision: 'fp32' != 'bf16'\\)"):
        collect.run_collect(collect.CollectConfig(out=str(out), n_prompts=10, **dict(kw, precision="bf16")))
    assert files() == before
    for f in corpus.rglob("*.py"):                                       # every cut point now sees other text
        f.write_text("# edited\n" + f.read_text())
    with pytest.raises(StoreError, match=f"collected on other prompts \\(prompt digest {digest} != "):
        collect.run_collect(collect.CollectConfig(out=str(out), n_prompts=10, **kw))
    with pytest.raises(StoreError, match="collected on other prompts than its plan of 10 prompts gives now"):
        collect.run_collect(collect.CollectConfig(out=str(out), n_prompts=12, extend=True, **kw))
    assert files() == before and zarr.open_group(out, mode="r").attrs["prompt_digest"] == digest
    p = run_cli("collect", "--model", str(micro_checkpoint), "--corpus", str(corpus), "--out", str(out),
                "--n_prompts", "10", "--blocks_per_prompt", "2", "--block_lengths", "[4]", "--batch_size", "4",
                "--context_len", "48", "--precision", "fp32", "--accelerator", "cpu", "--progress_bar", "false")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "other prompts" in p.stderr, p.stderr
    # a store without the digest (collected before it existed) is resumed and records it
    old = tmp_path / "old.zarr"
    collect.run_collect(collect.CollectConfig(out=str(old), n_prompts=10, **kw))
    meta = json.loads((old / "zarr.json").read_text())
    now = meta["attributes"].pop("prompt_digest")
    (old / "zarr.json").write_text(json.dumps(meta))
    collect.run_collect(collect.CollectConfig(out=str(old), n_prompts=10, **kw))
    assert zarr.open_group(old, mode="r").attrs["prompt_digest"] == now != digest


def test_a_store_of_the_per_block_context_layout_is_not_resumed_or_extended(tmp_path, micro_checkpoint,
                                                                             small_corpus):
    """A store collected before the shared prefill (no ``context_layout``: every block saw its own last
    ``context_len`` tokens) is refused on resume and on --extend, naming the setting, and nothing is written; a
    context the model cannot hold is refused before the store is created."""
    import pytest
    import zarr

    from workbench.decoding.base import DecodeError
    from workbench.trajectories import collect
    from workbench.trajectories.store import StoreError

    kw = dict(model=str(micro_checkpoint), corpus=str(small_corpus), blocks_per_prompt=2, block_lengths=[4],
              batch_size=4, context_len=48, precision="fp32", accelerator="cpu", progress_bar=False)
    out = tmp_path / "s.zarr"
    collect.run_collect(collect.CollectConfig(out=str(out), n_prompts=9, **kw))         # every category
    assert zarr.open_group(out, mode="r").attrs["context_layout"] == collect.CONTEXT_LAYOUT
    root = zarr.open_group(out, mode="r+")
    attrs = dict(root.attrs)
    del attrs["context_layout"]
    root.attrs.clear()
    root.update_attributes(attrs)
    files = lambda: {f: f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}  # noqa: E731
    before = files()
    for extra in ({}, {"n_prompts": 12, "extend": True}):
        with pytest.raises(StoreError, match="context_layout: None != 'prompt_window\\+real_blocks'"):
            collect.run_collect(collect.CollectConfig(out=str(out), **{"n_prompts": 9, **kw, **extra}))
    assert files() == before
    with pytest.raises(DecodeError, match=r"= 1072 positions exceeds the model context \(1024\)"):
        collect.run_collect(collect.CollectConfig(out=str(tmp_path / "long.zarr"), n_prompts=4,
                                                  **{**kw, "context_len": 1000, "blocks_per_prompt": 18}))
    assert not (tmp_path / "long.zarr").exists()
