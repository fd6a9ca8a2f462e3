"""``workbench simsd precision``: how far SimSD's one-forward verification is from sequential denoising
(SimSD, arXiv:2606.02544 §4.3, "Precision analysis"), per draft step, with and without the RoPE copy (Table 4).

For each held-out prompt and block, the drafter drafts the block (its order and tokens); then, for every draft
step r, the target's logits at the verification slot of the token decided at step r are compared with the
target's sequential masked forward at that step (tokens decided earlier filled in, the rest masked). Reported
per step: the maximum absolute logit deviation, KL(sequential ‖ verification) in nats, and top-1 agreement.
Files in ``out_dir``: ``precision.parquet`` / ``precision.csv``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from ..model.loading import ModelLoading
from ..utils import writes_out_dir


@dataclass
class PrecisionConfig(ModelLoading):
    """SimSD's verification approximation, measured (arXiv:2606.02544 §4.3)."""

    model: str = "tiny"
    """Diffusion target: 'tiny', 'smollm2-135m-trimode' or a checkpoint directory."""
    drafter: str | None = None
    """Drafter (a DEER drafter directory; default: the one shipped for --model; 'self': the target)."""
    corpus: str = "stdlib"
    """Corpus of the prompts."""
    n_prompts: int = 8
    """Held-out prompts (test split)."""
    prompt_len: int = 128
    """Maximum prompt length in tokens."""
    blocks: int = 2
    """Blocks per prompt (each conditioned on the sequentially decoded previous ones)."""
    block_length: int = 8
    """B = γ."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    out_dir: str = "runs/simsd/precision"
    """Output directory."""


@torch.no_grad()
def step_deviation(target, prefix: list[int], draft: torch.Tensor, steps: torch.Tensor, rope_copy: bool = True
                   ) -> pd.DataFrame:
    """Per block position: its draft step, max ``|Δlogit|``, KL(sequential ‖ verification) and top-1 agreement."""
    from .decode import verify_logits

    dev = target.device
    pre = torch.tensor([prefix], device=dev)
    valid = torch.ones((1, len(prefix)), dtype=torch.bool, device=dev)
    cache = target.new_cache()
    target.extend(pre, cache, valid, logits_to_keep=1)
    par = verify_logits(target, cache, len(prefix), draft, steps, rope_copy)
    rows = []
    kv = torch.ones((1, len(prefix) + len(draft)), dtype=torch.bool, device=dev)
    for k in range(len(draft)):
        block = torch.where(steps < steps[k], draft, torch.full_like(draft, target.mask_token_id))
        seq = target.diffusion_logits(block[None], cache, kv)[0, k].float()
        p, q = par[k], seq
        p[target.mask_token_id] = q[target.mask_token_id] = float("-inf")
        lq, lp = torch.log_softmax(q, -1), torch.log_softmax(p, -1)
        finite = torch.isfinite(lq)
        kl = float((lq.exp()[finite] * (lq[finite] - lp[finite])).sum())
        rows.append({"step": int(steps[k]), "max_abs_logit_dev": float((p - q)[finite].abs().max()), "kl": kl,
                     "top1_agree": float(p.argmax() == q.argmax()), "rope_copy": rope_copy})
    return pd.DataFrame(rows)


@writes_out_dir("simsd")
def run(cfg: PrecisionConfig) -> Path:
    """Measure and write the table; returns ``cfg.out_dir``."""
    from ..assets import shipped_artefact
    from ..corpus import by_split, load_corpus
    from ..deer.block_drafter import BlockDrafter
    from ..deer.models import load_drafter
    from ..evaluation.prompts import make_prompts
    from ..model.load import load_model, resolve_device
    from ..utils import check_out_dir, staged_dir

    check_out_dir(cfg.out_dir, "simsd")
    model, tok, _ = load_model(cfg.model, resolve_device(cfg.device))
    model.eval()
    spec = cfg.drafter or shipped_artefact(cfg.model, "drafter")
    if spec is None:
        raise ValueError(f"no drafter shipped for {cfg.model}; pass --drafter <DEER drafter dir> or 'self'")
    if spec == "self":
        drafter, kind, sep = model, "trimode", None
    else:
        drafter = load_drafter(str(spec), model, tok)
        kind, sep = "deer", drafter.sep_token_id
    b = cfg.block_length
    prompts = make_prompts(by_split(load_corpus(cfg.corpus), "test"), cfg.n_prompts, cfg.prompt_len, b * cfg.blocks,
                           tok)
    frames = []
    for i, pr in enumerate(prompts):
        context = list(pr.prompt)
        for blk in range(cfg.blocks):
            bd = BlockDrafter(drafter, kind, sep)
            logp = bd.propose(context, b, steps=b)
            draft, steps = logp.argmax(-1).to(model.device), bd.last_order.to(model.device)
            for rope in (True, False):
                df = step_deviation(model, context, draft, steps, rope)
                df["prompt"], df["block"] = i, blk
                frames.append(df)
            context += list(pr.real[blk * b:(blk + 1) * b])
    rows = pd.concat(frames, ignore_index=True)
    table = rows.groupby(["rope_copy", "step"]).agg(max_abs_logit_dev=("max_abs_logit_dev", "max"),
                                                    mean_kl=("kl", "mean"), top1_agree=("top1_agree", "mean"),
                                                    n=("kl", "size")).reset_index()
    out = Path(cfg.out_dir)
    with staged_dir(out, kind="simsd", settings=asdict(cfg)) as tmp:
        rows.to_parquet(tmp / "precision_rows.parquet", index=False)
        table.to_parquet(tmp / "precision.parquet", index=False)
        table.to_csv(tmp / "precision.csv", index=False)
        (tmp / "config.json").write_text(json.dumps({**asdict(cfg), "drafter": str(spec)}, indent=2) + "\n")
    return out


def main(argv: list[str]) -> int:
    """``workbench simsd precision --model M [--drafter D] ...``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench simsd precision", PrecisionConfig, argv)
    out = run(cfg)
    print(pd.read_parquet(out / "precision.parquet").to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"results: {out}")
    return 0
