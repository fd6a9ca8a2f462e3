"""``docs/troubleshooting.md`` quotes the errors the workbench prints, verbatim: every ``$ workbench …`` line of its
``console`` blocks is run, in order, in one folder (the page's ``~/project``), and the line the page shows after it
must be the last line the command printed on stderr, with the exit status the page's table gives (2 for bad input;
a command with no line after it must succeed: it makes what the next one needs). The one error no command on tiny
can cause, a CUDA allocation that does not fit, is raised inside a real command. Every error line the page quotes
is one of these, so the page cannot drift from the code.

Offline is simulated for the whole page by ``PIP_NO_INDEX=1`` and an empty model cache."""
import re
import shlex
import shutil
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
#: What the page calls the folder its commands run in.
PROJECT = "~/project"
ERROR_LINE = re.compile(r"^workbench [a-z ]+: error: .+$", re.M)
#: What ``torch`` raises for a CUDA allocation that does not fit (torch 2.x's wording, figures of an 80 GB GPU).
CUDA_OOM = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
            "3.94 GiB is free. Including non-PyTorch memory, this process has 75.24 GiB memory in use. Of the "
            "allocated memory 70.12 GiB is allocated by PyTorch, and 4.61 GiB is reserved by PyTorch but unallocated. "
            "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def _console_steps() -> list[tuple[dict, list[str], str | None]]:
    """``(env, argv, expected line or None)`` for every ``$ workbench …`` line of the page's console blocks."""
    steps = []
    for block in re.findall(r"```console\n(.*?)```", PAGE.read_text(), flags=re.S):
        lines = block.rstrip("\n").split("\n")
        for i, line in enumerate(lines):
            if not line.startswith("$ "):
                continue
            words = shlex.split(line[2:], comments=True)
            env = {}
            while "=" in words[0]:
                k, v = words.pop(0).split("=", 1)
                env[k] = v
            assert words[0] == "workbench", line
            after = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("$ ") else None
            steps.append((env, words[1:], after))
    return steps


def test_every_quoted_error_is_what_its_command_prints(cli, tmp_path, monkeypatch, ar_checkpoint):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copytree(ar_checkpoint, project / "my-llama")          # a plain Llama checkpoint: no mask token
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    (project / "wheels").mkdir()

    def shown(text: str) -> str:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1].replace(str(project), PROJECT) if lines else ""

    steps = _console_steps()
    assert len(steps) >= 14
    produced, wrong = set(), []
    set_before: set[str] = set()
    for env, argv, expected in steps:
        for k in set_before - set(env):
            monkeypatch.delenv(k, raising=False)
        set_before = set(env)
        res = cli(*argv, env=env, cwd=project)
        got = shown(res.stderr)
        if expected is None:
            if res.returncode != 0:
                wrong.append(f"workbench {' '.join(argv)}: exit {res.returncode}: {got}")
            continue
        produced.add(got)
        if (res.returncode, got) != (2, expected):
            wrong.append(f"workbench {' '.join(argv)}: exit {res.returncode}\n  printed: {got}\n  quoted:  {expected}")

    # out of memory: a CUDA allocation failing inside a real leaderboard run
    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError(CUDA_OOM)

    monkeypatch.setattr("workbench.model.load.load_model", no_room)
    res = cli("leaderboard", "--model", "tiny", "--n_prompts", "2", "--gen_len", "8", "--block_lengths", "[8]",
              "--out_dir", "runs/leaderboard", "--progress_bar", "false", cwd=project)
    assert res.returncode == 1, res.stderr[-2000:]
    assert not (project / "runs" / "leaderboard").exists()
    produced.add(shown(res.stderr))

    assert not wrong, "\n".join(wrong)
    quoted = set(ERROR_LINE.findall(PAGE.read_text()))
    assert quoted <= produced, sorted(quoted - produced)
    assert produced <= quoted, sorted(produced - quoted)


def test_the_exit_codes_table_is_the_clis():
    """The page's exit-code table gives the statuses ``workbench.cli.main`` documents."""
    from workbench.cli import main

    table = PAGE.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    statuses = re.findall(r"^\| ([0-9, ]+) \|", table, flags=re.M)
    assert [s.replace(" ", "") for s in statuses] == ["0", "1", "2", "130,143"]
    for code in ("0 ok", "2 a user error", "1 a full disk or out of memory", "130 / 143 interrupted"):
        assert code in " ".join(main.__doc__.split()), code
