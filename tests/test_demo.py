"""End-to-end: the demo on the micro preset (retrained from scratch). Its time is not asserted here (the suite's
workers share the cores): `make demo` measures the real run's stage times in metrics.json."""
import json

import pandas as pd

from conftest import run_cli


def test_micro_demo_end_to_end(tmp_path, small_corpus):
    out = tmp_path / "demo"
    p = run_cli("demo", "--retrain", "true", "--train_config", "workbench/configs/micro.yaml",
                "--corpus", str(small_corpus), "--out_dir", str(out), "--n_prompts", "4", "--prompt_len", "48",
                "--gen_len", "16", "--block_lengths", "[4,8]", "--thresholds", "[0.5,0.9]", "--heldout_windows", "4",
                "--progress_bar", "false", "--precision", "fp32",
                "--collect_prompts", "30", "--collect_block_lengths", "[4,8]", "--sampler_block_length", "8",
                "--sampler_epochs", "1", "--sampler_max_steps", "10", "--sweep_trials", "2",
                "--sol_prompts", "3", "--sol_gen_len", "16", "--sol_block_lengths", "[4,8]",
                "--lora_steps", "2", "--lora_prompts", "3",
                "--deer_answers", "64", "--deer_stage1_steps", "2", "--deer_stage2_steps", "2", "--deer_prompts", "2",
                "--leaderboard_prompts", "3", "--leaderboard_gen_len", "16", "--leaderboard_thresholds", "[0.9]",
                "--leaderboard_block_lengths", "[4,8]")
    assert p.returncode == 0, p.stderr[-3000:]
    for f in ("report.md", "config.json", "metrics.json", "results.parquet", "summary.parquet", "accuracy_vs_tpf.png"):
        assert (out / f).exists(), f
    assert not (tmp_path / "demo.partial").exists()
    # sub-runs were built inside the staging folder: no text file may still point there
    stale = [str(f) for f in out.rglob("*") if f.suffix in (".json", ".yaml", ".md") and "demo.partial" in f.read_text()]
    assert stale == [], stale
    df = pd.read_parquet(out / "results.parquet")
    assert set(df["policy"]) == {"ar_greedy", "ar_sample", "serial", "confidence"} and set(df["mode"]) == {"real", "free"}
    assert set(df[df["policy"] == "ar_sample"]["mode"]) == {"free"}
    assert (df["tpf"] >= 1.0).all() and (df["tokens"] == 16).all()
    ser = df[df["policy"] == "serial"]
    assert (ser["tpf"] == 1.0).all() and (ser["agree_serial"] == 1.0).all()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["heldout"]["unigram_nats_per_token"] > 0
    assert set(metrics["timing_s"]) == {"corpus", "heldout", "evaluation", "collection", "sampler", "lora", "sol", "deer",
                                        "leaderboard", "total"}
    report = (out / "report.md").read_text()
    assert "Headline: diffusion mode, B = 8" in report and "unigram baseline" in report
    assert {"tpf", "agree_serial"} <= set(metrics["headline"]["real"])  # B = 16 not decoded: the largest B
    # the free-running degeneration check: greedy, diffusion, sampling and real rows, and a verdict
    fr_run = metrics["free_running"]
    assert set(fr_run["rows"]) == {"real continuation", "AR greedy", "diffusion B=8 τ=0.9", "AR sampling T=1"}
    assert "Free-running output" in report and "Target: free-running" in report
    assert "decoding summary" in p.stdout and "agree_serial" in p.stdout  # headers not squeezed into "agr…"
    # the trajectory store section (issue 3)
    assert "Trajectory store" in report and metrics["collection"]["info"]["block_lengths"]["8"]["trajectories"] == 120
    from workbench.trajectories.store import verify_store
    verify_store(out / "trajectories.zarr")
    # the sampler stage (issue 4): AUC table, both frontiers, a resumable sweep
    assert "Confidence sampler" in report and "MLP-only ablation" in report
    for f in ("frontier_agree_serial.png", "frontier_results.parquet", "sweep/pareto.parquet", "sweep/optuna.db"):
        assert (out / f).exists(), f
    fr = pd.read_parquet(out / "frontier_results.parquet")
    assert "Speed of light" in report and (out / "sol" / "blocks.parquet").exists()
    assert {"confidence", "sampler"} <= set(fr["policy"]) and (fr[fr["policy"] == "sampler"]["tpf"] >= 1).all()
    # the LoRA drafter stage (issue 6): with / without table, adapter in peft format, SOL vs linear SS
    assert "LoRA drafter" in report and (out / "lora" / "adapter" / "adapter_config.json").exists()
    gains = pd.read_parquet(out / "lora_eval" / "gains.parquet")
    assert {"base", "lora"} <= set(gains["drafter"]) and (gains["agree_ar"] == 1.0).all()
    sol = pd.read_parquet(out / "sol" / "summary_overall.parquet")
    assert {"linear_ss_acceptance", "linear_ss_lora_acceptance"} <= set(sol.columns)
    # the DEER stage (issue 7): teacher data, both stages, the τ table
    assert "DEER" in report and (out / "deer" / "eval" / "by_category.parquet").exists()
    deer = pd.read_parquet(out / "deer" / "eval" / "by_category.parquet")
    assert {"ar", "deer", "deer_stage1", "linear_ss"} <= set(deer["method"]) and (deer["agree_ar"] == 1.0).all()
    # the leaderboard (issue 21): the report's first table, every decoder, lossless claims hold in fp32
    assert report.index("## Leaderboard") < report.index("## Corpus")
    board = pd.read_parquet(out / "leaderboard" / "leaderboard.parquet")
    ok = board[board["status"] == "ok"]
    assert {"ar_greedy", "confidence", "serial", "ss_linear", "ss_linear+lora", "ss_quadratic", "deer", "sampler"} \
        <= set(ok["decoder"])
    assert ok[ok["claims_lossless"]]["lossless"].all()
    assert "MLP-only ablation scored as NLD App. A" in report


