"""Damaged trajectory stores (issue 27 §1-2): every fault is refused in one line by store verify and by every
reader, which share one integrity check."""
from pathlib import Path

import pytest

from conftest import run_cli
from test_store import B, new_store, one_line_error
from workbench.trajectories import StoreError, StoreReader, store_info, verify_store


@pytest.fixture
def store(tmp_path):
    return new_store(tmp_path / "s", items=range(40))


@pytest.mark.parametrize("name", ["rows/step/c/0", "rows/masked/c/0/0", "trajectories/final_ids/c/0/0"])
def test_empty_chunk_file_is_damage(store, name):
    """A shard truncated to 0 bytes used to verify as ok (zarr read it back as zeros): verify and every reader
    now refuse it in one line (issue 27 §1-2, the fault found by the fault-injection pass)."""
    f = Path(store) / f"B{B}/shard-000/{name}"
    f.write_bytes(b"")
    one_line_error(lambda: verify_store(store), "is empty", name.split("/c/")[0])
    one_line_error(lambda: StoreReader(store, B), "is empty", name.split("/c/")[0])


TRUNCATED = ["rows/top_ids/c/0/0/0", "rows/top_probs/c/0/0/0", "trajectories/final_ids/c/0/0", "trajectories/row_end/c/0"]


@pytest.mark.parametrize("name", TRUNCATED)
def test_half_truncated_chunk_is_one_line_from_the_cli(store, name, cli):
    """A chunk file cut to half its bytes (a disk filled mid-write): `workbench store verify` exits 2 with one
    stderr line naming the array (no asyncio task noise), and the reader refuses it too. The first array runs the
    CLI in a process of its own (task noise is printed at interpreter exit), the others in this process."""
    f = Path(store) / f"B{B}/shard-000/{name}"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    r = (run_cli if name == TRUNCATED[0] else cli)("store", "verify", "--store", str(store))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and name.split("/c/")[0] in lines[0], r.stderr[-2000:]
    with pytest.raises(StoreError, match="corrupt"):     # every reader: the sampler's data reads trajectories()
        rd = StoreReader(store, B)
        rd.read_rows(list(range(min(rd.n_rows, 50)))) if name.startswith("rows") else (rd.trajectories(), rd.final_ids())


@pytest.mark.parametrize("garbage", [b"", b"\xb4\x00garbage", b"{not json"])
def test_garbage_metadata_names_the_file(store, garbage):
    f = Path(store) / f"B{B}/shard-000/rows/entropy/zarr.json"
    f.write_bytes(garbage)
    msg = one_line_error(lambda: verify_store(store), "damaged", "rows/entropy/zarr.json")
    assert "re-run the collection" in msg
    one_line_error(lambda: StoreReader(store, B), "rows/entropy/zarr.json")


_RACER = """
import sys
from workbench.trajectories import StoreError, create_store
from test_store import ATTRS
b = int(sys.argv[2])
try:
    create_store(sys.argv[1], {**ATTRS, "block_lengths": [b]}, [b])
    print("created")
except StoreError as e:
    print("refused:", e)
"""


def test_concurrent_creations_one_wins_the_other_is_refused(tmp_path):
    """Two collections started at once into a new path with other block lengths (issue 27 §5): both used to
    return 0, leaving root attributes that disagree with the groups. Now exactly one creates the store, the other
    is refused in one line, and the store verifies."""
    import subprocess
    import sys

    from conftest import REPO

    for trial in range(4):
        path = tmp_path / f"race{trial}.zarr"
        procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(path), str(b)], cwd=REPO / "tests",
                                  stdout=subprocess.PIPE, text=True) for b in (8, 16)]
        outs = [p.communicate()[0].strip() for p in procs]
        assert sorted(o.split(":")[0] for o in outs) == ["created", "refused"], outs
        assert all("\n" not in o for o in outs)
        winner = 8 if outs[0] == "created" else 16
        # the winner's store is whole (only empty: the racers commit no rows)
        one_line_error(lambda: verify_store(path), "holds no rows")
        assert list(store_info(path)["block_lengths"]) == [winner]


def test_verify_checks_recorded_block_lengths_against_groups(tmp_path):
    import zarr

    path = new_store(tmp_path / "s", items=range(4))
    root = zarr.open_group(path, mode="a")
    root.attrs["block_lengths"] = [16]
    one_line_error(lambda: verify_store(path), "records block lengths [16]", "two collections")


def test_empty_and_unfinished_stores_are_not_ok(tmp_path):
    """The store a failed collect leaves behind (created, nothing committed) and a collection stopped part-way
    are not ok for `store verify` (issue 24 §1): one line each that says how to finish it."""
    import numpy as np

    from test_store import ATTRS, write
    from workbench.trajectories import create_store

    empty = tmp_path / "empty"
    create_store(empty, ATTRS, [B], token_pca=np.zeros((20, 44)))
    one_line_error(lambda: verify_store(empty), "holds no rows", "workbench collect")
    part = tmp_path / "part"
    create_store(part, {**ATTRS, "work_items": {str(B): 40}}, [B], token_pca=np.zeros((20, 44)))
    write(part, range(25))
    one_line_error(lambda: verify_store(part), "unfinished collection", "25 of 40", "rerun the same")
    write(part, range(25, 40))
    assert verify_store(part)["block_lengths"][B]["trajectories"] > 0     # finished: ok


def test_collect_on_a_read_only_file_system_is_one_line(tmp_path, capsys, monkeypatch):
    """`collect --out` where the file system refuses writes (EROFS, simulated: this machine runs as root, which
    writes through permission bits) exits 2 with one line and writes nothing (issue 27 §6)."""
    import errno
    import tempfile

    import workbench.utils as utils
    from workbench.cli import main

    ro = tmp_path / "ro"
    ro.mkdir()
    real = tempfile.TemporaryDirectory

    def refusing(*a, dir=None, **kw):
        if dir is not None and Path(dir).resolve().is_relative_to(ro.resolve()):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(utils.tempfile, "TemporaryDirectory", refusing)
    assert main(["collect", "--out", str(ro / "s.zarr"), "--n_prompts", "2", "--block_lengths", "[4]"]) == 2
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Read-only file system" in lines[0], lines
    assert list(ro.iterdir()) == []
