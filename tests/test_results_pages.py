"""Results pages (issue 58): the per-model pages, the benchmark page and the methodology page of ``docs/results/``
are what :func:`workbench.results_pages.results_pages` renders from the results table, so they cannot drift; every
figure of the table can be rerun; the figures migrated from the results page's tables are in the table."""
import sys
from pathlib import Path

import pytest

from workbench.results import append_results, latest, load_results
from workbench.results_pages import MAX_CELL, results_pages

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "results"


def test_the_pages_on_disk_are_the_tables():
    sys.path.insert(0, str(ROOT / "scripts"))
    import render_results

    want = render_results.pages()
    assert {p.name for p in PAGES.glob("*.md")} == set(want), "run python scripts/render_results.py"
    for name, text in want.items():
        assert (PAGES / name).read_text() == text, f"docs/results/{name} differs: run python scripts/render_results.py"
    assert render_results.stale_pages() == []
    assert {"smollm2-135m-trimode.md", "tiny.md", "bench.md", "methodology.md"} <= set(want)
    assert "results/*" in (ROOT / "docs" / "results.md").read_text()          # the pages are in the site's toctree


def test_every_figure_carries_its_provenance():
    import datetime
    import re

    from workbench.results import missing_provenance

    rows = load_results()
    for r in rows:
        assert missing_provenance(r) == [], (r["key"], missing_provenance(r))
        assert re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]), r["key"]          # a commit, carried over or not
        assert datetime.date.fromisoformat(r["date"]) <= datetime.date.today()
        v = r["versions"]
        assert v["torch"] and v["workbench"], r["key"]
        if not v.get("transformers"):
            assert "not recorded" in r["carried_over"], r["key"]                # a missing version says why
    assert len({r["date"] for r in rows}) >= 5                                  # measured on their own days
    seeded = [r for r in rows if r["seed"] is not None]
    assert seeded and all(r["key"].split("/")[2] in ("conversion", "sampler", "data_comparison", "lk_align", "ddp")
                          for r in seeded)


def test_every_figure_has_a_key_a_value_and_a_command():
    rows = load_results()
    assert rows
    for r in rows:
        assert r.get("key") and r.get("metric"), r
        assert isinstance(r.get("value"), (bool, int, float)), r
        assert r.get("command"), r["key"]


@pytest.mark.parametrize("key, value", [
    ("results/smollm2-135m-trimode/ss_linear/k8/tau_free", 2.78),
    ("results/smollm2-135m-trimode/ss_linear/k8/tau_real_context", 2.12),
    ("results/smollm2-135m-trimode/sol/B32/sol_B32", 4.16),
    ("results/smollm2-135m-trimode/make_demo/wall_s", 526),
    ("results/tiny/sol/B8/sol_B8", 3.25),
    ("results/tiny/held_out/ar_loss", 0.810),
    ("results/tiny/diffusion/B16/t0.9/real/tpf", 1.552),
])
def test_the_migrated_figures_are_in_the_table(key, value):
    row = latest(load_results())[key]
    assert row["value"] == pytest.approx(value)
    assert row["command"] and row["setting"] and row["date"]


def test_migrated_figures_carry_their_machine_and_target():
    cur = latest(load_results())
    demo = cur["results/smollm2-135m-trimode/make_demo/wall_s"]
    assert demo["commit"] == "3ac8267" and demo["machine"]["cores"] == 2 and demo["command"] == "make demo"
    assert cur["results/smollm2-135m-trimode/ss_linear/k8/tau_free"]["target"] == ">= 2.5"
    assert cur["results/smollm2-135m-trimode/conversion/train_tokens"]["machine"]["gpu"] == "H100"


def _cells(text: str) -> list[str]:
    return [c.strip() for line in text.splitlines() if line.startswith("| ")
            for c in line.strip().strip("|").replace("\\|", "¦").split("|")]


def test_the_renderer_uses_current_figures_and_bounded_cells(tmp_path):
    table = tmp_path / "r.jsonl"
    long_unit = "tokens " * 80
    append_results([{"key": "results/m/a/tpf", "metric": "tpf", "value": 1.5, "command": "workbench a"},
                    {"key": "results/m/a/tpf", "metric": "tpf", "value": 2.25, "command": "workbench a --b 1",
                     "setting": "a | b", "unit": long_unit},
                    {"key": "bench/s/x=1/speed", "metric": "speed", "value": True, "command": "python b.py",
                     "setting": "x=1"}],
                   table)
    pages = results_pages(load_results(table))
    assert set(pages) == {"m", "bench", "methodology"}
    assert "| 2.25 |" in pages["m"] and "| 1.5 |" not in pages["m"]
    assert "## A" in pages["m"] and "Setting: a | b" in pages["m"] and "`workbench a --b 1`" in pages["m"]
    assert "| yes |" in pages["bench"]
    assert max(len(c) for c in _cells(pages["m"])) == MAX_CELL and "…" in pages["m"]      # the long unit, cut


def test_no_cell_of_the_results_pages_is_longer_than_300_characters():
    assert MAX_CELL == 300
    texts = [*results_pages(load_results()).values(), (ROOT / "docs" / "results.md").read_text()]
    assert sum(len(_cells(text)) for text in texts) > 500
    for text in texts:
        assert all(len(c) <= MAX_CELL for c in _cells(text))


def test_one_table_per_task_with_its_setting_above():
    page = results_pages(load_results())["smollm2-135m-trimode"]
    sections = page.split("\n## ")[1:]
    assert len(sections) >= 10
    for section in sections:
        title, body = section.split("\n", 1)
        assert sum(line.startswith("|---") for line in body.splitlines()) == 1, title   # one table
        assert body.index("Setting") < body.index("|---"), title           # the setting above it
    assert len({s.split("\n", 1)[0] for s in sections}) == len(sections)   # one section per task


def test_rows_above_their_ceiling_are_explained_where_they_occur():
    pages = results_pages(load_results())
    board = pages["smollm2-135m-trimode"].split("## Leaderboard, free-running")[1].split("\n## ")[0]
    assert "`ss_quadratic` is above its ceiling" in board and "`deer` is above its ceiling" in board
    assert "`ss_quadratic` is above its ceiling" in pages["tiny"]
    assert "not explained yet" not in "".join(pages.values())
    readme = (ROOT / "README.md").read_text()
    assert "Above the ceiling: `ss_quadratic`" in readme and "`deer` (1.21 > 1.14)" in readme
