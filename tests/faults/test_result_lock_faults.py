"""One writer per result folder (fault pass 3, finding 4: silently wrong). Two leaderboards started 2 s apart into
one folder both exited 0 and printed its path, but it held only the second's results: result folders took no lock,
though docs/architecture.md says one process writes a folder at a time. Now every result command holds its
--out_dir's `.lock` from its first line to its last: a second writer is refused in one line naming the holder's
process, a dead holder's lock is taken over, and a finished folder holds no lock file."""
import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from faultkit import one_line, start_cli, wait_for

TINY = ["--model", "tiny", "--gen_len", "8", "--block_lengths", "[4]", "--device", "cpu", "--progress_bar", "false"]
COMMANDS = {
    "leaderboard": ["leaderboard", *TINY, "--n_prompts", "2", "--thresholds", "[0.5]", "--sol", "false"],
    "sol": ["sol", *TINY, "--n_prompts", "2"],
    "evaluate": ["evaluate", *TINY, "--n_prompts", "2", "--thresholds", "[0.9]", "--modes", "[free]"],
    "deer eval": ["deer", "eval", "--target", "tiny", "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "8",
                  "--device", "cpu", "--progress_bar", "false"],
}



def _holder(code: str) -> subprocess.Popen:
    """A process that runs ``code`` (with ``out`` bound), prints 'locked' and waits to be killed."""
    proc = subprocess.Popen([sys.executable, "-c", code + "\nprint('locked', flush=True)\nimport time\ntime.sleep(300)"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path, cli, command):
    out = tmp_path / "out"
    holder = _holder(f"from workbench.utils import holding\nh = holding({str(out)!r}, {command!r})\nh.__enter__()")
    try:
        one_line(cli(*COMMANDS[command], "--out_dir", out), 2, f"{out} is in use by process {holder.pid}",
                 f"`workbench {command}`")
        assert [p.name for p in out.iterdir()] == [".lock"]        # the holder's; nothing of the refused command
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    if command != "sol":
        return
    p = cli(*COMMANDS[command], "--out_dir", out)                   # the dead holder's lock is taken over
    assert p.returncode == 0, p.stderr[-3000:]
    names = sorted(x.name for x in out.iterdir())
    assert ".lock" not in names and "run.json" in names and not list(tmp_path.glob("out.*"))


def test_two_leaderboards_into_one_folder(tmp_path, cli):
    """The fault pass's case: B, started while A runs, with other settings. B is refused naming A; A finishes, and
    the folder holds A's results."""
    out = tmp_path / "lb"
    a = start_cli(*COMMANDS["leaderboard"], "--out_dir", str(out))
    try:
        wait_for(lambda: f"process {a.pid} " in _text(out / ".lock"), proc=a)
        one_line(cli("leaderboard", *TINY, "--n_prompts", "3", "--thresholds", "[0.7]", "--sol", "false",
                     "--out_dir", out), 2, f"is in use by process {a.pid}")
        stdout, stderr = a.communicate(timeout=600)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == 0, stderr[-3000:]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["n_prompts"] == 2 and cfg["thresholds"] == [0.5]
    assert not (out / ".lock").exists() and not list(tmp_path.glob("lb.*"))


def _text(p) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def test_a_writer_moving_its_results_into_place_is_not_overtaken(tmp_path):
    """Between its two renames a finishing writer's folder is briefly absent and only its staging folder (locked)
    exists; a second writer arriving then withdraws, naming it, and leaves nothing behind."""
    from workbench.utils import RunDirError, holding

    out = tmp_path / "res"
    holder = _holder("from workbench import folder_lock\n"
                     f"assert folder_lock.acquire({str(out) + '.partial'!r}, '`workbench sol`')")
    try:
        with pytest.raises(RunDirError, match=f"in use by process {holder.pid}"):
            with holding(out, "sol"):
                pytest.fail("the block ran")
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_refused_run_leaves_no_folder_behind(tmp_path, cli):
    """The lock is taken before the command's own checks: a command refused after it (here a prompt too long for the
    model) removes the folder, and the parents, it made for the lock."""
    out = tmp_path / "a" / "b" / "sol"
    one_line(cli("sol", *TINY, "--n_prompts", "2", "--prompt_len", "100000", "--out_dir", out), 2)
    assert not (tmp_path / "a").exists()


def test_the_lock_file_names_the_command_and_goes_at_the_end(tmp_path):
    from workbench.utils import holding, staged_dir

    out = tmp_path / "r"
    with holding(out, "sol"):
        text = (out / ".lock").read_text()
        with staged_dir(out, kind="sol") as tmp:                  # the same process: held again, not refused
            (tmp / "x.json").write_text("{}")
            assert (tmp / ".lock").read_text().startswith("process ")
        assert (out / "x.json").exists() and (out / ".lock").exists()
    assert text.startswith("process ") and "`workbench sol`" in text
    assert sorted(p.name for p in out.iterdir()) == [".workbench-run", "run.json", "x.json"]


def test_the_move_into_place_waits_for_a_withdrawing_writer(tmp_path, monkeypatch):
    """The other half of the case above: a second writer that created the results folder (with its lock file) in
    the instant between the finishing writer's renames withdraws 0.3 s later; the finishing writer's rename waits
    for it instead of failing."""
    import threading

    from workbench.utils import _swap_into_place

    new, final = tmp_path / "r.partial", tmp_path / "r"
    new.mkdir()
    (new / "results.json").write_text("{}")
    final.mkdir()
    (final / "old.json").write_text("{}")
    real = type(new).rename
    threads = []

    def rename(self, target):
        if self == new and not threads:             # the second rename: the other writer arrives just before it
            final.mkdir()
            (final / ".lock").write_text("process 1")

            def withdraw():
                time.sleep(0.3)
                (final / ".lock").unlink()
                final.rmdir()
            threads.append(threading.Thread(target=withdraw))
            threads[0].start()
        return real(self, target)

    monkeypatch.setattr(type(new), "rename", rename)
    _swap_into_place(new, final)
    threads[0].join()
    assert sorted(p.name for p in final.iterdir()) == ["results.json"] and not new.exists()
    assert not (tmp_path / "r.old").exists()
