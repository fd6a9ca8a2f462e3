"""Results as data (issue 58 §3): the results table's lines, their current values, the leaderboard's and the
benchmarks' figures, and the headline table rendered from them."""
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from workbench.results import (append_results, headline_markdown, latest, leaderboard_figures, load_results,
                               task_markdown)

ROOT = Path(__file__).resolve().parents[1]


def test_append_stamps_and_the_last_line_of_a_key_is_current(tmp_path):
    table = tmp_path / "r.jsonl"
    assert append_results([{"key": "k", "metric": "tpf", "value": 1.5}], table) == 1
    append_results([{"key": "k", "metric": "tpf", "value": 2.0, "command": "workbench x"}], table)
    rows = load_results(table)
    assert [r["value"] for r in rows] == [1.5, 2.0]
    assert rows[0]["date"] and "cpu" in rows[0]["machine"] and rows[0]["machine"]["cores"] >= 1
    assert latest(rows)["k"]["value"] == 2.0
    with pytest.raises(ValueError, match="needs value"):
        append_results([{"key": "k", "metric": "tpf"}], table)
    (table).write_text(table.read_text() + "not json\n")
    with pytest.raises(ValueError, match=r"r.jsonl:3 is not a JSON line"):
        load_results(table)


def _board():
    cfg = SimpleNamespace(model="m", adapter=None, n_prompts=4, split="test", corpus="stdlib", prompt_len=64,
                          gen_len=32, precision="fp32", batch_size=16, block_lengths=[8], thresholds=[0.9])
    df = pd.DataFrame([
        dict(decoder="ar_greedy", mode="free", block_length=0, threshold=math.nan, status="ok", tpf=1.0,
             speedup=1.0, lossless=True, agree_serial=0.4, ceiling=None, ceiling_tpf=math.nan),
        dict(decoder="confidence", mode="free", block_length=8, threshold=0.9, status="ok", tpf=1.5, speedup=0.8,
             lossless=False, agree_serial=0.99, ceiling="serial", ceiling_tpf=3.0),
        dict(decoder="ss_linear", mode="free", block_length=8, threshold=math.nan, status="ok", tpf=2.8,
             speedup=0.9, lossless=True, agree_serial=0.4, ceiling="ar_greedy", ceiling_tpf=2.0),
        dict(decoder="sampler", mode="free", block_length=0, threshold=math.nan, status="missing: x"),
    ])
    return cfg, df


def test_leaderboard_figures_render_the_headline(tmp_path):
    cfg, df = _board()
    figures = leaderboard_figures(df, cfg)
    assert {f["key"] for f in figures} >= {"leaderboard/m/free/confidence/B8/t0.9/tpf",
                                           "leaderboard/m/free/ar_greedy/B0/t/lossless"}
    assert not any("sampler" in f["key"] for f in figures)               # rows that did not run give no figure
    table = tmp_path / "r.jsonl"
    append_results(figures, table)
    md = headline_markdown(load_results(table), "m")
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert rows == ["| `ar_greedy` | 1.00 | 1.00× | yes |  |",
                    "| `ss_linear` | 2.80 | 0.90× | yes | 2.00 (SOL(ar_greedy)) |",
                    "| `confidence` | 1.50 | 0.80× | no | 3.00 (SOL(serial)) |"]
    assert "Setting: `m`, 4 test prompts of stdlib" in md and "workbench leaderboard --model m" in md
    with pytest.raises(ValueError, match="no free-running leaderboard figure of other"):
        headline_markdown(load_results(table), "other")


def test_a_task_run_renders_the_task_table(tmp_path):
    """A HumanEval run's figures: pass@1, tokens/s and the run's wall time per model, none under the free-running
    keys, rendered into the README's task table (the AR row's B as '–')."""
    cfg, df = _board()
    cfg.task, cfg.problems, cfg.prompt_format = "humaneval", None, "chat"
    df = df[df["status"] == "ok"].assign(**{"pass@1": [0.5, 0.25, 0.5], "aup": [50.0, 30.0, 60.0],
                                            "tokens_per_s": [10.0, 7.5, 12.0]})
    figures = leaderboard_figures(df, cfg, wall_s=600.0)
    keys = {f["key"] for f in figures}
    assert "leaderboard/m/humaneval/wall_s" in keys and not any("/free/" in k for k in keys)
    table = tmp_path / "r.jsonl"
    append_results(figures, table)
    md = task_markdown(load_results(table))
    assert [line for line in md.splitlines() if line.startswith("| `")] == [
        "| `m` | all | `ar_greedy` | – | – | 0.500 | 1.00 | 10.0 |",
        "| `m` | all | `confidence` | 8 | 0.9 | 0.250 | 1.50 | 7.5 |",
        "| `m` | all | `ss_linear` | 8 | – | 0.500 | 2.80 | 12.0 |"]
    assert "humaneval problems all (chat format), up to 32 tokens" in md and "wall time 10 min" in md
    # a subset of the problems is a figure of its own: it never replaces the whole task's
    cfg.problems = "HumanEval/0,HumanEval/5"
    sub = leaderboard_figures(df.assign(**{"pass@1": [1.0, 0.0, 1.0]}), cfg)
    assert all("/humaneval[HumanEval-0,HumanEval-5]/" in f["key"] for f in sub)
    append_results(sub, table)
    md = task_markdown(load_results(table))
    assert "| `m` | all | `ar_greedy` | – | – | 0.500 | 1.00 | 10.0 |" in md
    assert "| `m` | HumanEval-0,HumanEval-5 | `ar_greedy` | – | – | 1.000 | 1.00 | 10.0 |" in md
    with pytest.raises(ValueError, match="no gsm8k figure"):
        task_markdown(load_results(table), "gsm8k")


