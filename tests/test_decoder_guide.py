"""The decoder decision table of ``docs/concepts.md`` against the registry and the results table: every registered
decoder has its row (and nothing else does), the lossless column and the artefact each needs are the registry's,
and every measured figure is a figure of ``benchmarks/results.jsonl`` for that decoder; "not measured" only where
the results table has none."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "concepts.md"
COLUMNS = ["decoder", "needs (the command that makes it)", "runs on", "lossless", "forwards per cycle",
           "measured (setting)"]


def _table() -> list[dict]:
    """The rows of the decision table, as dicts of :data:`COLUMNS` plus ``names`` (the decoders the row covers)."""
    text = PAGE.read_text()
    section = text.split("### Decision table", 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        assert len(cells) == len(COLUMNS), ln
        row = dict(zip(COLUMNS, cells))
        row["names"] = re.findall(r"`([a-z0-9_]+)`", row["decoder"])
        rows.append(row)
    return rows


def _results() -> list[dict]:
    return [json.loads(line) for line in (ROOT / "benchmarks" / "results.jsonl").read_text().splitlines() if line]


def test_every_registered_decoder_has_one_row():
    from workbench.decoding.registry import load_decoders

    named = [n for row in _table() for n in row["names"]]
    assert len(named) == len(set(named)), "a decoder is listed twice"
    assert sorted(named) == sorted(load_decoders())


def test_lossless_and_needs_are_the_registrys():
    from workbench.decoding.registry import get_decoder

    for row in _table():
        for name in row["names"]:
            spec = get_decoder(name)
            assert row["lossless"].startswith("yes" if spec.lossless else "no"), name
            if spec.needs_hint:                        # the command that makes the artefact it cannot run without
                command = spec.needs_hint.split(" (")[0]
                assert f"`{command}`" in row["needs (the command that makes it)"] or \
                    command.split(" --")[0] in row["needs (the command that makes it)"], (name, command)
        assert all(len(c) <= 250 for c in row.values() if isinstance(c, str)), row["decoder"]


def _figures_of(name: str) -> list[float]:
    """Every figure ``benchmarks/results.jsonl`` holds for decoder ``name`` (a segment of its key)."""
    return [float(r["value"]) for r in _results() if name in r["key"].split("/")
            and isinstance(r["value"], (int, float)) and not isinstance(r["value"], bool)]


@pytest.mark.parametrize("row", _table(), ids=lambda r: r["names"][0])
def test_measured_figures_come_from_the_results_table(row):
    measured = row["measured (setting)"]
    figures = [f for n in row["names"] for f in _figures_of(n)]
    if measured.startswith("not measured"):
        assert not figures, f"{row['names']}: results.jsonl has figures {figures[:4]}"
        return
    quoted = re.findall(r"tpf (\d+\.\d+)|(\d+\.\d+)×", measured.split("(")[0])
    assert quoted, measured
    for tpf, speed in quoted:
        value = tpf or speed
        digits = len(value.split(".")[1])
        assert any(round(f, digits) == float(value) for f in figures), (row["names"], value, figures[:8])
