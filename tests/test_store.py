"""The Zarr trajectory store: round trip, whole-chunk buffering, crash-resume (incl. real SIGKILLs), verify, info."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

from workbench.trajectories import (SCHEMA_VERSION, ShardWriter, StoreError, StoreReader, create_store, row_array_specs,
                                    store_info, verify_store)

B = 8
ATTRS = {"model_fingerprint": "m1", "tokenizer_hash": "t1", "policy": "hybrid", "feature_spec": {"dim": 144},
         "corpus_split": "train", "seed": 0, "categories": ["json", "email", "http"], "threshold": 0.9}


def make_item(item_id: int, B: int = B, t: int = 3):
    """Deterministic synthetic work item: t trajectories of 1..5 steps; label = top-1 == final id."""
    rng = np.random.default_rng(1000 + item_id)
    steps = rng.integers(1, 6, t)
    traj = np.repeat(np.arange(t), steps)
    n = len(traj)
    final = rng.integers(0, 50, (t, B)).astype(np.int32)
    top = rng.integers(0, 50, (n, B, 3)).astype(np.int32)
    top[..., 0] = np.where(rng.random((n, B)) < 0.4, final[traj], top[..., 0])
    rows = {"top_ids": top, "top_probs": rng.random((n, B, 3), dtype=np.float32), "entropy": rng.random((n, B)),
            "masked": rng.random((n, B)) < 0.6, "label": top[..., 0] == final[traj], "traj": traj,
            "step": np.concatenate([np.arange(s) for s in steps])}
    trajs = {"prompt_id": rng.integers(0, 100, t), "category": rng.integers(0, 3, t),
             "block_index": rng.integers(0, 4, t), "final_ids": final}
    return rows, trajs


def write(path, items, rank=0, **kw):
    kw = {"rows_per_chunk": 64, "traj_per_chunk": 16, **kw}
    with ShardWriter(path, B, rank=rank, **kw) as w:
        for i in items:
            w.append(i, *make_item(i))


def new_store(path, items=range(40), ranks=1):
    create_store(path, ATTRS, [B], token_pca=np.arange(20 * 44).reshape(20, 44) / 100)
    for r in range(ranks):
        write(path, [i for i in items if i % ranks == r], rank=r)
    return path


def assert_same_store(a, b):
    """Every array of every shard group (and the commit record) identical."""
    ga, gb = zarr.open_group(a, mode="r")[f"B{B}"], zarr.open_group(b, mode="r")[f"B{B}"]
    assert sorted(ga.group_keys()) == sorted(gb.group_keys())
    for shard in ga.group_keys():
        assert dict(ga[shard].attrs) == dict(gb[shard].attrs)
        for name in ["items"] + [f"{s}/{k}" for s in ("rows", "trajectories") for k in ga[f"{shard}/{s}"].array_keys()]:
            x, y = ga[f"{shard}/{name}"], gb[f"{shard}/{name}"]
            assert x.shape == y.shape and x.dtype == y.dtype, name
            np.testing.assert_array_equal(x[:], y[:], err_msg=name)


def abandon(w: ShardWriter):
    """Simulate a crash: drop the writer without flushing (only release its lock)."""
    os.close(w._lock_fd)
    w._lock_fd = None


def one_line_error(fn, *words):
    with pytest.raises(StoreError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


# --------------------------------------------------------------------------------------------------- round trip
def test_round_trip_two_shards(tmp_path):
    p = new_store(tmp_path / "s", items=range(30), ranks=2)
    r = StoreReader(p, B)
    # expected global view: shard-000 (even items) then shard-001 (odd items)
    exp, toff = {k: [] for k in row_array_specs(B)}, 0
    fin, cats = [], []
    for rank in (0, 1):
        for i in range(rank, 30, 2):
            rows, trajs = make_item(i)
            for k in exp:
                exp[k].append(rows[k] + toff if k == "traj" else rows[k])
            toff += len(trajs["prompt_id"])
            fin.append(trajs["final_ids"])
            cats += [ATTRS["categories"][c] for c in trajs["category"]]
    exp = {k: np.concatenate(v).astype(row_array_specs(B)[k][1]) for k, v in exp.items()}
    assert (r.n_rows, r.n_traj) == (len(exp["traj"]), toff)
    full = r.read_row_range(0, r.n_rows)
    for k in exp:
        np.testing.assert_array_equal(full[k], exp[k], err_msg=k)
    idx = np.random.default_rng(0).integers(0, r.n_rows, 50)  # unsorted, with repeats, across both shards
    got = r.read_rows(idx)
    r._fast = [dict.fromkeys(f) for f in r._fast]  # the zarr fallback path must agree
    slow = r.read_rows(idx)
    for k in exp:
        np.testing.assert_array_equal(got[k], exp[k][idx], err_msg=k)
        np.testing.assert_array_equal(slow[k], exp[k][idx], err_msg=k)
    df = r.trajectories()
    assert len(df) == r.n_traj and list(df["category"]) == cats and set(df["shard"]) == {0, 1}
    assert df["row_start"].iloc[0] == 0 and df["row_end"].iloc[-1] == r.n_rows
    assert np.all(df["row_start"].to_numpy()[1:] == df["row_end"].to_numpy()[:-1])
    np.testing.assert_array_equal(r.final_ids(), np.concatenate(fin))
    np.testing.assert_array_equal(full["traj"], np.repeat(np.arange(r.n_traj), df["row_end"] - df["row_start"]))
    assert r.token_pca.shape == (20, 44) and r.token_pca.dtype == np.float16
    assert r.attrs["schema_version"] == SCHEMA_VERSION and r.attrs["policy"] == "hybrid"


def test_shard_encoder_matches_zarr(tmp_path, monkeypatch):
    """Shards written by the fast encoder (4 inner chunks per shard) equal zarr's own writes, read by zarr."""
    import workbench.trajectories.store as st

    monkeypatch.setattr(st, "ROW_INNER_CHUNK", 16)
    fast = new_store(tmp_path / "fast", items=range(25))
    monkeypatch.setattr(st, "fast_writer", lambda a: None)
    assert_same_store(fast, new_store(tmp_path / "zarr", items=range(25)))
    a = zarr.open_group(fast, mode="r")[f"B{B}/shard-000/rows/top_ids"]
    assert a.chunks[0] == 16 and a.shards[0] == 64


