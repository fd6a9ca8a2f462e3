"""Every task block of the README and the main block of every guide runs as written, in order, on a fresh folder
(marker ``docs_run``: ``make test-docs``, which ``.ci/run`` runs).

What the test substitutes, and nothing else (docs/development/testing.md, "The documented commands"):

- a named real model (``workbench models list``: ``smollm2-135m``, ``smollm2-135m-trimode``,
  ``qwen2.5-coder-0.5b-instruct``, …), on the command line or in the config file a command reads, and the ``small``
  preset, become ``tiny``; a released checkpoint folder ``/ckpt/<name>`` becomes a tiny random checkpoint in that
  family's layout (``workbench/model/families/fixtures.py``);
- the sizes (prompts, problems, tokens, steps, trials, answers) and the hardware (one CPU process, dense attention,
  a free port) come from the overlay ``tests/docs_run/<command>.yaml``, appended to the command as its last
  ``--config``: options apply in order, so it overrides what the line and its config file set;
- a PostgreSQL server the docs name is a local one the test starts; ``pip install`` lines are not run.

From the first command of a block that uses what an earlier one produced (a path it wrote, or the model a
``models fetch`` fetched), every later command must use something the block produced before it (a block of
alternatives, such as two leaderboards, uses nothing). Each path a block's ``# output:`` line names must exist
afterwards.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pg_fixtures import pg_server, pg_url  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
OVERLAYS = ROOT / "tests" / "docs_run"
#: Which family's layout a ``/ckpt/<name>`` folder of the docs is written in, by the start of its name.
CHECKPOINT_FAMILIES = {"SDAR": "sdar", "LLaDA": "llada", "Dream": "dream", "I-DLM": "idlm", "Fast-dLLM": "fast_dllm_v2",
                       "NLD": "nld", "Nemotron": "nld", "DiffusionGemma": "diffusion_gemma"}
#: Options whose value names a config file that the command reads, and the command whose overlay that file gets when
#: it configures another command (``drafter ablation --train_config``: the config of each ``train lora`` run).
CONFIG_OPTIONS = {"--config": None, "--train_config": "train_lora"}
#: Folders of the fresh folder that the test itself writes (substituted configs, checkpoint fixtures).
STAGED = ("workbench", "ckpt")


@dataclass
class Block:
    """One ``bash`` block of a page: its command lines and the paths its ``# output:`` line names."""

    page: str
    title: str
    lines: list[str]
    outputs: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page}: {self.title}"