def test_shipped_legs_chain():
    """`demo --retrain` runs the shipped model's legs: each config parses, validates, and every leg after
    the first starts from the previous leg's model (the shipped workbench.json records the same legs)."""
    from pathlib import Path

    from workbench.cli_args import parse_dataclass
    from workbench.demo import SHIPPED_LEGS
    from workbench.train.lm import LMTrainConfig

    root = Path(__file__).resolve().parents[1] / "workbench"
    configs = root / "configs"
    cfgs = [parse_dataclass("train", LMTrainConfig, ["--config", str(configs / n)]) for n in SHIPPED_LEGS]
    for c in cfgs:
        c.validate()
    assert cfgs[0].init_from is None
    for prev, cur in zip(cfgs, cfgs[1:]):
        assert cur.init_from == f"{prev.out_dir}/model", (prev.out_dir, cur.init_from)
    meta = json.loads((root / "assets" / "tiny" / "workbench.json").read_text())
    assert [leg["config"] for leg in meta["legs"]] == [f"configs/{n}" for n in SHIPPED_LEGS]
    assert sum(leg["steps"] for leg in meta["legs"]) == meta["global_step"]
    # each leg stops where the shipped one did (leg 1 on its time limit, with the 8,000-step schedule)
    assert [c.stop_at_step or c.max_steps for c in cfgs] == [leg["steps"] for leg in meta["legs"]]
    # and with the recipe the shipped leg recorded (paths, time limits and the progress bar aside)
    from dataclasses import asdict

    for c, leg in zip(cfgs, meta["legs"]):
        ran = {k: v for k, v in leg["train_config"].items()
               if k not in ("init_from", "out_dir", "max_time", "progress_bar")}
        assert {k: asdict(c)[k] for k in ran} == ran, leg["config"]


def test_interrupted_retrain_resumes(tmp_path, small_corpus, monkeypatch):
    """`demo --retrain` trains outside the demo's staging folder (which a failure deletes): after a crash
    the rerun resumes the leg from its checkpoint, and a finished leg is reused without training."""
    import pytest
    import pytorch_lightning as pl

    from workbench.demo import DemoConfig, _retrain
    from workbench.train import lm

    cfg = DemoConfig(retrain=True, train_config="workbench/configs/micro.yaml", corpus=str(small_corpus),
                     out_dir=str(tmp_path / "demo"), progress_bar=False)
    orig = lm.TriModeLMModule.training_step

    def crash_at_25(self, batch, batch_idx):
        if self.global_step == 25:
            raise RuntimeError("simulated crash")
        return orig(self, batch, batch_idx)

    monkeypatch.setattr(lm.TriModeLMModule, "training_step", crash_at_25)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _retrain(cfg)
    leg = tmp_path / "demo.retrain" / "train"
    assert (leg / "checkpoints" / "last.ckpt").exists()          # step-20 checkpoint survives the crash
    monkeypatch.setattr(lm.TriModeLMModule, "training_step", orig)
    starts, orig_fit = [], pl.Trainer.fit

    def fit(self, *args, **kwargs):
        starts.append(kwargs.get("ckpt_path"))
        return orig_fit(self, *args, **kwargs)

    monkeypatch.setattr(pl.Trainer, "fit", fit)
    model = _retrain(cfg)
    assert starts == [str(leg / "checkpoints" / "last.ckpt")]
    assert json.loads((tmp_path / "demo.retrain" / "train" / "model" / "workbench.json").read_text())["global_step"] == 40
    assert _retrain(cfg) == model and len(starts) == 1               # finished leg reused, not trained again


def test_report_headline_names_a_lossless_claim_that_failed():
    """The headline says which lossless decoders disagreed with AR greedy (a row without a verdict counts)."""
    from workbench.demo.stages.leaderboard import section

    rows = [{"decoder": d, "status": "ok", "mode": "free", "block_length": 4, "threshold": None, "claims_lossless": c,
             "lossless": v, "tpf": 1.0} for d, c, v in (("ar_greedy", True, True), ("ss_linear", True, True),
                                                       ("isd+lora", True, False), ("deer", True, None),
                                                       ("confidence", False, False))]
    st = {"rows": rows, "ceilings": [], "n_prompts": 2, "gen_len": 8, "precision": "fp32"}
    text = "\n".join(section(st))
    assert "NOT every decoder that claims it is lossless: deer, isd+lora" in text
    rows[2]["lossless"] = rows[3]["lossless"] = True
    assert "In fp32, every decoder that claims it is lossless" in "\n".join(section(st))
