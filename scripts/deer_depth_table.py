"""The DEER depth probe's table (issue 29 §1): validation acceptance per drafter parameter at each probed depth.

Reads ``runs/smollm2_deer/probe_L<N>/metrics.json`` (written by ``scripts/deer_depth_probe.sh``) and prints, per
depth, the drafter's parameters (shared embedding and head included: they run for every drafted token), the
validation τ at k = 8, (τ − 1) per million parameters (the FLOP proxy the choice is made on), the masked
cross-entropy of a block and the probe's wall time. Usage: ``python scripts/deer_depth_table.py [RUNS_DIR]``.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "runs/smollm2_deer")
    rows = []
    for d in root.glob("probe_L*"):
        m = re.fullmatch(r"probe_L(\d+)", d.name)
        f = d / "metrics.json"
        if not (m and f.is_file()):
            continue
        r = json.loads(f.read_text())
        rows.append((int(m.group(1)), r["parameters"], r["val/tau"], r["val/ce_block"], r["global_step"],
                     r["wall_s_this_run"]))
    if not rows:
        print(f"no finished probe under {root}: run scripts/deer_depth_probe.sh STEPS DEPTH...", file=sys.stderr)
        return 1
    print("| layers | parameters (M) | steps | val τ (k = 8) | (τ − 1) per M parameters | masked CE | wall (s) |")
    print("|---|---|---|---|---|---|---|")
    for n, p, tau, ce, steps, wall in sorted(rows):
        print(f"| {n} | {p / 1e6:.1f} | {steps} | {tau:.3f} | {(tau - 1) / (p / 1e6):.4f} | {ce:.3f} | {wall:.0f} |")
    best = max(rows, key=lambda r: ((r[2] - 1) / r[1], -r[0]))
    print(f"\nbest acceptance per parameter: {best[0]} layer(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
