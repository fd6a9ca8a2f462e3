"""The documentation site builds with warnings as errors (issue 58 §2): a broken link, a missing page, a bad
cross-reference or a malformed docstring fails here, as in `make docs`. The CLI reference is generated from the
parsers, so every command `workbench --help` lists has its section. The build executes every notebook on the run
folders of `docs/notebook_runs/` (made on tiny) and renders that execution, so the outputs the site shows are the
ones this test produced; a notebook that raises fails the build."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path / "html"
    res = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
                          str(ROOT / "docs"), str(out), "-d", str(tmp_path / "doctrees")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()
    from workbench.cli import _commands

    for command in _commands():
        assert f"## workbench {command}" in cli
    for page in ("index", "getting-started", "concepts", "commands", "models", "results", "architecture",
                 "reference/cli", "reference/api", "development/lab-notebook", "notebooks/sol_analysis",
                 "notebooks/leaderboard", "notebooks/drafter_alignment"):
        assert (out / f"{page}.html").is_file(), page
    api = (out / "reference" / "api.html").read_text()
    assert "workbench.model.families.spec.FamilySpec" in api and "workbench.results.headline_markdown" in api
    for name, plots in (("sol_analysis", 3), ("leaderboard", 1), ("drafter_alignment", 2)):
        page = (out / "notebooks" / f"{name}.html").read_text()
        assert page.count('<img alt="output') >= plots, name          # the executed notebook's figures
