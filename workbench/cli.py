"""``workbench`` command line. Subcommands delegate to stage modules; configuration dataclasses are
turned into options (and YAML ``--config`` files) with jsonargparse.

Every user error (bad path, bad threshold, empty corpus, ...) is printed as one line on stderr and
exits with status 2; nothing half-written is left behind.
"""
from __future__ import annotations

import sys

USAGE = """usage: workbench <command> [options]

commands:
  demo          the main job end to end, with a report (tiny by default; make demo: the converted SmolLM2)
  train lm      train a tri-mode LM (joint AR + block diffusion, NLD §2) with Lightning
  train sampler train the confidence sampler (NLD App. A) on a trajectory store
  train lora    train a LoRA drafter on the diffusion pathway with the LK-hybrid + CE loss (NLD §3.3)
  train deer    DEER two-stage alignment of a diffusion drafter to an AR target (--stage 1|2)
  evaluate      code-continuation evaluation of a checkpoint under several decoding policies (--task humaneval: pass@k)
  decode        decode one prompt with a policy and print the continuation
  collect       collect denoising trajectories into a Zarr store (Lightning predict loop)
  store info    sizes, row counts, label balance of a trajectory store
  store verify  check a trajectory store (shapes, row ranges, labels, NaNs, model match)
  sol           speed-of-light analysis: serial target, greedy, recursive dynamic compaction (NLD §4)
  sweep         Optuna multi-objective threshold study (maximise TPF and accuracy or pass@1), Pareto front
  sweep sampler Optuna study of sampler training hyper-parameters (val AUC, with pruning)
  speculate     linear / quadratic self-speculation decoding evaluation (NLD §3.3, App. C)
  drafter       LoRA drafter evaluation: with/without adapter, loss-variant ablation
  deer          DEER teacher data and DEER speculative decoding evaluation (DEER §3)
  diffuspec     DiffuSpec: the n-gram proxy of CPS, the ablation table, the ADL sweep (DiffuSpec §3)
  simsd         SimSD: precision of the one-forward verification against sequential denoising (SimSD §3)
  leaderboard   every registered decoder on one prompt set, both context modes, against the SOL ceilings (or pass@1)
  models        list the named models and the released dLLM families, fetch a named model, inspect a folder

run 'workbench <command> --help' for the options of a command."""


#: ``workbench train <kind>``: module whose ``main(argv) -> int`` trains that kind of model.
TRAIN_KINDS = {"lm": "workbench.train.lm", "sampler": "workbench.sampler.train",
               "lora": "workbench.drafter.train", "deer": "workbench.deer.train"}


def _cmd_train(argv: list[str]) -> int:
    if not argv or argv[0] not in TRAIN_KINDS:
        print(f"usage: workbench train {'|'.join(TRAIN_KINDS)} --config <yaml> [options]", file=sys.stderr)
        return 2
    import importlib

    return int(importlib.import_module(TRAIN_KINDS[argv[0]]).main(argv[1:]) or 0)


def _cmd_sweep(argv: list[str]) -> int:
    if argv and argv[0] == "sampler":
        from .tune import sampler_hpo

        return sampler_hpo.main(argv[1:])
    from .tune import sweep

    return sweep.main(argv[1:] if argv and argv[0] == "threshold" else argv)


def _module_main(module: str):
    """A command that imports ``module`` only when run and calls its ``main(argv) -> int``."""
    def run(argv: list[str]) -> int:
        import importlib

        return int(importlib.import_module(module).main(argv) or 0)
    return run


