"""The leaderboard's markdown table and its frontier plot (TPF against agreement with AR greedy, one panel per
block length, the SOL ceilings as vertical lines)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..evaluation.report import markdown_table  # noqa: E402

COLUMNS = ["decoder", "mode", "block_length", "threshold", "tpf", "tpf_real", "cost_tpf", "tau", "tokens_per_s",
           "speedup", "agree_ar", "prefix_ar", "exact_ar", "lossless", "agree_serial", "introspective_acceptance",
           "repetition", "ws_share",
           "ceiling", "ceiling_tpf", "distance", "pass@1", "aup"]


def leaderboard_markdown(df: pd.DataFrame, ceilings: pd.DataFrame, cfg, n_prompts: int) -> str:
    """``leaderboard.md``: the ceilings, then the table per mode, then rows that did not run."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    source = (f"{n_prompts} {cfg.task} problems ({cfg.problems or 'all'}; up to {cfg.gen_len} tokens each, cut at "
              "the answer's end; pass@1 = share of problems whose program passes its tests; aup = accuracy under "
              "parallelism, d3LLM)" if getattr(cfg, "task", None) else
              f"{n_prompts} held-out prompts from `{cfg.corpus}` ({cfg.split} split), {cfg.gen_len} tokens each")
    lines = ["# Leaderboard", "",
             f"Model `{cfg.model}`, {source}, precision {cfg.precision}, batch {cfg.batch_size}. Real-context rows reset "
             "to the real text every B tokens; free-running rows stop at the tokenizer's end-of-sequence token. "
             "tpf = tokens per target forward; cost_tpf = tokens per one-token-forward of FLOPs (AR = 1); "
             "tau = tokens per draft–verify cycle, bonus token counted; speedup = tokens/s over AR greedy measured "
             "in this process (a run reused from an earlier stage of the same process keeps that stage's time); "
             "lossless = output equal to AR greedy on every prompt; distance = tpf ÷ the SOL ceiling that applies "
             "(free-running).", ""]
    if len(ceilings):
        lines += ["## SOL ceilings (free-running, NLD §4.1)", "",
                  markdown_table(ceilings, ["ceiling", "block_length", "blocks", "sol", "greedy", "greedy_exact",
                                            "forced_per_block"]), ""]
    for mode in ("real", "free"):
        part = ok[ok["mode"] == mode]
        if len(part):
            cols = [c for c in COLUMNS if c in part and part[c].notna().any()]
            cols += sorted((c for c in part if c.startswith("pass@") and c not in cols and part[c].notna().any()),
                           key=lambda c: int(c.split("@")[1]))            # pass@k of the sampling decoders
            lines += [f"## {'Real-context' if mode == 'real' else 'Free-running'}", "",
                      markdown_table(part.sort_values(["decoder", "block_length", "threshold"]), cols), ""]
    bad = df[df["status"] != "ok"] if "status" in df else df.iloc[:0]
    if len(bad):
        lines += ["## Not run", ""] + [f"- `{r['decoder']}` {r['mode']} B={r['block_length']}: {r['status']}"
                                      for _, r in bad.iterrows()] + [""]
    return "\n".join(lines)


def plot_leaderboard(df: pd.DataFrame, ceilings: pd.DataFrame, path: Path) -> None:
    """One panel per block length (free-running rows; real-context if there are none): each decoder a point of
    tpf against agreement with AR greedy; SOL(serial) and SOL(AR greedy) as vertical lines."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    mode = "free" if (ok["mode"] == "free").any() else "real"
    part = ok[(ok["mode"] == mode) & (ok["block_length"] > 0)]
    lengths = sorted(part["block_length"].unique()) or [0]
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.6), squeeze=False)
    ar = ok[(ok["decoder"] == "ar_greedy") & (ok["mode"] == mode)]
    for ax, b in zip(axes[0], lengths):
        sel = part[part["block_length"] == b]
        for name, g in sel.groupby("decoder"):
            ax.plot(g["tpf"], g["agree_ar"], "o-" if len(g) > 1 else "o", label=name, ms=4)
        if len(ar):
            ax.plot([1.0], [1.0], "k*", ms=9, label="ar_greedy")
        for _, c in ceilings[ceilings["block_length"] == b].iterrows() if len(ceilings) else []:
            style = "--" if c["ceiling"] == "serial" else ":"
            ax.axvline(c["sol"], color="grey", ls=style, label=f"SOL({c['ceiling']})")
        ax.set_title(f"B = k = {b} ({mode})")
        ax.set_xlabel("tokens per target forward")
        ax.set_ylabel("agreement with AR greedy")
        ax.set_ylim(-0.02, 1.05)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