def test_the_recorded_command_reproduces_the_setting():
    """The command a figure records parses back into the leaderboard's batch, decoders, real-context rows and
    artefacts (the settings that change a figure)."""
    import shlex

    from workbench.cli_args import parse_dataclass
    from workbench.leaderboard.config import LeaderboardConfig

    _, df = _board()
    cfg = LeaderboardConfig(model="tiny", n_prompts=4, prompt_len=64, gen_len=32, block_lengths=[8], thresholds=[0.9],
                            batch_size=8, decoders=["ar_greedy", "confidence", "ss_linear"],
                            real_context_decoders=["confidence"], drafter="runs/deer/stage2/drafter")
    command = leaderboard_figures(df, cfg)[0]["command"]
    argv = shlex.split(command)
    assert argv[:2] == ["workbench", "leaderboard"]
    again = parse_dataclass("workbench leaderboard", LeaderboardConfig, argv[2:])
    for name in ("model", "n_prompts", "prompt_len", "gen_len", "block_lengths", "thresholds", "precision",
                 "batch_size", "decoders", "real_context_decoders", "drafter", "sampler"):
        assert getattr(again, name) == getattr(cfg, name), name


def test_benchmark_lines_become_figures():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run_all

    figs = run_all.figures_of("bench_x", "python benchmarks/bench_x.py", {"benchmark": "decode", "policy": "ar",
                                                                         "ms": 12.5, "ratio": 1.02, "batch": 8,
                                                                         "ok": True, "spread": [1, 2]})
    assert sorted(f["metric"] for f in figs) == ["ms", "ratio"]                 # measured: the floats
    assert figs[0]["key"] == "bench/bench_x/batch=8,benchmark=decode,policy=ar/ms"  # the setting names them


def test_appended_figures_carry_versions_and_seed(tmp_path):
    from workbench.results import missing_provenance, versions

    table = tmp_path / "r.jsonl"
    append_results([{"key": "k", "metric": "tpf", "value": 1.5},
                    {"key": "s", "metric": "auc", "value": 0.9, "seed": 3}], table)
    rows = load_results(table)
    assert rows[0]["versions"] == versions() and rows[0]["versions"]["torch"] and rows[0]["versions"]["python"]
    assert rows[0]["seed"] is None and rows[1]["seed"] == 3 and rows[0]["carried_over"] is None
    assert all(missing_provenance(r) == [] for r in rows)
    assert missing_provenance({"date": "2026-11-21", "commit": None, "versions": {}}) == [
        "seed", "commit", "versions.torch", "versions.transformers", "versions.workbench"]
    assert missing_provenance({"date": "2026-11-21", "seed": None, "commit": None, "versions": {},
                               "carried_over": "measured before the table stamped versions"}) == []


def test_a_leaderboard_figure_records_the_command_that_reproduces_it():
    import shlex

    from workbench.cli_args import parse_dataclass
    from workbench.leaderboard.config import LeaderboardConfig
    from workbench.results import dataclass_defaults, options_command

    cfg = LeaderboardConfig(model="m", n_prompts=4, batch_size=8, block_lengths=[8], thresholds=[0.9],
                            decoders=["ar_greedy", "confidence", "ar_sample"], sol=False, out_dir="elsewhere")
    cmd = options_command("workbench leaderboard", cfg, dataclass_defaults(LeaderboardConfig),
                          bare_flags=LeaderboardConfig.BARE_FLAGS)
    assert cmd == ('workbench leaderboard --model m --n_prompts 4 --block_lengths "[8]" --thresholds "[0.9]" '
                   '--decoders "[ar_greedy, confidence, ar_sample]" --sol false --batch_size 8')
    again = parse_dataclass("workbench leaderboard", LeaderboardConfig, shlex.split(cmd)[2:])
    assert {**vars(again), "out_dir": "elsewhere"} == vars(cfg)               # the same run, but where it goes

    cfg_ns, df = _board()
    df = pd.concat([df, pd.DataFrame([dict(decoder="ar_sample", mode="free", block_length=0, threshold=math.nan,
                                           status="ok", tpf=1.0, speedup=0.9, lossless=False, agree_serial=0.4,
                                           ceiling=None, ceiling_tpf=math.nan)])])
    figures = leaderboard_figures(df, cfg_ns, command=cmd, sampling={"ar_sample"})
    assert {f["command"] for f in figures} == {cmd}
    assert {f["seed"] for f in figures if "/ar_sample/" in f["key"]} == {0}
    assert {f["seed"] for f in figures if "/ar_sample/" not in f["key"]} == {None}
    default = leaderboard_figures(df, cfg_ns)[0]["command"]
    assert "--batch_size 16" in default and "--precision fp32" in default


def test_the_headline_explains_rows_above_their_ceiling(tmp_path):
    cfg, df = _board()
    table = tmp_path / "r.jsonl"
    append_results(leaderboard_figures(df, cfg), table)
    md = headline_markdown(load_results(table), "m")
    assert "Above the ceiling: `ss_linear` (2.80 > 2.00): not explained yet" in md   # the board's made-up row
    assert "torch " in md.split("Setting:")[1]                                      # the versions it ran with
