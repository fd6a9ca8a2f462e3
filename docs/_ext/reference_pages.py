"""Sphinx extension: writes the CLI reference (every command's ``--help``, from the parsers themselves) and the API
reference (an ``automodule`` page per package) into ``docs/reference/`` before the build reads the sources."""
from __future__ import annotations

import contextlib
import io
import pkgutil
from pathlib import Path


def _help(argv: list[str]) -> str:
    """What ``workbench <argv> --help`` prints (in-process; a parser's --help exits)."""
    from workbench.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main([*argv, "--help"])
        except SystemExit:
            pass
    return out.getvalue().rstrip()


def _commands() -> list[list[str]]:
    """Every command and subcommand ``workbench --help`` lists, as argv."""
    from workbench.cli import USAGE

    cmds = []
    for line in USAGE.splitlines():
        if not line.startswith("  "):
            continue
        words = line.split()
        two = words[:2] if words[0] in ("train", "store", "sweep") and len(words) > 1 and words[1] in (
            "lm", "sampler", "lora", "deer", "info", "verify") else words[:1]
        cmds.append(two)
    return cmds


def cli_page() -> str:
    from workbench.cli import USAGE

    parts = ["# CLI reference", "", "Generated from the parsers at build time: every command `workbench --help` lists, "
             "with its `--help`.", "", "```text", USAGE, "```", ""]
    for argv in _commands():
        parts += [f"## workbench {' '.join(argv)}", "", "```text", _help(argv), "```", ""]
    return "\n".join(parts)


def api_page() -> str:
    import workbench

    mods = sorted(m.name for m in pkgutil.walk_packages(workbench.__path__, "workbench."))
    parts = ["# API reference", "", "Generated from the docstrings at build time, one section per module.", ""]
    for name in ["workbench", *mods]:
        parts += [f"## `{name}`", "", "```{eval-rst}", f".. automodule:: {name}", "   :members:",
                  "   :ignore-module-all:", "```", ""]
    return "\n".join(parts)


def write_pages(app) -> None:
    out = Path(app.srcdir) / "reference"
    out.mkdir(exist_ok=True)
    for name, text in (("cli.md", cli_page()), ("api.md", api_page())):
        f = out / name
        if not f.is_file() or f.read_text() != text:
            f.write_text(text)


def setup(app):
    app.connect("builder-inited", write_pages)
    return {"parallel_read_safe": True, "version": "1"}
