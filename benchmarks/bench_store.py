"""Trajectory-store throughput and size: the store layer alone on synthetic rows (no model).

Prints one JSON line per measurement (all ratios measured in this one run):

1. ``store_write``: rows/s through ``ShardWriter`` at B = 32 (target >= 200k rows/s);
2. ``store_random_read``: rows/s for batches of 256 random rows via ``StoreReader.read_rows``, and the same
   through plain zarr orthogonal indexing (the reader's fallback path) for comparison; plus sequential
   ``read_row_range`` rows/s;
3. ``store_bytes``: on-disk bytes per row vs the materialised float16 features (144 dims x B x 2 bytes per row;
   target ratio <= 1/8);
4. ``store_verify``: ``verify_store`` wall time and rows/s.

``--scale`` writes >= 10 million rows in bounded memory and reports peak RSS (``resource.getrusage``) after the
write and after verify. Default: 1M rows, well under a minute. Synthetic rows: 64 trajectories per work item,
1..B steps each, Zipf-like top-3 ids over a 32k vocabulary, random probabilities (a pessimistic case for
compression: real top-1 ids follow the text).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from workbench.trajectories import ShardWriter, StoreReader, create_store, store_info, verify_store
from workbench.trajectories.store import DEFAULT_ROWS_PER_CHUNK

FEATURE_DIM = 144
VOCAB = 32000


def synthetic_item(rng: np.random.Generator, B: int, t: int = 64):
    """One work item: ``t`` trajectories (rows, trajs) as ``ShardWriter.append`` expects."""
    steps = rng.integers(1, B + 1, t)
    traj = np.repeat(np.arange(t), steps)
    step = np.concatenate([np.arange(s) for s in steps])
    n = len(traj)
    final = (rng.zipf(1.3, (t, B)) % VOCAB).astype(np.int32)
    top = (rng.zipf(1.3, (n, B, 3)) % VOCAB).astype(np.int32)
    top[..., 0] = np.where(rng.random((n, B)) < 0.5, final[traj], top[..., 0])
    p = np.sort(rng.dirichlet(np.ones(4), (n, B))[..., :3], axis=-1)[..., ::-1]
    masked = rng.random((n, B)) < (1 - step / steps[traj])[:, None]
    rows = {"top_ids": top, "top_probs": p.astype(np.float32), "entropy": rng.gamma(2, 0.5, (n, B)).astype(np.float16),
            "masked": masked, "label": top[..., 0] == final[traj], "traj": traj, "step": step.astype(np.int16)}
    trajs = {"prompt_id": rng.integers(0, 10**6, t), "category": rng.integers(0, 8, t).astype(np.int16),
             "block_index": rng.integers(0, 16, t).astype(np.int32), "final_ids": final}
    return rows, trajs


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def emit(**kw) -> None:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in kw.items()}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows to write (approximate, whole items)")
    ap.add_argument("--scale", action="store_true", help="write >= 10M rows and report peak RSS")
    ap.add_argument("--block_length", type=int, default=32)
    ap.add_argument("--rows_per_chunk", type=int, default=DEFAULT_ROWS_PER_CHUNK)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default=None, help="store directory (default: a temporary one, deleted)")
    a = ap.parse_args()
    tmp = None if a.out else tempfile.mkdtemp(prefix="bench_store_")
    try:
        run(a, Path(a.out or tmp) / "store.zarr")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def run(a: argparse.Namespace, path: Path) -> None:
    B, target = a.block_length, max(a.rows, 10_000_000 if a.scale else 0)
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(0)
    pool = [synthetic_item(rng, B) for _ in range(16)]  # reused round-robin: generation is not timed
    create_store(path, {"model_fingerprint": "bench", "tokenizer_hash": "bench", "categories": [f"c{i}" for i in range(8)]},
                 [B])
    rss0 = peak_rss_mb()

    t0 = time.perf_counter()
    n = item = 0
    with ShardWriter(path, B, rows_per_chunk=a.rows_per_chunk) as w:
        while n < target:
            rows, trajs = pool[item % len(pool)]
            w.append(item, rows, trajs)
            n, item = n + len(rows["traj"]), item + 1
    wall = time.perf_counter() - t0
    emit(benchmark="store_write", block_length=B, rows=n, items=item, wall_s=wall, rows_per_s=n / wall,
         target_rows_per_s=200_000, rows_per_chunk=a.rows_per_chunk, peak_rss_mb=peak_rss_mb(), rss_before_mb=rss0)

    r = StoreReader(path, B)
    r.read_rows(rng.integers(0, r.n_rows, a.batch))  # warm-up (opens metadata)
    def rate(n_batches: int) -> float:
        t = time.perf_counter()
        for _ in range(n_batches):
            r.read_rows(rng.integers(0, r.n_rows, a.batch))
        return n_batches * a.batch / (time.perf_counter() - t)
    fast = rate(40)
    saved, r._fast = r._fast, [dict.fromkeys(f) for f in r._fast]
    slow = rate(3)
    r._fast = saved
    t = time.perf_counter()
    m = min(r.n_rows, 200_000)
    r.read_row_range(0, m)
    seq = m / (time.perf_counter() - t)
    emit(benchmark="store_random_read", batch=a.batch, rows_per_s=fast, zarr_oindex_rows_per_s=slow,
         speedup_vs_zarr=fast / slow, sequential_rows_per_s=seq)

    info = store_info(path)["block_lengths"][B]
    feat = FEATURE_DIM * B * 2
    emit(benchmark="store_bytes", block_length=B, bytes_per_row=info["bytes_per_row"], feature_bytes_per_row=feat,
         ratio=info["bytes_per_row"] / feat, target_ratio=1 / 8, bytes_on_disk=info["bytes_on_disk"],
         label_balance=info["label_balance"])

    t = time.perf_counter()
    verify_store(path, model_fingerprint="bench", tokenizer_hash="bench")
    wall_v = time.perf_counter() - t
    emit(benchmark="store_verify", rows=r.n_rows, wall_s=wall_v, rows_per_s=r.n_rows / wall_v, peak_rss_mb=peak_rss_mb())
    if a.scale:
        emit(benchmark="store_scale", rows=r.n_rows, write_wall_s=wall, verify_wall_s=wall_v,
             peak_rss_mb=peak_rss_mb(), disk_gb=info["bytes_on_disk"] / 1e9)


if __name__ == "__main__":
    main()