def _lines(body: str) -> list[str]:
    return [ln.split("  #")[0].strip() for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _outputs(body: str) -> list[str]:
    """The paths (under ``runs/`` or ``benchmarks/``) that a block's ``# output:`` comment names."""
    found = []
    for ln in body.splitlines():
        if ln.strip().lower().startswith("# output:"):
            found += [p.rstrip(".,;:)") for p in re.findall(r"(?:runs|benchmarks)/[^\s,;()]+", ln)]
    return found


def readme_blocks(text: str | None = None) -> list[Block]:
    """The ``bash`` blocks of the README's "Tasks" section, each titled by the bold text before it."""
    text = README.read_text() if text is None else text
    tasks = text.split("\n## Tasks", 1)[1].split("\n## ", 1)[0]
    blocks, start = [], 0
    for m in re.finditer(r"```bash\n(.*?)```", tasks, flags=re.S):
        titles = re.findall(r"\*\*([^*]+)\*\*", tasks[start:m.start()])
        blocks.append(Block("README", titles[0].strip(" :") if titles else f"block {len(blocks) + 1}",
                            _lines(m.group(1)), _outputs(m.group(1))))
        start = m.end()
    return blocks


def guide_blocks() -> list[Block]:
    """The first ``bash`` block of every guide that has one (its main block)."""
    blocks = []
    for page in GUIDES:
        text = page.read_text()
        m = re.search(r"```bash\n(.*?)```", text, flags=re.S)
        if m:
            blocks.append(Block(f"docs/guides/{page.name}", page.stem, _lines(m.group(1)), _outputs(m.group(1))))
    return blocks


def all_blocks() -> list[Block]:
    """README blocks, then the guides' main blocks that are not the same commands as a README block."""
    blocks, seen = [], set()
    for b in [*readme_blocks(), *guide_blocks()]:
        if tuple(b.lines) not in seen:
            seen.add(tuple(b.lines))
            blocks.append(b)
    return blocks


# --- substitution -------------------------------------------------------------------------------------------------

def model_names() -> set[str]:
    """Every named real model and shipped adapter model (``workbench models list``)."""
    from workbench.model.named import ADAPTER_MODELS, NAMED_MODELS

    return set(NAMED_MODELS) | set(ADAPTER_MODELS)


def command_key(argv: list[str]) -> str:
    """``train lm`` → ``train_lm``: the words before the first option (and a positional name, for models)."""
    from workbench.cli import SUBCOMMANDS

    words = argv[:2] if argv[0] in SUBCOMMANDS and len(argv) > 1 and not argv[1].startswith("-") else argv[:1]
    return "_".join(words)


def _checkpoint(path: str, fresh: Path) -> str:
    """``/ckpt/<name>`` (or ``family:/ckpt/<name>``) → a tiny random checkpoint of the family in ``fresh/ckpt``."""
    from workbench.model.families.fixtures import write_family_checkpoint

    prefix, _, folder = path.rpartition("/ckpt/")
    family = next((f for start, f in CHECKPOINT_FAMILIES.items() if folder.startswith(start)), None)
    assert family, f"{path}: no family for this checkpoint name; add it to CHECKPOINT_FAMILIES"
    out = fresh / "ckpt" / folder
    if not out.exists():
        write_family_checkpoint(family, out)
    return f"{prefix}ckpt/{folder}"


def _substituted_config(value: str, fresh: Path, overlay: str | None = None) -> None:
    """Write ``fresh/<value>``: the config file ``value`` names with its model names (and the ``small`` preset)
    replaced by ``tiny`` (``package_path`` reads a ``workbench/…`` path from the working directory first), and, for a
    config of another command, that command's ``overlay`` merged in."""
    from workbench.cli_args import package_path

    src = Path(package_path(value))
    names = model_names() | {"small"}
    text = re.sub(r"^(\s*[A-Za-z_]+:\s*)(\S+)(\s*(#.*)?)$",
                  lambda m: m.group(1) + ("tiny" if m.group(2) in names else m.group(2)) + (m.group(3) or ""),
                  src.read_text(), flags=re.M)
    if overlay:
        text = yaml.safe_dump({**yaml.safe_load(text), **yaml.safe_load((OVERLAYS / f"{overlay}.yaml").read_text())})
    out = fresh / value
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def substitute(argv: list[str], fresh: Path, pg_url=None) -> list[str]:
    """The command the test runs for the documented ``argv`` (see the module docstring)."""
    names, out = model_names(), []
    for i, a in enumerate(argv):
        if a in names:
            a = "tiny"
        elif "/ckpt/" in a:
            a = _checkpoint(a, fresh)
        elif a.startswith("postgresql://"):
            a = pg_url()
        elif i and argv[i - 1] == "--dashboard":
            a = "0"                                                   # a free port
        elif i and argv[i - 1] in CONFIG_OPTIONS and a.startswith("workbench/"):
            _substituted_config(a, fresh, CONFIG_OPTIONS[argv[i - 1]])
        out.append(a)
    overlay = OVERLAYS / f"{command_key(argv)}.yaml"
    return [*out, "--config", str(overlay)] if overlay.is_file() else out


# --- what a command reads and writes ------------------------------------------------------------------------------

def _flat(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _flat(v)]
    if isinstance(value, list):
        return [s for v in value for s in _flat(v)]
    return [str(value)] if value is not None else []


def inputs(argv: list[str]) -> set[str]:
    """The values a documented command names: its arguments (lists flattened) and its config files' values."""
    from workbench.cli_args import package_path

    values = []
    for i, a in enumerate(argv):
        if a.startswith("--"):
            continue
        try:
            values += _flat(yaml.safe_load(a)) if a.startswith("[") else [a]
        except yaml.YAMLError:
            values.append(a)
        if i and argv[i - 1] in CONFIG_OPTIONS:
            values += _flat(yaml.safe_load(Path(package_path(a)).read_text()))
    return {os.path.normpath(v) if "/" in v else v for v in values}


def written(fresh: Path) -> set[str]:
    """Every path under ``fresh`` (relative), except what the test staged there."""
    return {str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.relative_to(fresh).parts[0] not in STAGED}


def split_env(line: str) -> tuple[dict, list[str]]:
    """``VAR=value workbench cmd …`` → ``({VAR: value}, [cmd, …])``; a line that runs no workbench command → ``({}, [])``."""
    words, env = shlex.split(line), {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    return (env, words[1:]) if words and words[0] == "workbench" else ({}, [])


# --- the test -----------------------------------------------------------------------------------------------------

def run_block(block: Block, fresh: Path, cli, pg_url=None) -> None:
    """Run ``block`` in ``fresh`` (see the module docstring); fails on the first command that exits non-zero, that does
    not use what the block produced before it (in a chain), or on a missing ``# output:`` path."""
    produced: set[str] = set()
    chain = False                             # from the first command that uses an earlier one's output on
    for line in block.lines:
        env, argv = split_env(line)
        if not argv:                                              # pip install, createdb: the test's environment
            continue
        uses = inputs(argv) & produced
        assert not chain or uses, (f"{block.id}: `{line}` uses nothing the commands before it produced "
                                   f"({', '.join(sorted(p for p in produced if p.count('/') <= 1))})")
        chain = chain or bool(uses)
        before = written(fresh)
        r = cli(*substitute(argv, fresh, pg_url), cwd=fresh, env=env)
        assert r.returncode == 0, f"{block.id}: `{line}` exited {r.returncode}:\n{r.stderr[-2000:]}"
        produced |= {os.path.normpath(p) for p in written(fresh) - before}
        if command_key(argv) == "models_fetch":
            produced.add(argv[2])
    for path in block.outputs:
        assert (fresh / path).exists(), f"{block.id}: its output line names {path}, which the block did not write"


BLOCKS = all_blocks()


@pytest.mark.docs_run
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_the_documented_block_runs_as_written(block, cli, tmp_path, monkeypatch, request):
    fresh = tmp_path / "work"
    fresh.mkdir()
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))  # no model fetched before is at hand

    def pg_url():
        return request.getfixturevalue("pg_url")

    run_block(block, fresh, cli, pg_url)


