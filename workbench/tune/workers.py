"""Several Optuna worker processes on one study (``--n_workers`` of ``workbench sweep`` and ``sweep sampler``).

Optuna's own model of parallel search: every worker opens the same study in a shared storage and calls
``study.optimize``; the storage hands out trial numbers, so no trial is lost or run twice. On one machine
:func:`run_workers` starts the extra workers as spawned processes. On several machines, start the same command
on each, pointing ``--storage`` at one RDB URL (PostgreSQL / MySQL through Optuna's ``RDBStorage``) or one journal
file on a shared file system; give each machine its own ``--seed``.

Each worker gets its own sampler seed (``seed + 7919 · i``: workers that open the study at the same moment see
the same trial count, so equal seeds would propose equal parameters) and ``cores / n_workers`` torch threads.
A worker that dies mid-trial (killed, out of memory) leaves its trial RUNNING; when the others are done, the
parent fails it and enqueues a retry with the same parameters (:func:`~workbench.tune.storage.recover_stale_trials`,
Optuna's ``RetryHeartbeatStaleTrialCallback``) and runs what the study still lacks itself.

``MaxTrialsCallback`` stops each worker once the study holds the wanted number of finished trials; workers
that started their last trials at the same moment may finish up to ``n_workers − 1`` more (Optuna's own
behaviour), none of them a duplicate.

A worker whose database server goes away (PostgreSQL, MySQL) says so in one line and waits for it for a bounded
time (:func:`~workbench.tune.storage.wait_for_storage`): it goes on when the server is back, or ends with one line
and exit status 1 (:class:`~workbench.tune.storage.StorageLost`); the others do the same, each on its own.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable

#: Seed offset between workers.
SEED_STRIDE = 7919


def worker_seed(seed: int | None, index: int) -> int | None:
    """The sampler seed of worker ``index`` (0 = the parent) for a study seeded with ``seed`` (None: OS draws)."""
    return None if seed is None else seed + SEED_STRIDE * index


def _threads(n_workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // n_workers)


#: Seconds the parent waits for the other workers to give up on a lost database server before it stops them.
STORAGE_JOIN_S = 60.0

#: Seconds a ready worker waits for the others before it starts trials alone.
START_TIMEOUT_S = 600.0


class _Ready:
    """``ready()`` of a worker: wait at the start barrier (all workers loaded), at most :data:`START_TIMEOUT_S`."""

    def __init__(self, barrier):
        self.barrier = barrier

    def __call__(self) -> None:
        import threading

        if self.barrier is None:
            return
        try:
            self.barrier.wait(START_TIMEOUT_S)
        except threading.BrokenBarrierError:     # a worker died before it was ready: go on without it
            pass


def _child(work: Callable[[int, Callable[[], None]], None], index: int, n_workers: int, barrier) -> None:
    import sys

    import torch

    from .storage import StorageLost

    torch.set_num_threads(_threads(n_workers))
    _quiet_child()
    try:
        work(index, _Ready(barrier))
    except StorageLost as e:                # its one line, as the command line prints the parent's
        barrier.abort()
        sys.exit(e.report())
    except BaseException:
        barrier.abort()                     # the others do not wait for a worker that will never be ready
        raise


def _quiet_child() -> None:
    """A spawned worker starts a fresh interpreter without the command line's quieting: keep its stderr for its
    own one-line messages (no weight-loading bars, library tips or experimental-API warnings, which the parent
    worker shows once where they matter)."""
    import logging
    import warnings

    import optuna
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=r".*(does not have many workers|LeafSpec|litlogger|litmodels).*")


def run_workers(work: Callable[[int, Callable[[], None]], None], n_workers: int, study=None) -> list[int]:
    """Run ``work(i, ready)`` for ``i = 1 … n_workers − 1`` in spawned processes and ``work(0, ready)`` in this one,
    at the same time; returns the children's exit codes (0: finished; negative: killed by that signal).

    A worker calls ``ready()`` once it is set up (model loaded) and about to start trials: it waits there for the
    others, so that all of them share the study from its first trials (a worker starting seconds late would
    find a small study already done). ``work`` must be picklable (a module-level function or a
    ``functools.partial`` of one). A child that fails does not stop the others. When one died and ``study``
    (the workers' study) is given, its RUNNING trials of dead processes are failed with a retry enqueued
    (:func:`~workbench.tune.storage.recover_stale_trials`), and ``work(0, ready)`` runs once more here to finish
    the study. Raises ``ValueError`` for ``n_workers < 1``.
    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be ≥ 1, got {n_workers}")
    if n_workers == 1:
        work(0, _Ready(None))
        return []
    import torch

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n_workers)
    procs = [ctx.Process(target=_child, args=(work, i, n_workers, barrier), daemon=False)
             for i in range(1, n_workers)]
    for p in procs:
        p.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(_threads(n_workers))
    try:
        work(0, _Ready(barrier))
    except BaseException as e:
        from .storage import StorageLost

        barrier.abort()
        if isinstance(e, StorageLost):      # the others lost the same server: each gives up by itself, in one line
            import time

            deadline = time.monotonic() + STORAGE_JOIN_S
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:                     # this worker failed (or was interrupted): stop the others too
            p.terminate()
        raise
    finally:
        torch.set_num_threads(threads)
        for p in procs:
            p.join()
    exits = [p.exitcode for p in procs]
    if study is not None and any(exits):
        from .storage import recover_stale_trials

        recover_stale_trials(study)
        work(0, _Ready(None))
    return exits


