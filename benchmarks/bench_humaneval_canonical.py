"""HumanEval's canonical solutions through the workbench's execution path: every one of the 164 must pass, and the
same problems with a hand-broken solution (``raise NotImplementedError``) must all fail. Each program runs in its own
sandboxed process (workbench.tasks.execution), on every core. Prints one JSON line: passed counts and wall times.

This runs model-written-code machinery on the dataset's own solutions, so it needs no confirmation flag of a command;
it calls the sandbox with ``confirmed=True`` itself.
Usage: ``python benchmarks/bench_humaneval_canonical.py [--problems 0:164] [--workers 0]``.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from workbench.tasks.execution import run_programs
from workbench.tasks.humaneval import build_program, select_problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="0:164")
    ap.add_argument("--workers", type=int, default=0, help="processes at a time (0: every core)")
    a = ap.parse_args()
    probs = select_problems(a.problems)
    t = time.perf_counter()
    good = run_programs([build_program(p, p.canonical_solution) for p in probs], confirmed=True, progress=False,
                        workers=a.workers or None)
    t_good = time.perf_counter() - t
    t = time.perf_counter()
    bad = run_programs([build_program(p, "    raise NotImplementedError\n") for p in probs], confirmed=True,
                       progress=False, workers=a.workers or None)
    t_bad = time.perf_counter() - t
    print(json.dumps({"benchmark": "humaneval_canonical", "problems": len(probs), "cores": os.cpu_count(),
                      "canonical_passed": sum(r.passed for r in good), "broken_passed": sum(r.passed for r in bad),
                      "failures": [p.task_id for p, r in zip(probs, good) if not r.passed],
                      "canonical_wall_s": round(t_good, 2), "broken_wall_s": round(t_bad, 2),
                      "landlock_abi": max((r.landlock for r in good), default=0)}))


if __name__ == "__main__":
    main()
