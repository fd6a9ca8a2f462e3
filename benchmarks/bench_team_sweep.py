"""Trials per minute of ``workbench sweep`` on the shipped tiny model with 1, 2 and 4 worker processes
(``--n_workers``), on the default SQLite file and on a real PostgreSQL server (a throw-away one on the loopback
interface, :mod:`workbench.tune.pg_local`).

One JSON line per storage and worker count:

- ``trials_per_min``: finished trials per minute once the workers run, from the study's own trial times
  (first trial's start to last trial's end): the storage's share of a trial shows here;
- ``wall_s``: the whole command, imports, model loads and the workers' start included.

    python benchmarks/bench_team_sweep.py                       # 1, 2, 4 workers; sqlite and postgresql
    python benchmarks/bench_team_sweep.py --quick               # 1 and 2 workers, fewer trials
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from workbench.tune.pg_local import LocalPostgres

REPO = Path(__file__).resolve().parents[1]


def run(storage: str | None, workers: int, n_trials: int, out: Path, args) -> dict:
    cmd = [sys.executable, "-m", "workbench.cli", "sweep", "--model", "tiny", "--n_trials", str(n_trials),
           "--n_workers", str(workers), "--n_prompts", str(args.n_prompts), "--prompt_len", "32",
           "--gen_len", str(args.gen_len), "--block_lengths", "[4]", "--batch_size", str(args.n_prompts),
           "--precision", "fp32", "--out_dir", str(out), *(["--storage", storage] if storage else [])]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.time() - t0
    if p.returncode:
        raise SystemExit(f"sweep failed ({p.returncode}): {p.stderr[-2000:]}")
    url = storage or f"sqlite:///{out / 'optuna.db'}"
    trials = [t for t in optuna.load_study(study_name="threshold-sweep", storage=url).trials
              if t.state == optuna.trial.TrialState.COMPLETE]
    span = (max(t.datetime_complete for t in trials) - min(t.datetime_start for t in trials)).total_seconds()
    assert re.search(r"finished trials in", p.stdout), p.stdout
    return {"benchmark": "team_sweep", "storage": "postgresql" if storage else "sqlite", "workers": workers,
            "trials": len(trials), "trials_per_min": round(60.0 * len(trials) / span, 1), "wall_s": round(wall, 1),
            "cpus": os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    ap.add_argument("--storages", default="sqlite,postgresql", help="sqlite, postgresql or both")
    ap.add_argument("--n_trials", type=int, default=40)
    ap.add_argument("--n_prompts", type=int, default=2)
    ap.add_argument("--gen_len", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="1 and 2 workers, 16 trials")
    a = ap.parse_args()
    workers = [1, 2] if a.quick else [int(w) for w in a.workers.split(",")]
    n_trials = 16 if a.quick else a.n_trials
    storages = a.storages.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-team-sweep-") as tmp:
        pg = LocalPostgres().start() if "postgresql" in storages else None
        try:
            for storage in storages:
                for w in workers:
                    url = pg.create_database(f"bench_{w}") if storage == "postgresql" else None
                    print(json.dumps(run(url, w, n_trials, Path(tmp) / f"{storage}-{w}", a)), flush=True)
        finally:
            if pg is not None:
                pg.close()


if __name__ == "__main__":
    main()
