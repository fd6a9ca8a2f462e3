"""Ctrl-C (SIGINT) and SIGTERM as handled events, the same in every command.

The ``workbench`` command installs :func:`raise_on_signals` for its whole run: either signal raises
:class:`Interrupted` where the program is, which unwinds like Ctrl-C (staged output folders are removed, atomic
writes keep the old file) and reaches the command line, which prints one line and exits with ``128 + signal``
(130 for SIGINT, 143 for SIGTERM). An unfinished command never exits 0.

Long loops that can stop at a safe point (training steps, collection items) use :func:`deferred_signals`
instead: a signal only sets a flag, the loop checks :attr:`SignalFlag.signum` at its next safe point, commits
what is finished (a resumable checkpoint, the completed items), and raises :class:`Interrupted` with a message
such as "interrupted at step 120; rerun the same command to resume". A second signal while the loop is stopping
raises at once.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

#: The signals every command handles.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal. ``signum``: the signal; ``message``: what was kept and how to go on
    (one line, e.g. "interrupted at step 120; rerun the same command to resume"). ``exit_code`` is
    ``128 + signum``. A ``KeyboardInterrupt``, so ``except Exception`` blocks do not swallow it."""

    def __init__(self, signum: int = signal.SIGINT, message: str | None = None):
        self.signum = int(signum)
        self.message = message or (f"interrupted by {signal.Signals(self.signum).name}; nothing half-written was "
                                   "left: rerun the same command")
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise(signum, frame) -> None:
    raise Interrupted(signum)


@contextmanager
def raise_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside the block (the previous handlers come back after it).
    Outside the main thread (where Python cannot set handlers) it does nothing."""
    if not _main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class SignalFlag:
    """What :func:`deferred_signals` yields: ``signum`` is the first signal received (None: none yet)."""

    def __init__(self):
        self.signum: int | None = None

    def handler(self, signum, frame) -> None:
        if self.signum is not None:              # a second signal while stopping: stop at once
            raise Interrupted(signum, f"interrupted again by {signal.Signals(signum).name} while stopping; the "
                                      "last saved state is kept: rerun the same command to resume")
        self.signum = int(signum)

    def install(self) -> dict:
        """Make SIGINT and SIGTERM set this flag; returns the handlers replaced (main thread only)."""
        if not _main_thread():
            return {}
        old = {s: signal.getsignal(s) for s in SIGNALS}
        for s in SIGNALS:
            signal.signal(s, self.handler)
        return old

    @staticmethod
    def restore(old: dict) -> None:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def deferred_signals() -> Iterator[SignalFlag]:
    """Inside the block SIGINT and SIGTERM only set the yielded :class:`SignalFlag` (a second one raises
    :class:`Interrupted`); the caller stops at its next safe point. The previous handlers come back after."""
    flag = SignalFlag()
    old = flag.install()
    try:
        yield flag
    finally:
        SignalFlag.restore(old)


def worker_ignores_signals(worker_id: int = 0) -> None:
    """A DataLoader ``worker_init_fn``: the worker ignores SIGINT and SIGTERM. Ctrl-C reaches every process of the
    terminal's group; a worker it killed would fail the main process's next batch ("DataLoader worker exited
    unexpectedly") before that process reaches its safe point. The main process stops the workers itself."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


class SafeStop(Exception):
    """Raised by a loop inside Lightning at its safe point, after it committed its work (Lightning turns a
    ``KeyboardInterrupt`` raised inside ``fit`` or ``predict`` into ``sys.exit(1)``, so the loop raises this plain
    exception instead; :func:`stopping_at_safe_points` turns it into :class:`Interrupted`)."""

    def __init__(self, signum: int, message: str):
        self.signum, self.message = int(signum), message
        super().__init__(message)


@contextmanager
def stopping_at_safe_points(what: str = "the run") -> Iterator[SignalFlag]:
    """Around ``trainer.fit`` / ``trainer.predict``: :func:`deferred_signals`, and what escapes Lightning turned into
    :class:`Interrupted`: a :class:`SafeStop` (with its message), and the ``SystemExit`` Lightning raises after a
    signal (its ``KeyboardInterrupt`` and SIGTERM paths) with a message saying that the last saved state of
    ``what`` is kept.

    Lightning registers its own SIGTERM handler when a loop starts; the loop's callback calls
    ``flag.install()`` again at its start (``on_train_start``, ``on_predict_start``) so that both signals only set
    the flag (Lightning restores the previous handlers when it tears down)."""
    with deferred_signals() as flag:
        try:
            yield flag
        except SafeStop as e:
            raise Interrupted(e.signum, e.message) from None
        except SystemExit:
            if flag.signum is None:
                raise
            raise Interrupted(flag.signum, f"interrupted by {signal.Signals(flag.signum).name}; the last saved state "
                                           f"of {what} is kept: rerun the same command to resume") from None


__all__ = ["Interrupted", "SIGNALS", "SafeStop", "SignalFlag", "deferred_signals", "raise_on_signals",
           "stopping_at_safe_points", "worker_ignores_signals"]