def test_whole_chunk_buffering(tmp_path):
    p = tmp_path / "s"
    create_store(p, ATTRS, [B])
    w = ShardWriter(p, B, rows_per_chunk=64, traj_per_chunk=16)
    g = zarr.open_group(p, mode="r")[f"B{B}/shard-000"]
    chunk_dir = Path(p) / f"B{B}/shard-000/rows/top_ids/c"
    i = 0
    while w.rows.end + len(make_item(i)[0]["traj"]) < 64 and w.trajs.end + 3 < 16:
        w.append(i, *make_item(i))
        i += 1
    assert i >= 2 and g.attrs["commit"]["rows"] == 0 and g["rows/top_ids"].shape[0] == 0 and not chunk_dir.exists()
    while w.rows.committed == 0:
        w.append(i, *make_item(i))
        i += 1
    g = zarr.open_group(p, mode="r")[f"B{B}/shard-000"]
    assert g.attrs["commit"]["rows"] == 64 and sorted(os.listdir(chunk_dir)) == ["0"]  # one whole shard file
    assert w.done_items and max(w.done_items) < i - 1  # the item straddling the chunk end is not done yet
    w.flush(final=True)
    g = zarr.open_group(p, mode="r")[f"B{B}/shard-000"]
    assert g.attrs["commit"]["rows"] == w.rows.end == g["rows/top_ids"].shape[0] and w.done_items == set(range(i))
    for j in range(i, 40):  # continuing after a final flush rewrites the partial chunk whole
        w.append(j, *make_item(j))
    w.close()
    one_line_error(lambda: w.append(40, *make_item(40)), "closed writer")
    assert_same_store(new_store(tmp_path / "ref", items=range(40)), p)


def test_bad_input_refused(tmp_path):
    p = new_store(tmp_path / "s", items=range(3))
    with ShardWriter(p, B, rank=1) as w:
        rows, trajs = make_item(5)
        one_line_error(lambda: w.append(5, {**rows, "top_ids": rows["top_ids"][:, :4]}, trajs), "top_ids", "block length")
        one_line_error(lambda: w.append(5, {**rows, "traj": rows["traj"][::-1]}, trajs), "grouped by trajectory")
        w.append(5, rows, trajs)
        one_line_error(lambda: w.append(4, *make_item(4)), "increasing id order")
    one_line_error(lambda: ShardWriter(p, 32), "no block length 32")


