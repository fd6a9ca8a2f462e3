"""Helpers of the fault tests: a small full disk (tmpfs; import the `small_disk` fixture into a test module) and a
real signal sent to a CLI subprocess."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size_bytes) -> Path``: a fresh tmpfs of that size mounted in ``tmp_path`` (unmounted afterwards),
    where writes past the size fail with ENOSPC as on a full disk. Skipped where mounting is not permitted."""
    mounts = []

    def make(size: int) -> Path:
        d = tmp_path / f"disk{len(mounts)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounts.append(d)
        return d

    yield make
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` until about ``leave`` bytes are free; returns the filler file (delete it to free space).
    Fails the test if the disk then has more than ``leave`` bytes free (plus one page): a fill that did not
    fill would let a full-disk test pass without a full disk."""
    import shutil

    f = disk / "filler"
    free = shutil.disk_usage(disk).free
    f.write_bytes(b"\0" * max(0, free - leave))
    left = shutil.disk_usage(disk).free
    assert left <= leave + 4096, f"{disk} still has {left} bytes free after filling it to leave {leave}"
    return f


def start_cli(*args: str, cwd=None, env=None) -> subprocess.Popen:
    """The ``workbench`` CLI in a subprocess of its own process group (text pipes), as a terminal starts it."""
    e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", *args], cwd=cwd or REPO, env=e, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(predicate, timeout: float = 240.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``predicate()`` until it is true; fails the test after ``timeout`` seconds or if ``proc`` ends first."""
    t0 = time.time()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended (rc {proc.returncode}) before the condition held:\n{err[-3000:]}")
        if time.time() - t0 > timeout:
            pytest.fail("timed out waiting for the condition")
        time.sleep(0.2)


def interrupt(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 240.0) -> tuple[int, str, str]:
    """Send ``sig`` to the process group of ``proc`` (Ctrl-C reaches the whole group) and wait for it to end;
    returns ``(returncode, stdout, stderr)``."""
    os.killpg(proc.pid, sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the command did not stop within {timeout} s of the signal:\n{err[-3000:]}")
    return proc.returncode, out, err


def stderr_lines(err: str) -> list[str]:
    return [line for line in err.strip().splitlines() if line.strip()]


def one_line(p, rc: int, *needles: str) -> str:
    """Assert that the finished command ``p`` (a CompletedProcess) exited with ``rc`` and wrote exactly one line on
    stderr (:func:`stderr_lines`) holding every one of ``needles``; returns the line."""
    lines = stderr_lines(p.stderr)
    assert p.returncode == rc and len(lines) == 1, (p.returncode, p.stderr[-3000:])
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
