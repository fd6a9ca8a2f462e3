"""Training step time and peak memory of each attention path at sequence 2048 (issue 24 §2).

One stage-2 step (the dual-stream forward over ``[x_t | x_0]`` = 2 × ``--seq`` tokens, L_AR + 0.3 L_diff,
backward, AdamW) of the ``--preset`` model (default ``small``: 12 layers, d = 768) per path, each path in its own
process so its peak memory is its own:

* ``dense``: additive float masks on SDPA (the preset's attention), the reference;
* ``dense_eager``: additive float masks on transformers' eager attention (scores materialised per layer and head);
* ``sdpa_bool``: boolean masks on SDPA;
* ``flex``: FlexAttention block masks (GPU only: PyTorch 2.13 has no FlexAttention backward on CPU).

Peak memory: CUDA's ``max_memory_allocated`` on GPU; on CPU the process's peak resident set during the timed
steps minus its resident set before them (``VmHWM`` reset through ``/proc/self/clear_refs``), i.e. what a step
adds on top of weights and optimiser state.
Prints one JSON line per path, then the ratios to ``dense`` measured in the same run.
Usage: ``python benchmarks/bench_attention.py [--seq 2048] [--steps 2] [--paths dense sdpa_bool ...]``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _status_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident since the last reset) of this process, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> None:
    """Reset ``VmHWM`` to the current resident set (Linux: ``5`` into ``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_one(path: str, preset: str, seq: int, steps: int, warmup: int, device: str) -> dict:
    """Time ``steps`` training steps of ``path`` after ``warmup`` untimed ones; returns the measurements."""
    import torch
    from transformers import LlamaForCausalLM

    from workbench.model.attention import set_attention_path
    from workbench.model.losses import ar_loss, diffusion_loss, joint_loss
    from workbench.model.noise import mask_blocks
    from workbench.model.presets import preset_config
    from workbench.model.trimode import TriModeLM
    from workbench.tokenizer import MASK_ID

    torch.manual_seed(0)
    model = TriModeLM(LlamaForCausalLM(preset_config(preset)), MASK_ID).to(device)
    if path == "dense_eager":
        model.backbone.set_attn_implementation("eager")
    else:
        set_attention_path(model, path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (1, seq), generator=g).to(device)
    cuda = device == "cuda"
    dtype = torch.bfloat16

    def step():
        noisy, masked, t = mask_blocks(x, 16, MASK_ID, 1e-3, torch.Generator().manual_seed(1))
        with torch.autocast(device, dtype=dtype):
            ar_l, d_l = model.dual_stream_logits(x, noisy, 16)
            loss = joint_loss(ar_loss(ar_l, x), diffusion_loss(d_l, x, masked, t), 0.3)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    if cuda:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        _reset_peak_rss()
        base = _status_mb("VmRSS")
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    s = (time.perf_counter() - t0) / steps
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else _status_mb("VmHWM") - base
    return {"benchmark": "attention", "path": path, "preset": preset, "seq_len": seq, "tokens_per_step": 2 * seq,
            "device": torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)",
            "precision": "bf16 autocast", "s_per_step": round(s, 3), "tokens_per_s": round(2 * seq / s, 1),
            "step_peak_mb": round(peak, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--paths", nargs="+", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)      # child process: run this path only
    a = ap.parse_args()
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    if a.one:
        print(json.dumps(run_one(a.one, a.preset, a.seq, a.steps, a.warmup, device)))
        return
    paths = a.paths or (["dense", "dense_eager", "sdpa_bool"] + (["flex"] if device == "cuda" else []))
    rows = {}
    for p in paths:
        cmd = [sys.executable, __file__, "--one", p, "--preset", a.preset, "--seq", str(a.seq), "--steps",
               str(a.steps), "--warmup", str(a.warmup), "--device", device]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            rows[p] = {"benchmark": "attention", "path": p, "error": tail[:300]}
        else:
            rows[p] = json.loads(r.stdout.strip().splitlines()[-1])
        print(json.dumps(rows[p]), flush=True)
    ref = rows.get("dense", {})
    if "s_per_step" in ref:
        for p, r in rows.items():
            if p != "dense" and "s_per_step" in r:
                print(json.dumps({"benchmark": "attention_ratio", "path": p, "time_over_dense":
                                  round(r["s_per_step"] / ref["s_per_step"], 3), "step_peak_over_dense":
                                  round(r["step_peak_mb"] / max(ref["step_peak_mb"], 1e-9), 3)}))


if __name__ == "__main__":
    main()
