"""The project's own metadata: CITATION.cff names the release (version and date, the package's version), cites the
five papers and the base models by arXiv ID; the README has a BibTeX entry of the same version; the changelog has
the release's entry."""
import re
import tomllib

import yaml

from conftest import REPO

#: The papers the workbench implements and the base models it ships adapters for or measures: arXiv IDs.
CITED = {"2607.05722": "NLD", "2512.15176": "DEER", "2604.11035": "I-DLM", "2606.02544": "SimSD",
         "2510.02358": "DiffuSpec", "2502.02737": "SmolLM2", "2409.12186": "Qwen2.5-Coder"}


def _version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_citation_names_the_release_and_cites_the_papers_and_base_models():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["license"] == "Apache-2.0"
    assert cff["version"] == _version()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(cff["date-released"]))
    ids = {i["value"].removeprefix("arXiv:") for ref in cff["references"] for i in ref["identifiers"]}
    assert ids == set(CITED)
    for ref in cff["references"]:
        assert ref["title"] and ref["authors"] and ref["url"].startswith("https://arxiv.org/abs/")


def test_the_readme_has_a_bibtex_entry_of_this_version():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bibtex\n(.*?)```", readme, re.S)
    assert block and block.group(1).startswith("@software{")
    assert f"version = {{{_version()}}}" in block.group(1)
    for arxiv in ("2607.05722", "2512.15176", "2604.11035", "2606.02544", "2510.02358"):
        assert arxiv in readme                                        # the papers, by arXiv ID


def test_the_changelog_has_the_release():
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(_version())} \(\d{{4}}-\d{{2}}-\d{{2}}\)$", changelog, re.M)
