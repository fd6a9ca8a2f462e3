"""Damaged trajectory stores (issue 27 §1-2): every fault is refused in one line by store verify and by every
reader, which share one integrity check."""
from pathlib import Path

import pytest

from test_store import B, new_store, one_line_error
from workbench.trajectories import StoreReader, verify_store


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


@pytest.mark.parametrize("garbage", [b"", b"\xb4\x00garbage", b"{not json"])
def test_garbage_metadata_names_the_file(store, garbage):
    f = Path(store) / f"B{B}/shard-000/rows/entropy/zarr.json"
    f.write_bytes(garbage)
    msg = one_line_error(lambda: verify_store(store), "damaged", "rows/entropy/zarr.json")
    assert "re-run the collection" in msg
    one_line_error(lambda: StoreReader(store, B), "rows/entropy/zarr.json")
