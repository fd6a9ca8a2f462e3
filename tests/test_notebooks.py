"""Analysis notebooks execute end to end on a micro run (nbclient, real kernel)."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from workbench.sol.run import SolConfig, run_sol_eval, summarize_blocks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOL_NOTEBOOK = REPO / "notebooks" / "sol_analysis.ipynb"
DRAFTER_NOTEBOOK = REPO / "notebooks" / "drafter_alignment.ipynb"


@pytest.fixture(scope="module")
def sol_run(tmp_path_factory, micro_checkpoint, small_corpus) -> Path:
    """A micro SOL run directory (4 prompts, B ∈ {4, 8, 16})."""
    out = tmp_path_factory.mktemp("sol") / "run"
    run_sol_eval(SolConfig(model=str(micro_checkpoint), corpus=str(small_corpus), n_prompts=4, gen_len=16,
                           block_lengths=[4, 8, 16], device="cpu", out_dir=str(out), progress_bar=False))
    return out


def execute_notebook(path: Path, run_dir: Path, cwd: Path, monkeypatch, env: str = "SOL_RUN_DIR"):
    """Execute a notebook with ``env`` pointing at ``run_dir``; returns the executed notebook."""
    monkeypatch.setenv(env, str(run_dir))   # the kernel inherits os.environ
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def outputs(nb, key=None):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if key is None or key in o.get("data", {})]


def check_sol_notebook(nb):
    assert not [o for o in outputs(nb) if o.get("output_type") == "error"]
    assert len(outputs(nb, "image/png")) >= 3


def test_sol_notebook_structure():
    nb = nbformat.read(SOL_NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.strip() == 'RUN_DIR = "runs/sol"'
    assert "parameters" in code[0].metadata.get("tags", [])
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)   # outputs cleared


def test_sol_notebook_executes(sol_run, tmp_path, monkeypatch):
    nb = execute_notebook(SOL_NOTEBOOK, sol_run, tmp_path, monkeypatch)
    check_sol_notebook(nb)


def test_sol_notebook_degenerate_run(sol_run, tmp_path, monkeypatch):
    """One category, one B, no block without a greedy fallback: the notebook still runs."""
    import pandas as pd

    blocks = pd.read_parquet(sol_run / "blocks.parquet")
    blocks = blocks[(blocks["category"] == blocks["category"].iloc[0]) & (blocks["block_length"] == 8)]
    blocks = blocks.assign(greedy_success=False)
    run = tmp_path / "degenerate"
    run.mkdir()
    blocks.to_parquet(run / "blocks.parquet", index=False)
    summarize_blocks(blocks, ["category", "block_length"]).to_parquet(run / "summary.parquet", index=False)
    overall = summarize_blocks(blocks, ["block_length"])
    assert (overall["greedy_success_rate"] == 0).all() and overall["greedy_acceptance"].notna().all()
    overall.to_parquet(run / "summary_overall.parquet", index=False)
    nb = execute_notebook(SOL_NOTEBOOK, run, tmp_path, monkeypatch)
    check_sol_notebook(nb)


@pytest.fixture(scope="module")
def drafter_run(tmp_path_factory, micro_checkpoint, small_corpus) -> Path:
    """A micro `workbench drafter ablation` run: two loss variants, 2 steps each, both context modes."""
    import os

    from workbench.cli import main as cli_main

    out = tmp_path_factory.mktemp("drafter") / "abl"
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        code = cli_main(["drafter", "ablation", "--train_config", "workbench/configs/lora_micro.yaml",
                         "--init_from", str(micro_checkpoint), "--train_corpus", str(small_corpus),
                         "--losses", "[lk_hybrid_ce, kl]", "--max_steps", "2", "--out_dir", str(out),
                         "--corpus", str(small_corpus), "--n_prompts", "3", "--prompt_len", "24", "--gen_len", "16",
                         "--block_length", "8", "--draft_lengths", "[4]", "--progress_bar", "false",
                         "--device", "cpu"])
    finally:
        os.chdir(cwd)
    assert code == 0
    return out


def test_drafter_notebook_structure():
    nb = nbformat.read(DRAFTER_NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.strip() == 'RUN_DIR = "runs/lora_ablation"'
    assert "parameters" in code[0].metadata.get("tags", [])
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)


def test_drafter_notebook_executes(drafter_run, tmp_path, monkeypatch):
    nb = execute_notebook(DRAFTER_NOTEBOOK, drafter_run, tmp_path, monkeypatch, env="DRAFTER_RUN_DIR")
    assert not [o for o in outputs(nb) if o.get("output_type") == "error"]
    assert len(outputs(nb, "image/png")) >= 5       # gains, per category, per prompt, ablation, validation curves


def test_drafter_notebook_on_single_eval_run(drafter_run, tmp_path, monkeypatch):
    """A plain `workbench drafter eval` directory (no ablation table, no training logs) also works."""
    import shutil

    single = tmp_path / "eval_only"
    shutil.copytree(drafter_run / "eval", single)
    (single / "ablation.parquet").unlink()
    nb = execute_notebook(DRAFTER_NOTEBOOK, single, tmp_path, monkeypatch, env="DRAFTER_RUN_DIR")
    assert not [o for o in outputs(nb) if o.get("output_type") == "error"]
    assert len(outputs(nb, "image/png")) >= 3


LEADERBOARD_NOTEBOOK = REPO / "notebooks" / "leaderboard.ipynb"


def test_leaderboard_notebook_executes(micro_checkpoint, small_corpus, tmp_path, monkeypatch):
    from workbench.leaderboard import LeaderboardConfig
    from workbench.leaderboard.run import run_leaderboard

    nb = nbformat.read(LEADERBOARD_NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.strip() == 'RUN_DIR = "runs/leaderboard"' and "parameters" in code[0].metadata["tags"]
    _, out = run_leaderboard(LeaderboardConfig(model=str(micro_checkpoint), corpus=str(small_corpus), n_prompts=3,
                                               prompt_len=32, gen_len=8, block_lengths=[4, 8], thresholds=[0.9],
                                               decoders=["ar_greedy", "serial", "confidence", "ss_linear"],
                                               precision="fp32", out_dir=str(tmp_path / "lb"), progress_bar=False,
                                               sol_budget=100))
    nb = execute_notebook(LEADERBOARD_NOTEBOOK, out, tmp_path, monkeypatch, env="LEADERBOARD_RUN_DIR")
    assert not [o for o in outputs(nb) if o.get("output_type") == "error"]
    assert len(outputs(nb, "image/png")) >= 2
