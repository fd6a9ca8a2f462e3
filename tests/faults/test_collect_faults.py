"""`workbench collect` and trajectory stores under faults (issue 56): Ctrl-C and SIGTERM commit the decoded items
and a rerun resumes; a full disk, while the store is created or mid-collection, is one line and leaves nothing
half-written; `--out` must be a new path, an empty directory or a store; a copy of a store is not read twice.
Every case is one stderr line with the right exit status."""
import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from faultkit import fill, interrupt, small_disk, start_cli, stderr_lines, wait_for  # noqa: F401 (a fixture)
from workbench.trajectories.store import StoreReader, open_store, verify_store

#: The smallest collection: builtin:tiny, 12 prompts × 2 blocks of B = 4, 2 trajectories per work item (12 items).
ARGS = ["--n_prompts", "12", "--block_lengths", "[4]", "--blocks_per_prompt", "2", "--batch_size", "2",
        "--context_len", "32", "--rows_per_chunk", "16", "--precision", "fp32", "--accelerator", "cpu",
        "--progress_bar", "false"]
ITEMS = 12


@pytest.fixture
def one_thread():
    """One torch thread in this process, as in the CLI subprocesses (OMP_NUM_THREADS=1): the same floats."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def collect(cli, out, *extra):
    return cli("collect", "--out", str(out), *ARGS, *extra)


def commit(out) -> dict:
    """The commit record of shard B4/shard-000 ({} before it exists); zarr.json is replaced atomically."""
    f = Path(out) / "B4" / "shard-000" / "zarr.json"
    return json.loads(f.read_text())["attributes"].get("commit", {}) if f.is_file() else {}


def one_line(r, rc: int, *words) -> str:
    """``r`` (a CompletedProcess, or ``interrupt``'s ``(rc, out, err)``) exited ``rc`` with one stderr line holding
    ``words``; returns the line."""
    code, err = (r[0], r[2]) if isinstance(r, tuple) else (r.returncode, r.stderr)
    lines = stderr_lines(err)
    assert code == rc and len(lines) == 1, (code, lines[-30:])
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def same_store(a, b) -> None:
    ra, rb = StoreReader(a, 4), StoreReader(b, 4)
    assert (ra.n_rows, ra.n_traj) == (rb.n_rows, rb.n_traj)
    for k, v in ra.read_row_range(0, ra.n_rows).items():
        np.testing.assert_array_equal(v, rb.read_row_range(0, rb.n_rows)[k], err_msg=k)
    np.testing.assert_array_equal(ra.final_ids(), rb.final_ids())
    cols = ["prompt_id", "block_index", "row_start", "row_end"]
    assert ra.trajectories()[cols].equals(rb.trajectories()[cols])


def stopped_by(sig, out, after_rows: int = 0) -> tuple:
    """Start the collection into ``out`` (0.25 s per work item), send ``sig`` to its process group once it has
    written rows past ``after_rows`` (a few items decoded); returns ``interrupt``'s ``(rc, out, err)``."""
    proc = start_cli("collect", "--out", str(out), *ARGS,
                     env={"OMP_NUM_THREADS": "1", "WORKBENCH_TEST_ITEM_DELAY": "0.25"})
    wait_for(lambda: commit(out).get("rows", 0) > after_rows, proc=proc)
    return interrupt(proc, sig)


def test_ctrl_c_and_sigterm_commit_the_decoded_items_and_a_rerun_resumes(cli, tmp_path, one_thread):
    """Ctrl-C (SIGINT to the process group) used to exit 1 in silence, losing every decoded item. SIGINT and SIGTERM
    now stop after the item in flight, commit every decoded item, print one line and exit 130 / 143; the rerun
    completes a store equal to an uninterrupted collection (issue 56 §1)."""
    ref, out = tmp_path / "ref.zarr", tmp_path / "s.zarr"
    assert collect(cli, ref).returncode == 0
    done, rows = 0, 0
    for sig, rc in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        line = one_line(stopped_by(sig, out, rows), rc, "interrupted after committing", f"{sig.name}: stopped",
                        "rerun the same command to resume")
        c = commit(out)
        assert done < c["items"] < ITEMS and c["item_rows"] == c["rows"], (line, c)
        assert f"committing {c['items']} of {ITEMS} work items" in line, line
        done, rows = c["items"], c["rows"]
    assert collect(cli, out).returncode == 0
    same_store(ref, out)


def test_a_full_disk_mid_collection_keeps_the_committed_items(cli, small_disk):
    """A disk that fills mid-collection printed 52 lines, and 102 on a rerun while still full. Now one line and
    exit 1 each time, the committed items stay committed and nothing is left half-written; after freeing space the
    rerun completes the store (issue 56 §3)."""
    disk = small_disk(4 << 20)
    out = disk / "s.zarr"
    assert stopped_by(signal.SIGTERM, out)[0] == 143                 # some work items committed
    done = commit(out)["items"]
    assert 0 < done < ITEMS
    filler = fill(disk, 0)
    for _ in range(2):
        one_line(collect(cli, out), 1, "no space left on the device", str(out), "rerun the same command")
        assert commit(out)["items"] == done and not list(disk.rglob("*.partial"))
    filler.unlink()
    assert collect(cli, out).returncode == 0
    assert verify_store(out)["block_lengths"][4]["trajectories"] == 2 * ITEMS


def test_a_full_disk_while_the_store_is_created(cli, tmp_path, small_disk):
    """A disk that fills while `collect` creates its store used to print a 103-line traceback and leave a store
    without a commit record, a `.create-lock` file and advice to delete the shard group. Now, wherever the disk
    fills, one line (exit 1) and nothing half-created: no store, or a whole one that `store verify` says a rerun of
    the same command finishes, which it does (issue 56 §2, §8)."""
    disk = small_disk(2 << 20)
    out = disk / "s.zarr"
    for leave in (0, 24 << 10, 60 << 10, 120 << 10):            # root metadata, token_pca, documents, the shard
        filler = fill(disk, leave)
        one_line(collect(cli, out), 1, "no space left on the device", "rerun the same command")
        assert sorted(p.name for p in disk.iterdir()) in (["filler"], ["filler", "s.zarr"]), list(disk.iterdir())
        assert not list(disk.rglob("*.partial")) and not list(disk.rglob("*create-lock"))
        if out.exists():
            assert open_store(out).attrs["kind"] == "trajectory store"
            shard = out / "B4" / "shard-000"
            assert not shard.exists() or commit(out)["items"] == 0   # a shard group is created whole or not at all
            one_line(cli("store", "verify", "--store", str(out)), 2, "rerun the same `workbench collect` command")
        filler.unlink()
    # a shard group whose creation was killed (no commit record): verify advises the rerun, which completes it
    import zarr

    zarr.open_group(out / "B4" / "shard-000", mode="w").create_group("rows")
    one_line(cli("store", "verify", "--store", str(out)), 2, "shard-000", "rerun the same `workbench collect`")
    assert collect(cli, out).returncode == 0
    assert verify_store(out)["block_lengths"][4]["trajectories"] == 2 * ITEMS
    assert sorted(p.name for p in disk.iterdir()) == ["s.zarr"]        # no lock file beside it


def test_verify_advises_the_rerun_that_finishes_an_interrupted_creation(cli, tmp_path):
    """A store whose creation, or a shard group's, was killed before its first commit: `store verify` advised
    deleting the shard group (or called the path no store at all), while a plain rerun of the same collect command
    completes it (shown above). Now it says so, in one line (issue 56 §8)."""
    import zarr

    from test_store import new_store

    store = new_store(tmp_path / "s.zarr", items=range(4))
    zarr.open_group(store / "B8" / "shard-001", mode="w").create_group("rows")     # killed while creating it
    one_line(cli("store", "verify", "--store", str(store)), 2, "shard-001", "rerun the same `workbench collect`")
    half = zarr.open_group(tmp_path / "half.zarr", mode="w")                         # killed before the root attrs
    half.create_group("B8")
    one_line(cli("store", "verify", "--store", str(tmp_path / "half.zarr")), 2, "creation was interrupted",
             "rerun the same `workbench collect`")


def test_out_a_file_names_the_out_option(cli, tmp_path):
    """`collect --out FILE` told the user to change `--out_dir`, an option collect does not have (issue 56 §4)."""
    f = tmp_path / "notes.txt"
    f.write_text("x")
    for out in (f, f / "s.zarr"):                      # the file itself, or a path under it
        msg = one_line(collect(cli, out), 2, f"{out}", "choose another --out")
        assert "--out_dir" not in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_out_a_symlink_loop_is_one_line(cli, tmp_path):
    """`--out loop` where `ln -s loop loop` was a 20-line FileExistsError (issue 56 §5)."""
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    one_line(collect(cli, loop), 2, f"--out {loop}", "symbolic link", "choose another --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


def test_out_must_be_new_empty_or_a_store_of_recorded_kind(cli, tmp_path):
    """`--out` is refused in one line, before anything is written, unless it is a new path, an empty directory or
    a trajectory store: a workbench run folder, a directory of other files and a path inside a store are refused.
    A store records its kind; one written before it did still opens and resumes (issue 56 §6)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": "train sampler", "settings": {}}))
    one_line(collect(cli, run), 2, "`workbench train sampler` run", "choose another --out")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("a,b\n")
    one_line(collect(cli, mine), 2, "not a trajectory store", "choose another --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]               # no lock files either
    assert [p.name for p in run.iterdir()] == ["run.json"] and [p.name for p in mine.iterdir()] == ["data.csv"]
    empty = tmp_path / "empty"                           # a new store in an existing empty directory
    empty.mkdir()
    assert collect(cli, empty).returncode == 0
    assert open_store(empty).attrs["kind"] == "trajectory store"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "mine", "run"]
    one_line(collect(cli, empty / "B4" / "inner.zarr"), 2, "lies inside the trajectory store", "choose another --out")
    meta = json.loads((empty / "zarr.json").read_text())          # a store from before stores recorded their kind
    del meta["attributes"]["kind"]
    (empty / "zarr.json").write_text(json.dumps(meta))
    assert StoreReader(empty, 4).n_traj == 2 * ITEMS
    assert collect(cli, empty).returncode == 0 and open_store(empty).attrs["kind"] == "trajectory store"


def test_a_copy_of_the_store_is_not_read_twice(cli, tmp_path):
    """`train sampler --extra_stores` given a copy of `--store` (`cp -r`) trained on every row twice. Stores of one
    content identity (a copy, or a collection with the same settings) are now refused in one line naming both
    paths; a store of another policy is still read with it (issue 56 §7)."""
    import zarr

    from test_sampler import make_store
    from workbench.sampler.data import SamplerDataModule

    a = make_store(tmp_path / "a.zarr", items=8, shards=1)
    b = tmp_path / "copy.zarr"
    shutil.copytree(a, b)
    twin = make_store(tmp_path / "twin.zarr", items=4, shards=1)          # the same settings, fewer items
    base = ["train", "sampler", "--config", "workbench/configs/sampler_micro.yaml", "--progress_bar", "false",
            "--max_epochs", "1", "--store", str(a)]
    for dup in (b, twin):
        one_line(cli(*base, "--extra_stores", f"[{dup}]", "--out_dir", str(tmp_path / f"run-{dup.stem}")), 2,
                 str(a), str(dup), "read twice")
    other = make_store(tmp_path / "hybrid.zarr", items=4, shards=1)
    zarr.open_group(other, mode="r+").update_attributes({"policy": "hybrid"})
    both = SamplerDataModule([a, other], 8, batch_size=16, val_fraction=0.3, split_by="traj")
    assert both.n_train_rows + both.n_val_rows == StoreReader([a, other], 8).n_rows

    from workbench.trajectories.store import content_identity

    assert content_identity(a) == content_identity(b) == content_identity(twin) != content_identity(other)
