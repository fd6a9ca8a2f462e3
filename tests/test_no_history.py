"""No working history outside the lab notebook: user-facing text (the README, the changelog and citation, the docs
pages but the lab notebook, the notebooks, and everything under ``workbench/``: docstrings that reach ``--help`` and
the API reference, comments, configs, shipped assets' records) names no work session, GPU lease, issue number,
private run folder, private paper file or "this day's machine", and carries no scrubbing artefact ("( H200",
"were were"). ``benchmarks/RESULTS.md`` is the lab notebook and may keep its history."""
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO

#: Working-history words, case-insensitive. "session" only as a work session: a database session, SQLAlchemy's
#: ``scoped_session`` (no word boundary) and a library's ``Session`` class stay allowed.
HISTORY = re.compile(
    r"(?<!database )(?<!\.)\bsessions?\b(?!\()|\blease[sd]?\b|\blent\b|"
    r"\bissues?\s*#?\d+|\bissue's\b|\bthe issue\b|"
    r"\b(?:this|that|same) (?:day|morning|evening|night)(?:'s)?\b|\byesterday\b|"
    r"\b(?:deer|simsd|diffuspec|i-dlm|nemotron[-\w]*|nld)\.txt\b|shared/papers|\.\./shared|/work/|"
    r"\bpack_lease\b|\bworktree\b", re.IGNORECASE)
#: Private run folders a reader never has: a lease's legs, leaderboard grids, seeded demo copies. A run folder that a
#: shipped config writes or reads (``out_dir: runs/train_tiny_leg3``) is the reader's own and allowed.
PRIVATE_RUN = re.compile(r"runs/(?:lb_[\w.-]*|legs?\d*\b|[\w.-]*_leg\d+[a-z]?\b|demo_(?:tiny)?s?\d+\b|"
                         r"[\w.-]*_s\d+\b|[\w.-]*_b32_1blk\b)")
#: A date in the package's code, docstrings and configs, or in the docs pages but the results pages: who did what
#: when belongs in the lab notebook (a figure's measurement date stays, on the results pages and the README's headline).
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
#: What scrubbing left behind in prose: an opening parenthesis followed by a space, a doubled word, ";)".
ARTEFACT = re.compile(r"\( (?=[A-Za-z0-9])|\b([A-Za-z]{3,}) \1\b|;\)")


def user_facing_files() -> list[Path]:
    """Every user-facing text file: README, CHANGELOG, CITATION, docs/ (Markdown and the site's Python, not the lab
    notebook page, the build, and the pages the build generates: the notebooks' executed runs and pages, the CLI and
    API references, whose sources are scanned), notebooks/, and workbench/ (code, configs, assets' JSON records)."""
    out = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "CITATION.cff"]
    for p in sorted((REPO / "docs").rglob("*")):
        if p.suffix in (".md", ".py") and not {"_build", "notebook_runs", "notebooks", "reference"} & set(p.parts) \
                and p.name != "lab-notebook.md":
            out.append(p)
    out += sorted((REPO / "notebooks").glob("*.ipynb"))
    out += [p for p in sorted((REPO / "workbench").rglob("*"))
            if p.suffix in (".py", ".yaml", ".md", ".json") and "__pycache__" not in p.parts]
    return out


def config_run_folders() -> set[str]:
    """``runs/…`` folders that the shipped configs write or read (the reader makes them by running the configs)."""
    folders = set()
    for p in (REPO / "workbench" / "configs").glob("*.yaml"):
        for value in (yaml.safe_load(p.read_text()) or {}).values():
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, str) and v.startswith("runs/"):
                    folders.add(v.split("/")[1])
    return folders


def history_hits(text: str, prose: bool, allowed_runs: set[str] = frozenset(), record: bool = False) -> list[str]:
    """The working-history words, private run folders (not in a ``record``: a shipped asset's JSON provenance keeps
    the folder its run wrote) and (in ``prose``, Markdown) scrubbing artefacts of ``text``."""
    hits = [m.group(0) for m in HISTORY.finditer(text)]
    if not record:
        hits += [m.group(0) for m in PRIVATE_RUN.finditer(text) if m.group(0).split("/")[1] not in allowed_runs]
    if prose:
        hits += [m.group(0) for m in ARTEFACT.finditer(text)]
    return hits


@pytest.mark.parametrize("text", [
    "a lent GPU", "the next lease", "sixteenth session", "as in issue 57 §1", "Issue 26 §3", "the issue's targets",
    "on this day's machine", "the same morning", "(deer.txt §3)", "see simsd.txt",
    "I-DLM (../shared/papers/i-dlm.txt)",
    "`runs/lb_grid_leg3`", "runs/smollm2_store_leg5", "runs/lb_tiny_sol_s13", "pack_lease.sh pack", "session 8",
])
def test_the_scan_flags_working_history(text):
    assert history_hits(text, prose=False), text


@pytest.mark.parametrize("text", [
    "rdb.scoped_session.remove()", "a database session of the lost connection", "requests.Session()",
    "--corpus <dir|.txt|.jsonl>", "a corpus.txt file", "the release's config", "please release the lock",
    "runs/train_tiny_leg3/model", "SmolLM2's greedy answers", "leg 5's adapter", "(H200, 750 steps)",
])
def test_the_scan_allows_legitimate_uses(text):
    allowed = config_run_folders()
    assert "train_tiny_leg3" in allowed
    assert not history_hits(text, prose=True, allowed_runs=allowed), text


def test_a_shipped_record_keeps_its_run_folder_but_not_history_words():
    assert not history_hits('"from_run": "runs/demo_tiny2"', prose=False, record=True)
    assert history_hits('"device": "H100 (lent device machine)"', prose=False, record=True)


@pytest.mark.parametrize("text", ["( H200, 12.3 M tokens", "were were lost", "3 seeds;)"])
def test_the_scan_flags_scrubbing_artefacts(text):
    assert history_hits(text, prose=True)


def test_no_working_history_in_user_facing_text():
    allowed = config_run_folders()
    files = user_facing_files()
    assert len(files) > 200 and REPO / "README.md" in files                  # the scan covers the package too
    assert not any(p.name == "lab-notebook.md" for p in files)
    found = []
    for p in files:
        rel = p.relative_to(REPO)
        dated = rel.suffix in (".py", ".yaml") or (rel.parts[0] == "docs" and rel.parts[1] != "results"
                                                   and rel.name != "results.md")
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            hits = history_hits(line, prose=p.suffix == ".md", allowed_runs=allowed, record=p.suffix == ".json")
            hits += DATE.findall(line) if dated else []
            found += [f"{rel}:{i}: {hit!r}" for hit in hits]
    assert not found, f"{len(found)} working-history hits:\n" + "\n".join(found[:40])


def test_the_docs_link_the_lab_notebook_as_such():
    results = (REPO / "docs" / "results.md").read_text()
    assert "lab notebook" in results and "development/lab-notebook.md" in results
    assert "lab notebook" in (REPO / "README.md").read_text()