def test_create_store_refuses_a_zarr_array(tmp_path):
    zarr.create_array(tmp_path / "a.zarr", shape=(4,), dtype="int32")
    one_line_error(lambda: create_store(tmp_path / "a.zarr", ATTRS, [B]), "not a workbench trajectory store")


def test_create_store_different_attrs_refused(tmp_path):
    p = new_store(tmp_path / "s", items=range(3))
    create_store(p, ATTRS, [B], token_pca=np.arange(20 * 44).reshape(20, 44) / 100)  # identical: no-op
    one_line_error(lambda: create_store(p, {**ATTRS, "seed": 1}, [B]), "created with different settings", "seed: 0 != 1")
    one_line_error(lambda: create_store(p, ATTRS, [B, 32]), "block_lengths")
    assert StoreReader(p, B).n_traj == 9


# ------------------------------------------------------------------------------------------------------- resume
def test_resume_after_simulated_crash(tmp_path):
    ref = new_store(tmp_path / "ref", items=range(40))
    p = tmp_path / "s"
    create_store(p, ATTRS, [B], token_pca=np.arange(20 * 44).reshape(20, 44) / 100)
    w = ShardWriter(p, B, rows_per_chunk=64, traj_per_chunk=16)
    for i in range(25):
        w.append(i, *make_item(i))
    w.flush()
    for i in range(25, 30):  # appended but never committed
        w.append(i, *make_item(i))
    w.rows.write(final=True)  # ... and even written, without a commit record
    abandon(w)
    g = zarr.open_group(p, mode="a")[f"B{B}/shard-000"]
    c = g.attrs["commit"]
    for name in ["rows/top_ids", "rows/traj", "trajectories/final_ids", "items"]:  # junk beyond the commit
        a = g[name]
        a.resize((a.shape[0] + 50,) + a.shape[1:])
        a[-50:] = 7
    assert c["item_rows"] < c["rows"]  # a commit landed in the middle of an item
    w = ShardWriter(p, B, rows_per_chunk=64, traj_per_chunk=16)
    assert w.done_items == set(range(len(w.done_items))) and 0 < len(w.done_items) < 30
    assert zarr.open_group(p, mode="r")[f"B{B}/shard-000/rows/top_ids"].shape[0] == w.rows.end == c["item_rows"]
    for i in range(40):  # done items are ignored
        w.append(i, *make_item(i))
    w.close()
    assert_same_store(ref, p)
    verify_store(p)


CHILD = textwrap.dedent("""
    import sys
    from tests.test_store import make_item, B
    from workbench.trajectories import ShardWriter
    w = ShardWriter(sys.argv[1], B, rows_per_chunk=32, traj_per_chunk=8)
    for i in range(int(sys.argv[2])):
        if i not in w.done_items:
            print(i, flush=True)
            sys.stdin.readline()         # the test's go: the child cannot run ahead of the kill
            w.append(i, *make_item(i))
    w.close()
    print("done", flush=True)
""")


def test_resume_after_sigkill(tmp_path):
    n = 120
    ref = new_store(tmp_path / "ref", items=range(n))
    p = tmp_path / "s"
    create_store(p, ATTRS, [B], token_pca=np.arange(20 * 44).reshape(20, 44) / 100)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    for kill_after in (7, 45, 90, None):  # three kills, then a run to completion
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(p), str(n)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=repo, env=env)
        for line in proc.stdout:
            if line.strip() == "done":
                continue
            proc.stdin.write("go\n")
            proc.stdin.flush()
            if kill_after is not None and line.strip() == str(kill_after):
                proc.kill()                       # lands somewhere inside append / flush / commit of that item
                break
        proc.wait(timeout=60)
        assert proc.returncode == (-signal.SIGKILL if kill_after is not None else 0)
    assert_same_store(ref, p)
    verify_store(p, model_fingerprint="m1", tokenizer_hash="t1")


CREATE_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from tests.test_store import ATTRS, B
    from workbench.trajectories import create_store
    calls, replace = [0], os.replace
    def dying_replace(*a, **k):          # zarr's atomic write: temporary file, then os.replace
        calls[0] += 1
        if calls[0] == int(sys.argv[2]):
            os._exit(3)                  # killed just before the n-th rename lands
        return replace(*a, **k)
    os.replace = dying_replace
    create_store(sys.argv[1], ATTRS, [B, 2 * B], token_pca=np.arange(20 * 44).reshape(20, 44) / 100)