def test_the_blocks_are_found_and_every_command_has_its_sizes():
    """The suite sees every task block, and each command that takes sizes gets an overlay that exists and parses."""
    titles = [b.title for b in readme_blocks()]
    assert len(titles) >= 9 and any("Convert" in t for t in titles), titles
    assert {b.page for b in guide_blocks()} >= {f"docs/guides/{p}" for p in ("convert.md", "sampler.md", "sol.md")}
    for b in BLOCKS:
        for line in b.lines:
            argv = split_env(line)[1]
            if argv and not argv[0] == "models" and command_key(argv) != "store_verify":
                assert (OVERLAYS / f"{command_key(argv)}.yaml").is_file(), f"{b.id}: no overlay for `{line}`"
    for overlay in OVERLAYS.glob("*.yaml"):
        assert isinstance(yaml.safe_load(overlay.read_text()), dict), overlay


def test_every_task_block_says_where_its_output_lands():
    for b in readme_blocks():
        assert b.outputs, f"README: {b.title}: no '# output:' line naming the file to open"


def test_a_block_that_ignores_what_it_made_fails(tmp_path):
    """The chain rule on a stand-in CLI (it writes ``runs/lm/model`` for ``train``): decoding the trained model passes;
    fetching a base, converting it (the config names the base) and then decoding a named model fails, and so does an
    output line naming a file never written. (A first command's output that the second ignores reads as two
    alternatives: the rule starts at the first command that uses something.)"""
    from types import SimpleNamespace

    seen = []

    def fake_cli(*argv, cwd, env):
        seen.append(argv)
        if argv[0] == "train":
            (cwd / "runs" / "lm" / "model").mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(returncode=0, stderr="")

    train = "workbench train lm --config workbench/configs/micro.yaml --out_dir runs/lm"
    fresh = tmp_path / "a"
    fresh.mkdir()
    run_block(Block("t", "good", ["workbench models fetch smollm2-135m", train,
                                  "workbench decode --model runs/lm/model"], ["runs/lm/model"]), fresh, fake_cli)
    assert seen[0] == ("models", "fetch", "tiny")                          # the named model became tiny
    assert seen[1][-2:] == ("--config", str(OVERLAYS / "train_lm.yaml"))   # the sizes' overlay comes last
    assert (fresh / "workbench" / "configs" / "micro.yaml").is_file()        # the config copy the command reads
    for name, lines, outputs, why in (
            ("decodes the shipped model", ["workbench models fetch smollm2-135m", train.replace(
                "workbench/configs/micro.yaml", "workbench/configs/smollm2_trimode.yaml"),
                "workbench decode --model smollm2-135m-trimode"], [], "uses nothing"),
            ("names a file never written", [train], ["runs/lm/report.md"], "did not write")):
        fresh = tmp_path / name.replace(" ", "_")
        fresh.mkdir()
        with pytest.raises(AssertionError, match=why):
            run_block(Block("t", name, lines, outputs), fresh, fake_cli)
    fresh = tmp_path / "alternatives"                                      # two leaderboards: nothing to chain
    fresh.mkdir()
    run_block(Block("t", "alternatives", ["workbench leaderboard --model tiny", "workbench leaderboard --model "
                                          "smollm2-135m-trimode --dashboard 8080"]), fresh, fake_cli)
    assert seen[-1][:3] == ("leaderboard", "--model", "tiny") and "0" in seen[-1]
