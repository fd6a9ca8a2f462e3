"""Model-written code in the sandbox (workbench.tasks.execution): hand-written "solutions" that time out, crash,
exhaust memory, exit, delete or write files outside their folder, read the run folder, signal other processes or
open connections each count as a failed program, and none of them damages the run or the machine."""
import os
import socket
import subprocess
import sys
import time

import pytest

from workbench.tasks import execution
from workbench.tasks.execution import SandboxLimits, UnsafeCodeError, run_program, run_programs

FAST = SandboxLimits(timeout_s=1.0)


def _landlock_abi() -> int:
    return run_program("pass", FAST, confirmed=True).landlock


def test_a_correct_program_passes_and_a_wrong_one_fails():
    assert run_program("def f(x):\n    return x + 1\nassert f(1) == 2", FAST, confirmed=True).passed
    r = run_program("assert 1 + 1 == 3", FAST, confirmed=True)
    assert not r.passed and r.result.startswith("failed")


@pytest.mark.parametrize("program", ["while True:\n    pass", "import time\ntime.sleep(60)"])
def test_a_program_past_its_wall_time_is_killed_and_fails(program):
    t0 = time.perf_counter()
    r = run_program(program, FAST, confirmed=True)
    assert not r.passed and r.result == "timed out"
    assert time.perf_counter() - t0 < FAST.timeout_s + execution.STARTUP_GRACE_S + 2


def test_a_crash_fails_and_names_how_the_process_ended():
    r = run_program("import faulthandler\nfaulthandler._sigsegv()", FAST, confirmed=True)
    assert not r.passed and "SIGSEGV" in r.result


@pytest.mark.parametrize("program", ["x = bytearray(1 << 36)", "x = [0] * (1 << 33)",
                                     "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 26))"])
def test_a_memory_bomb_hits_the_memory_limit_and_fails(program):
    r = run_program(program, SandboxLimits(timeout_s=5.0, memory_mb=512), confirmed=True)
    assert not r.passed and r.result != "passed"


@pytest.mark.parametrize("program", ["import sys\nsys.exit(0)", "raise SystemExit", "exit()",
                                     "import os\nos._exit(0)"])
def test_exiting_early_is_a_failure(program):
    r = run_program(program, FAST, confirmed=True)
    assert not r.passed


def test_deleting_or_writing_files_outside_its_folder_fails_and_the_files_stay(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    victim = run / "results.parquet"
    victim.write_bytes(b"precious")
    attempts = [f"import os\nos.remove({str(victim)!r})",
                f"import pathlib\npathlib.Path({str(victim)!r}).unlink()",
                f"import shutil\nshutil.rmtree({str(run)!r})",
                f"import os\nos.rename({str(victim)!r}, 'stolen')",
                f"open({str(victim)!r}, 'w').write('overwritten')"]
    if _landlock_abi():            # past the in-process guard: a fresh copy of os has remove again; Landlock holds
        attempts += [f"import importlib, os\nimportlib.reload(os)\nos.remove({str(victim)!r})",
                     f"import posix\nposix.unlink({str(victim)!r})"]
    for r in run_programs(attempts, FAST, confirmed=True, progress=False):
        assert not r.passed, r
    assert victim.read_bytes() == b"precious" and sorted(p.name for p in run.iterdir()) == ["results.parquet"]


def test_the_run_folder_cannot_be_read_and_the_environment_is_clean(tmp_path, monkeypatch):
    if not _landlock_abi():
        pytest.skip("no Landlock in this kernel: reads are not confined")
    secret = tmp_path / "run" / "config.json"
    secret.parent.mkdir()
    secret.write_text("{}")
    monkeypatch.setenv("WORKBENCH_TEST_SECRET", "do-not-leak")
    assert not run_program(f"open({str(secret)!r}).read()", FAST, confirmed=True).passed
    home = os.path.expanduser("~")
    env_check = ("import os\n"
                 "assert 'WORKBENCH_TEST_SECRET' not in os.environ and 'PYTHONPATH' not in os.environ\n"
                 f"assert os.environ['HOME'] != {home!r} and 'workbench-exec-' in os.environ['HOME']\n"
                 "open('scratch.txt', 'w').write('mine')\n"          # its own folder is writable
                 "assert open('scratch.txt').read() == 'mine'")
    assert run_program(env_check, FAST, confirmed=True).passed
    # every program gets a fresh folder: the file above is gone
    assert run_program("import os\nassert not os.path.exists('scratch.txt')", FAST, confirmed=True).passed


def test_it_cannot_signal_other_processes(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        attempts = [f"import os\nos.kill({sleeper.pid}, 9)"]
        if _landlock_abi() >= 6:                      # Landlock's signal scope, past the in-process guard
            attempts.append(f"import posix\nposix.kill({sleeper.pid}, 9)")
        for r in run_programs(attempts, FAST, confirmed=True, progress=False):
            assert not r.passed, r
        time.sleep(0.2)
        assert sleeper.poll() is None                 # still alive
    finally:
        sleeper.kill()
        sleeper.wait()


def test_it_cannot_start_processes_or_open_tcp_connections():
    assert not run_program("import os\nwhile True:\n    os.fork()", FAST, confirmed=True).passed
    assert not run_program("import subprocess\nsubprocess.run(['true'])", FAST, confirmed=True).passed
    if _landlock_abi() < 4:
        return
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    try:
        port = server.getsockname()[1]
        r = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", FAST,
                        confirmed=True)
        assert not r.passed and "Permission denied" in r.result
        with pytest.raises(socket.timeout):
            server.accept()                             # nothing connected
    finally:
        server.close()


def test_a_batch_of_hostile_programs_leaves_the_good_ones_passing():
    programs = ["assert sum([1, 2]) == 3", "while True:\n    pass", "import os\nos._exit(3)",
                "x = bytearray(1 << 36)", "assert 'ab'[::-1] == 'ba'", "raise ValueError('no')"]
    results = run_programs(programs, FAST, confirmed=True, workers=3, progress=False)
    assert [r.passed for r in results] == [True, False, False, False, True, False]


def test_nothing_runs_without_confirmation(monkeypatch):
    def no_process(*a, **k):
        raise AssertionError("a process was started without --confirm_run_unsafe_code")

    monkeypatch.setattr(execution.subprocess, "Popen", no_process)
    for call in (lambda: run_program("pass", confirmed=False),
                 lambda: run_programs(["pass"], confirmed=False)):
        with pytest.raises(UnsafeCodeError, match="--confirm_run_unsafe_code"):
            call()


def test_bad_limits_are_one_line_errors():
    with pytest.raises(ValueError, match="timeout"):
        run_programs(["pass"], SandboxLimits(timeout_s=0), confirmed=True)