def _quiet_libraries() -> None:
    """Keep stderr for our own messages: no weight-loading progress bars or library tips."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*(LeafSpec|litlogger|litmodels|does not have many workers|infer the batch indices"
                                              r"|is_gradient_checkpointing|Experiment logs directory .* exists and is not empty"
                                              r"|resuming from a checkpoint that ended before the epoch ended"
                                              r"|is experimental \(supported from v).*")


#: commands whose stage module is imported only when the command runs (its ``main(argv) -> int``), so a command and
#: its one-line errors never pay for another stage's imports
STAGE_COMMANDS = {
    "demo": "workbench.demo.run", "evaluate": "workbench.evaluation.command", "decode": "workbench.decoding.cli",
    "collect": "workbench.trajectories.collect", "store": "workbench.trajectories.store_cli",
    "sol": "workbench.sol.run", "speculate": "workbench.speculative.cli", "drafter": "workbench.drafter.cli",
    "deer": "workbench.deer.cli", "diffuspec": "workbench.diffuspec.cli", "simsd": "workbench.simsd.cli",
    "models": "workbench.model.named", "leaderboard": "workbench.leaderboard.run"}


#: commands whose first argument names a subcommand (``workbench train lm``, ``workbench store verify``)
SUBCOMMANDS = ("train", "store", "sweep", "deer", "drafter", "models")


def _commands():
    return {"train": _cmd_train, "sweep": _cmd_sweep,
            **{cmd: _module_main(module) for cmd, module in STAGE_COMMANDS.items()}}


def main(argv: list[str] | None = None) -> int:
    """The ``workbench`` command: dispatch ``argv`` (default ``sys.argv[1:]``) to a stage's CLI; returns the exit code
    (0 ok; 2 a user error, in one line; 1 a full disk or out of memory, in one line; 130 / 143 interrupted by SIGINT /
    SIGTERM).
    Signals are handled from the first line on, library imports included (:mod:`workbench.interrupts`)."""
    from .interrupts import Interrupted, raise_on_signals

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    from .model.loading import reset_notices

    reset_notices()                              # a note names a guessed family once per command
    if cmd in SUBCOMMANDS and rest and not rest[0].startswith("-"):
        cmd = f"{cmd} {rest[0]}"                # messages name the whole command: `workbench train lm: ...`
    try:
        with raise_on_signals():                 # SIGINT and SIGTERM unwind as Interrupted
            return _run(cmd, rest)
    except Interrupted as e:
        print(f"workbench {cmd}: {e.message}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"workbench {cmd}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


def _run(cmd: str, rest: list[str]) -> int:
    """Run command ``cmd`` (with its subcommand) on ``rest``; user errors, a full disk and an allocation that does
    not fit (:func:`out_of_memory`) become one line."""
    _quiet_libraries()
    commands = _commands()
    name = cmd.split()[0]
    if name not in commands:
        print(f"workbench: unknown command {name!r}; valid: {', '.join(sorted(commands))}", file=sys.stderr)
        return 2
    from .atomic import disk_full_error, is_disk_full
    from .errors import USER_ERRORS

    try:
        return int(commands[name](rest) or 0)
    except OSError as e:
        if not is_disk_full(e):
            if isinstance(e, USER_ERRORS):
                return _one_line(cmd, e)
            raise
        full = e if e.strerror and "no space left on the device" in e.strerror else disk_full_error(
            getattr(e, "filename", None))
        print(f"workbench {cmd}: error: {full.strerror}", file=sys.stderr)
        return 1
    except USER_ERRORS as e:
        return _one_line(cmd, e)
    except (MemoryError, RuntimeError) as e:
        line = out_of_memory(e)
        if line is None:
            raise
        print(f"workbench {cmd}: error: {line}", file=sys.stderr)
        return 1


#: What to change when a command runs out of memory (every command has some of these options).
OOM_HINT = ("decode or train fewer rows at once (--batch_size; sol: --max_rows), shorten the sequences (--gen_len, "
            "--prompt_len, --seq_len), or store the weights in bf16 (--precision bf16-true)")


def out_of_memory(e: BaseException) -> str | None:
    """The one-line report of an allocation that did not fit, or None when ``e`` is not one: a CUDA
    ``torch.OutOfMemoryError`` (what it tried to allocate and what the device has free, from its message), a CPU
    allocator failure (torch's ``DefaultCPUAllocator`` ``RuntimeError``) or a ``MemoryError`` (numpy's names the
    array). The command exits with status 1, as for a full disk: the input is valid, the machine lacks room."""
    import re

    msg = " ".join(str(e).split())
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ())):
        keep = [x.rstrip(".") for x in re.split(r"(?<=\.) ", msg) if re.match(r"Tried to allocate|GPU \d+ has", x)]
        where = "GPU memory"
        detail = "; ".join(x.replace("Tried", "tried", 1) for x in keep)
    elif isinstance(e, MemoryError):
        where, detail = "memory", msg.rstrip(".")
    elif "DefaultCPUAllocator" in msg:
        found = re.search(r"tried to allocate (\d+) bytes", msg)
        where, detail = "CPU memory", f"tried to allocate {int(found.group(1)):,} bytes" if found else ""
    else:
        return None
    return f"out of {where}{f' ({detail})' if detail else ''}: {OOM_HINT}"


def _one_line(cmd: str, e: BaseException) -> int:
    """Print ``e`` as the command's one-line error; returns the exit status of a user error (2)."""
    print(f"workbench {cmd}: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
