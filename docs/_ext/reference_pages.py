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


#: The subcommands of the commands whose first argument names one (``workbench deer eval``), each with its own options.
#: ``models list`` takes none (and prints the cache's state), so it has no section of its own.
SUBCOMMANDS = {"train": ("lm", "sampler", "lora", "deer"), "store": ("info", "verify"), "sweep": ("sampler",),
               "deer": ("teacher", "eval", "retrain"), "drafter": ("eval", "ablation"),
               "diffuspec": ("proxy", "eval", "tune"), "simsd": ("precision",), "models": ("fetch", "inspect")}


def _commands() -> list[list[str]]:
    """Every command ``workbench --help`` lists, and every subcommand of :data:`SUBCOMMANDS`, as argv: the command
    itself first where it has options of its own (``sweep``, the threshold sweep), then its subcommands."""
    from workbench.cli import USAGE

    cmds: list[list[str]] = []
    for line in USAGE.splitlines():
        if not line.startswith("  "):
            continue
        name = line.split()[0]
        if name in SUBCOMMANDS:
            if name == "sweep" and ["sweep"] not in cmds:
                cmds.append(["sweep"])
            cmds += [[name, sub] for sub in SUBCOMMANDS[name] if [name, sub] not in cmds]
        elif [name] not in cmds:
            cmds.append([name])
    return cmds


def cli_page() -> str:
    from workbench.cli import USAGE

    parts = ["# CLI reference", "", "Generated from the parsers at build time: every command `workbench --help` lists, "
             "and every subcommand, with its `--help`.", "", "```text", USAGE, "```", ""]
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
