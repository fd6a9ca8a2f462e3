"""The README as a newcomer meets it (issue 58): a front page of bounded size with no working history, a headline
table that is what the results table renders, and task commands that still parse."""
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Words of the project's working history that user docs must not carry (the lab notebook keeps them).
HISTORY = re.compile(r"\b(session|lease|leased|lent|seventeenth|eighteenth|nineteenth|twentieth|"
                     r"runs/legs|runs/lb_|runs/demo_s)\b", re.IGNORECASE)


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 240 and len(text.encode()) < 15_000
    cells = [c for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    assert cells and max(len(c.strip()) for c in cells) <= 200
    assert not HISTORY.search(text), HISTORY.search(text).group(0)
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):           # relative links resolve in the repo
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_the_headline_table_is_the_results_tables():
    sys.path.insert(0, str(ROOT / "scripts"))
    import render_results

    text = README.read_text()
    assert render_results.render(text) == text, "run python scripts/render_results.py"
    block = text.split(render_results.START)[1].split(render_results.END)[0]
    assert block.count("\n| `") >= 4 and "Setting:" in block


def _task_commands(pages=(README,)) -> list[list[str]]:
    """Every ``workbench …`` line of the bash blocks of ``pages``, as argv (without ``workbench``)."""
    text = "\n".join(p.read_text() for p in pages)
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("workbench "):
                cmds.append(shlex.split(line)[1:])
    return cmds


def test_the_readme_has_task_blocks():
    assert len(_task_commands()) >= 12


GUIDES = (README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "guides").glob("*.md")),
          *sorted((ROOT / "docs" / "development").glob("*.md")))


@pytest.mark.parametrize("argv", _task_commands(GUIDES), ids=lambda a: " ".join(a[:2]))
def test_every_readme_and_guide_command_parses(argv, capsys):
    """Each command of the README parses with its options (jsonargparse's ``--print_config`` resolves every option
    and the --config file, then exits 0 without running anything); ``models`` subcommands are checked by name."""
    from workbench.cli import main

    if argv[0] == "models":
        assert argv[1] in ("list", "fetch", "inspect")
        return
    with pytest.raises(SystemExit) as e:
        main([*argv, "--print_config"])
    assert e.value.code in (0, None), capsys.readouterr().err[-400:]


def _notebook_commands() -> list[list[str]]:
    import json

    cmds = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        src = "".join(json.loads(nb.read_text())["cells"][0]["source"])
        found = re.search(r"```bash\n(workbench [^\n]+)\n```", src)
        assert found, f"{nb.name} does not say which command makes the run folder it reads"
        cmds.append(shlex.split(found.group(1))[1:])
    return cmds


@pytest.mark.parametrize("argv", _notebook_commands(), ids=lambda a: " ".join(a[:2]))
def test_every_notebook_names_a_command_that_parses(argv, capsys):
    from workbench.cli import main

    with pytest.raises(SystemExit) as e:
        main([*argv, "--print_config"])
    assert e.value.code in (0, None), capsys.readouterr().err[-400:]