def optimize_until(study, objective, n_trials: int, states: tuple, reconnect_s: float = 0.0,
                   command: str = "workbench") -> None:
    """One worker's share of a study: run ``objective`` until ``study`` holds ``n_trials`` trials in ``states``
    (Optuna's ``MaxTrialsCallback``, so parallel workers stop together), then the retries of dead workers'
    trials still queued (WAITING), so none is left behind.

    On a database server (:func:`~workbench.tune.storage.on_server`), a lost connection is waited out for up to
    ``reconnect_s`` seconds and the work goes on (:func:`~workbench.tune.storage.wait_for_storage`, which raises
    :class:`~workbench.tune.storage.StorageLost` when the server stays away; ``command`` prefixes its lines).

    Ctrl-C or SIGTERM stops the worker after the trial in flight (a trial is the safe point: raising inside one
    could leave Optuna's heartbeat thread running, and the process with it) and raises
    :class:`~workbench.interrupts.Interrupted`; a second signal stops the trial at once (it is failed, and a rerun
    runs the missing trials)."""
    from .storage import connection_lost, on_server, wait_for_storage

    server = on_server(study)
    while True:
        try:
            _optimize_until(study, objective, n_trials, states)
            return
        except Exception as e:  # noqa: BLE001 - only a lost database connection is handled
            if not (server and reconnect_s > 0 and connection_lost(e)):
                raise
            wait_for_storage(study, e, reconnect_s, command)


def _optimize_until(study, objective, n_trials: int, states: tuple) -> None:
    import optuna

    from ..interrupts import Interrupted, deferred_signals

    def count(which) -> int:
        return len(study.get_trials(deepcopy=False, states=which))

    with deferred_signals() as flag:
        def stop_on_signal(study, trial) -> None:
            if flag.signum is not None:
                study.stop()

        missing = n_trials - count(states)
        if missing > 0:
            study.optimize(objective, n_trials=missing,
                           callbacks=[optuna.study.MaxTrialsCallback(n_trials, states=states), stop_on_signal])
        waiting = count((optuna.trial.TrialState.WAITING,))
        if waiting and flag.signum is None:
            study.optimize(objective, n_trials=waiting, callbacks=[stop_on_signal])
    if flag.signum is not None:
        raise Interrupted(flag.signum, "interrupted after the trial in flight")


__all__ = ["run_workers", "optimize_until", "worker_seed", "SEED_STRIDE"]
