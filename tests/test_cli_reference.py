"""The site's CLI reference (``docs/_ext/reference_pages.py``) shows the options of every command and subcommand."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import reference_pages  # noqa: E402


def _sections() -> dict[str, str]:
    return {s.splitlines()[0]: s for s in re.split(r"^## ", reference_pages.cli_page(), flags=re.M)[1:]}


def test_every_section_shows_options():
    """No command or subcommand is shown only by a usage line that lists its subcommands."""
    for title, text in _sections().items():
        assert re.search(r"^\s+--\w", text, flags=re.M), f"{title}: no options in the reference"


def test_every_subcommand_a_dispatcher_accepts_has_a_section(capsys):
    """The subcommands each dispatcher lists in its own usage (or registry) are the reference's."""
    from workbench.cli import TRAIN_KINDS, main
    from workbench.drafter.cli import SUBCOMMANDS as DRAFTER

    listed = {"train": set(TRAIN_KINDS), "drafter": set(DRAFTER)}
    for cmd in ("deer", "diffuspec", "simsd"):
        main([cmd])
        usage = capsys.readouterr().err
        listed[cmd] = set(re.findall(r"^  (\w+)\s{2,}", usage.split("commands:")[1], flags=re.M))
    sections = _sections()
    for cmd, subs in listed.items():
        assert subs and subs == set(reference_pages.SUBCOMMANDS[cmd]), (cmd, subs)
        for sub in subs:
            assert f"workbench {cmd} {sub}" in sections, f"workbench {cmd} {sub}"
    for name in ("workbench sweep", "workbench sweep sampler", "workbench models fetch", "workbench store verify"):
        assert name in sections, name
    assert "--drafter" in sections["workbench deer eval"] and "--losses" in sections["workbench drafter ablation"]
