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


def test_the_renderer_uses_current_figures_and_bounded_cells(tmp_path):
    table = tmp_path / "r.jsonl"
    long_cmd = "workbench leaderboard " + "--x 1 " * 80
    append_results([{"key": "results/m/a/tpf", "metric": "tpf", "value": 1.5, "command": "workbench a"},
                    {"key": "results/m/a/tpf", "metric": "tpf", "value": 2.25, "command": long_cmd,
                     "setting": "a | b"},
                    {"key": "bench/s/x/speed", "metric": "speed", "value": True, "command": "python b.py"}],
                   table)
    pages = results_pages(load_results(table))
    assert set(pages) == {"m", "bench", "methodology"}
    assert "| 2.25 |" in pages["m"] and "| 1.5 |" not in pages["m"] and "a \\| b" in pages["m"]
    assert "| yes |" in pages["bench"]
    real = results_pages(load_results())
    for text in [*pages.values(), *real.values()]:
        for line in text.splitlines():
            if line.startswith("| "):
                cells = line.strip().strip("|").replace("\\|", "¦").split("|")
                assert max(len(c.strip()) for c in cells) <= MAX_CELL + 2, line
    assert "…" in pages["m"]
    assert "six clean-clone runs" in real["methodology"] and "AMD EPYC" in real["methodology"]