""")


def test_create_store_resumes_after_a_kill_at_every_write(tmp_path):
    """A kill at any file write of ``create_store`` leaves a path that a rerun completes (the root attrs land in
    one write, and a kill's temporary ``zarr.*.partial`` file is not mistaken for a foreign file)."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    pca = np.arange(20 * 44).reshape(20, 44) / 100
    for n in range(1, 50):
        p = tmp_path / f"s{n}"
        rc = subprocess.run([sys.executable, "-c", CREATE_CHILD, str(p), str(n)], cwd=repo, env=env).returncode
        if rc == 0:                      # create_store finished before the n-th write
            break
        assert rc == 3
        create_store(p, ATTRS, [B, 2 * B], token_pca=pca)
        write(p, range(3))
        assert StoreReader(p, B).n_traj == 9 and dict(zarr.open_group(p, mode="r").attrs)["seed"] == 0
    assert n > 3


def test_second_writer_on_same_shard_refused(tmp_path):
    p = new_store(tmp_path / "s", items=range(2))
    with ShardWriter(p, B):
        one_line_error(lambda: ShardWriter(p, B), "another process")


# ------------------------------------------------------------------------------------------------------- verify
@pytest.fixture
def store(tmp_path):
    return new_store(tmp_path / "s", items=range(40))


def _rw(store, name):
    return zarr.open_group(store, mode="a")[f"B{B}/shard-000/{name}"]


def test_verify_ok_and_missing(store, tmp_path):
    s = verify_store(store, model_fingerprint="m1", tokenizer_hash="t1")
    assert s["block_lengths"][B]["trajectories"] == 120
    one_line_error(lambda: verify_store(tmp_path / "nope"), "no trajectory store")


def test_verify_corrupt_chunk(store):
    f = Path(store) / f"B{B}/shard-000/rows/top_ids/c/0/0/0"
    f.write_bytes(np.random.default_rng(0).bytes(f.stat().st_size))
    one_line_error(lambda: verify_store(store), "corrupt chunk", "shard-000/rows/top_ids")
    with pytest.raises(StoreError, match="corrupt"):
        StoreReader(store, B).read_rows(np.array([1, 2]))


@pytest.mark.parametrize("name", ["prompt_id", "category", "block_index"])
def test_verify_decodes_every_trajectory_column(store, name):
    f = Path(store) / f"B{B}/shard-000/trajectories/{name}/c/0"
    f.write_bytes(f.read_bytes()[:16] + np.random.default_rng(0).bytes(f.stat().st_size - 16))
    one_line_error(lambda: verify_store(store), f"trajectories/{name}")   # a decode error or ids out of range


def test_verify_range_checks_ids(store):
    a = _rw(store, "trajectories/category")
    a[5] = len(ATTRS["categories"])        # a category code with no name
    one_line_error(lambda: verify_store(store), "trajectories/category", "outside [0, 3)", "entry 5")
    a[5] = 0
    verify_store(store)
    root = zarr.open_group(store, mode="a")
    root.attrs["vocab_size"] = 20          # the fixture's ids go up to 49, its token_pca has 20 rows
    one_line_error(lambda: verify_store(store), "final_ids", "outside [0, 20)")
    ids = _rw(store, "trajectories/final_ids")
    ids[:] = np.minimum(ids[:], 19)
    one_line_error(lambda: verify_store(store), "rows/top_ids", "outside [0, 20)")
    root.attrs["vocab_size"] = 50
    one_line_error(lambda: verify_store(store), "token_pca has 20 rows", "vocab_size is 50")


def test_verify_truncated_array(store):
    a = _rw(store, "rows/label")
    a.resize((a.shape[0] - 5, B))
    one_line_error(lambda: verify_store(store), "truncated", "rows/label")
    ref = new_store(Path(store).parent / "ref", items=range(40))
    write(store, range(40))  # the fix the message gives: re-run the same collection
    verify_store(store)
    assert_same_store(ref, store)


def test_verify_missing_chunk_file(store):
    os.remove(Path(store) / f"B{B}/shard-000/rows/entropy/c/1/0")
    one_line_error(lambda: verify_store(store), "truncated", "rows/entropy", "missing")
    # the reader refuses too (it used to return fill values: zeros a sampler would have trained on)
    one_line_error(lambda: StoreReader(store, B).read_rows(np.arange(64, 70)), "rows/entropy", "missing")


def test_verify_other_model_and_tokenizer(store):
    one_line_error(lambda: verify_store(store, model_fingerprint="m2"), "store was collected with model m1, not m2",
                   "collect a new store")
    one_line_error(lambda: verify_store(store, tokenizer_hash="t2"), "tokenizer t1, not t2")


def test_verify_newer_schema(store):
    v = SCHEMA_VERSION + 1
    zarr.open_group(store, mode="a").attrs["schema_version"] = v
    msg = one_line_error(lambda: verify_store(store), "upgrade workbench")
    assert msg == f"store schema version {v} is newer than this workbench ({SCHEMA_VERSION}); upgrade workbench"
    one_line_error(lambda: StoreReader(store, B), "newer")


def test_verify_older_schema(store):
    """A version-1 store (float16 top probabilities) is refused in one line that says to collect it again."""
    zarr.open_group(store, mode="a").attrs["schema_version"] = 1
    one_line_error(lambda: verify_store(store), "older", "float32", "workbench collect")
    one_line_error(lambda: StoreReader(store, B), "older")


def test_verify_label_inconsistency(store):
    a, m = _rw(store, "rows/label"), _rw(store, "rows/masked")[:]
    r, j = np.argwhere(m)[10]
    lab = a[:]
    lab[r, j] = ~lab[r, j]
    a[:] = lab
    one_line_error(lambda: verify_store(store), "label inconsistency", f"row {r}, position {j}")


def test_verify_nan(store):
    a = _rw(store, "rows/top_probs")
    a[3, 0, 0] = np.nan
    one_line_error(lambda: verify_store(store), "NaN", "top_probs", "row 3")


def test_verify_broken_row_ranges(store):
    a = _rw(store, "trajectories/row_end")
    a[2] = a[2] + 1
    one_line_error(lambda: verify_store(store), "not contiguous")


# --------------------------------------------------------------------------------------------------------- info
def test_store_info_numbers(store):
    info = store_info(store)["block_lengths"][B]
    pos, msk, by_cat = 0, 0, {c: [0, 0] for c in ATTRS["categories"]}
    n_rows = 0
    for i in range(40):
        rows, trajs = make_item(i)
        n_rows += len(rows["traj"])
        lm = (rows["label"] & rows["masked"]).sum(1)
        mm = rows["masked"].sum(1)
        pos, msk = pos + lm.sum(), msk + mm.sum()
        for t, c in enumerate(trajs["category"]):
            sel = rows["traj"] == t
            by_cat[ATTRS["categories"][c]][0] += lm[sel].sum()
            by_cat[ATTRS["categories"][c]][1] += mm[sel].sum()
    assert info["rows"] == n_rows and info["trajectories"] == 120 and info["shards"] == 1
    assert info["label_balance"] == pytest.approx(pos / msk)
    assert info["label_balance_by_category"] == pytest.approx({c: a / b for c, (a, b) in by_cat.items() if b})
    assert info["bytes_on_disk"] > 0 and info["bytes_per_row"] == pytest.approx(info["bytes_on_disk"] / n_rows)


def test_store_info_of_a_killed_writer_counts_committed_items_only(tmp_path):
    """Rows on disk past the last committed item (a writer killed or still running) are not counted."""
    p, ref = tmp_path / "s", tmp_path / "ref"
    for q in (p, ref):
        create_store(q, ATTRS, [B])
    write(ref, [0])
    w = ShardWriter(p, B, rows_per_chunk=64, traj_per_chunk=1024)
    w.append(0, *make_item(0))
    w.flush(final=True)                  # item 0 committed
    i = 1
    while w.group.attrs["commit"]["rows"] < 64:  # rows of later items reach the disk, their trajectories do not
        w.append(i, *make_item(i))
        i += 1
    abandon(w)
    c = w.group.attrs["commit"]
    assert c["rows"] > c["item_rows"] and c["item_trajs"] == 3
    a, b = store_info(p)["block_lengths"][B], store_info(ref)["block_lengths"][B]
    for k in ("rows", "trajectories", "label_balance", "label_balance_by_category"):
        assert a[k] == b[k], k
