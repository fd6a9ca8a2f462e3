"""scripts/append_leg.py: shipping a continuation run as the next leg of a shipped model."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

_spec = importlib.util.spec_from_file_location("append_leg", Path(__file__).resolve().parents[1] / "scripts" / "append_leg.py")
append_leg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(append_leg)
_spec = importlib.util.spec_from_file_location("plot_legs", Path(__file__).resolve().parents[1] / "scripts" / "plot_legs.py")
plot_legs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot_legs)


def _model_dir(d: Path, meta: dict, steps: list[int], weights: bytes) -> None:
    d.mkdir(parents=True)
    (d / "workbench.json").write_text(json.dumps(meta))
    (d / "model.safetensors").write_bytes(weights)
    pd.DataFrame({"step": steps, "train/loss": [1.0] * len(steps)}).to_csv(d / "training_log.csv", index=False)


def test_append_leg_extends_records_and_swaps_weights(tmp_path):
    shipped, run = tmp_path / "tiny", tmp_path / "run"
    _model_dir(shipped, {"mask_token_id": 256, "global_step": 100, "train_config": {"alpha": 0.3},
                         "final_metrics": {"val/ar_loss": 1.0}}, [9, 99], b"old")
    _model_dir(run / "model", {"mask_token_id": 256, "global_step": 50, "init_from": str(shipped),
                               "train_config": {"alpha": 1.0}, "final_metrics": {"val/ar_loss": 0.9}}, [9, 49], b"new")
    assert append_leg.main(["--shipped", str(shipped), "--run", str(run), "--config", "configs/leg2.yaml"]) == 0
    meta = json.loads((shipped / "workbench.json").read_text())
    assert meta["global_step"] == 150 and meta["final_metrics"] == {"val/ar_loss": 0.9}
    assert [(leg["leg"], leg["config"], leg["steps"]) for leg in meta["legs"]] == [(1, "(first leg)", 100),
                                                                                  (2, "configs/leg2.yaml", 50)]
    assert meta["train_config"] == {"alpha": 0.3}                    # the first leg keeps the top-level recipe
    assert pd.read_csv(shipped / "training_log.csv")["step"].tolist() == [9, 99, 109, 149]
    assert (shipped / "model.safetensors").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "tiny"]   # no staging / backup left behind


@pytest.mark.parametrize("problem", ["missing", "foreign"])
def test_append_leg_refuses_bad_runs(tmp_path, problem, capsys):
    shipped, run = tmp_path / "tiny", tmp_path / "run"
    _model_dir(shipped, {"mask_token_id": 256, "global_step": 100, "final_metrics": {}}, [9], b"old")
    if problem == "foreign":
        _model_dir(run / "model", {"mask_token_id": 3, "global_step": 5, "init_from": "x", "train_config": {},
                                   "final_metrics": {}}, [4], b"new")
    assert append_leg.main(["--shipped", str(shipped), "--run", str(run), "--config", "c.yaml"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert (shipped / "model.safetensors").read_bytes() == b"old"
    assert json.loads((shipped / "workbench.json").read_text())["global_step"] == 100


def _adapter_dir(d: Path, meta: dict, steps: list[int], tau: list[float], weights: bytes) -> None:
    d.mkdir(parents=True)
    (d / "workbench.json").write_text(json.dumps(meta))
    (d / "adapter_model.safetensors").write_bytes(weights)
    (d / "adapter_config.json").write_text("{}")
    pd.DataFrame({"step": steps, "val/tau": tau, "val/tau_tf": tau}).to_csv(d / "training_log.csv", index=False)


def test_append_leg_to_an_adapter_and_plot_acceptance_over_legs(tmp_path):
    """An adapter leg keeps its own log and token count; plot_legs puts every validation on one token axis."""
    shipped, run = tmp_path / "adapter", tmp_path / "run"
    leg1 = {"leg": 1, "config": "c1.yaml", "steps": 10, "train_tokens": 10 * 32 * 512, "log": "training_log.csv"}
    _adapter_dir(shipped, {"mask_token_id": 7, "global_step": 10, "base_fingerprint": "f1", "legs": [leg1],
                           "final_metrics": {}}, [4, 9], [1.5, 2.0], b"old")
    meta2 = {"mask_token_id": 7, "global_step": 6, "base_fingerprint": "f1", "init_from": "base",
             "train_config": {"batch_size": 8, "seq_len": 256}, "final_metrics": {"val/tau": 2.2}}
    _adapter_dir(run / "model", meta2, [2, 5], [2.1, 2.2], b"new")
    assert append_leg.main(["--shipped", str(shipped), "--run", str(run), "--config", "c2.yaml",
                            "--device", "H100"]) == 0
    meta = json.loads((shipped / "workbench.json").read_text())
    assert meta["legs"][1]["train_tokens"] == 6 * 8 * 256 and meta["legs"][1]["log"] == "training_log_leg2.csv"
    assert meta["legs"][1]["device"] == "H100" and "device" not in meta["legs"][0]
    assert (shipped / "adapter_model.safetensors").read_bytes() == b"new"
    assert pd.read_csv(shipped / "training_log.csv")["step"].tolist() == [4, 9]      # leg 1's log unchanged

    pts = plot_legs.leg_points(shipped)
    assert pts["leg"].tolist() == [1, 1, 2, 2] and pts["val/tau"].tolist() == [1.5, 2.0, 2.1, 2.2]
    assert pts["tokens"].tolist() == [5 * 16384, 10 * 16384, 10 * 16384 + 3 * 2048, 10 * 16384 + 6 * 2048]
    # a run that continued leg 1 beside leg 2 and was not shipped: leg 2's tokens per step, from leg 1's end
    pd.DataFrame({"step": [0, 1, 3], "val/tau": [None, 2.05, 2.15]}).to_csv(tmp_path / "arm.csv", index=False)
    arm = plot_legs.branch_points(shipped, tmp_path / "arm.csv", 1, "data arm")
    assert arm["tokens"].tolist() == [10 * 16384 + 2 * 2048, 10 * 16384 + 4 * 2048]
    assert arm["val/tau"].tolist() == [2.05, 2.15] and set(arm["leg"]) == {"data arm"}
    with pytest.raises(ValueError, match="legs 1..2"):
        plot_legs.branch_points(shipped, tmp_path / "arm.csv", 2, "x")
    # after the last shipped leg, with its tokens per step given
    after = plot_legs.branch_points(shipped, tmp_path / "arm.csv", 2, "after", tokens_per_step=1000)
    assert after["tokens"].tolist() == [10 * 16384 + 6 * 2048 + 2 * 1000, 10 * 16384 + 6 * 2048 + 4 * 1000]
    with pytest.raises(ValueError, match="legs 1..2"):
        plot_legs.branch_points(shipped, tmp_path / "arm.csv", 3, "x", tokens_per_step=1000)
    with pytest.raises(ValueError, match="must be positive"):
        plot_legs.branch_points(shipped, tmp_path / "arm.csv", 2, "x", tokens_per_step=0)
    pd.DataFrame({"step": [0], "train/loss": [3.0]}).to_csv(tmp_path / "noval.csv", index=False)
    with pytest.raises(ValueError, match="no validation rows"):
        plot_legs.branch_points(shipped, tmp_path / "noval.csv", 1, "x")
    plot_legs.plot(pts, tmp_path / "p.png", "t", branches=[arm])
    assert (tmp_path / "p.png").stat().st_size > 0


def test_append_leg_refuses_an_adapter_for_other_weights(tmp_path, capsys):
    shipped, run = tmp_path / "adapter", tmp_path / "run"
    _adapter_dir(shipped, {"mask_token_id": 7, "global_step": 10, "base_fingerprint": "f1", "final_metrics": {}},
                 [9], [2.0], b"old")
    _adapter_dir(run / "model", {"mask_token_id": 7, "global_step": 6, "base_fingerprint": "f2", "init_from": "b",
                                 "train_config": {}, "final_metrics": {}}, [5], [2.2], b"new")
    assert append_leg.main(["--shipped", str(shipped), "--run", str(run), "--config", "c2.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "f2" in err and "f1" in err
    assert (shipped / "adapter_model.safetensors").read_bytes() == b"old"


_spec = importlib.util.spec_from_file_location(
    "ship_demo_artefacts", Path(__file__).resolve().parents[1] / "scripts" / "ship_demo_artefacts.py")
ship_demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ship_demo)


def test_ship_demo_artefacts(tmp_path):
    """A demo's sampler and DEER drafter become <model>-sampler / <model>-deer-drafter with a provenance record;
    a run of another model or without the DEER stage changes nothing."""
    run, assets = tmp_path / "run", tmp_path / "assets"
    (run / "sampler_attention" / "sampler").mkdir(parents=True)
    (run / "sampler_attention" / "sampler" / "sampler.json").write_text("{}")
    (run / "sampler_attention" / "metrics.json").write_text('{"best_val_auc": 0.8}')
    (run / "config.json").write_text(json.dumps({"model": "tiny", "sampler_block_length": 8}))
    assets.mkdir()
    with pytest.raises(FileNotFoundError, match="DEER"):
        ship_demo.ship(run, "tiny", assets)
    (run / "deer" / "stage2" / "drafter").mkdir(parents=True)
    (run / "deer" / "stage2" / "drafter" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not 'other'"):
        ship_demo.ship(run, "other", assets)
    assert list(assets.iterdir()) == []
    out = ship_demo.ship(run, "tiny", assets)
    assert sorted(p.name for p in assets.iterdir()) == ["tiny-deer-drafter", "tiny-sampler"]
    rec = json.loads((out["sampler"] / "shipped.json").read_text())
    assert rec["training_metrics"] == {"best_val_auc": 0.8} and rec["demo_config"] == {"sampler_block_length": 8}
    assert (out["deer-drafter"] / "config.json").is_file()


def test_first_leg_starts_a_new_asset(tmp_path):
    run, shipped = tmp_path / "run", tmp_path / "adapter"
    meta = {"mask_token_id": 7, "global_step": 6, "base_fingerprint": "f1", "init_from": "base",
            "train_config": {"batch_size": 8, "seq_len": 256}, "final_metrics": {"val/tau": 1.3}}
    _adapter_dir(run / "model", meta, [2, 5], [1.2, 1.3], b"w")
    (run / "metrics.json").write_text('{"wall_s_this_run": 12.5}')
    assert append_leg.main(["--first", "--shipped", str(shipped), "--run", str(run), "--config", "c.yaml",
                            "--device", "cpu"]) == 0
    leg = json.loads((shipped / "workbench.json").read_text())["legs"]
    assert leg == [{"leg": 1, "config": "c.yaml", "steps": 6, "train_config": meta["train_config"],
                    "train_tokens": 6 * 8 * 256, "log": "training_log.csv", "val_tau": 1.3, "val_tau_tf": None,
                    "wall_s": 12.5, "device": "cpu"}]
    assert plot_legs.leg_points(shipped)["tokens"].tolist() == [3 * 2048, 6 * 2048]
    assert append_leg.main(["--first", "--shipped", str(shipped), "--run", str(run), "--config", "c.yaml"]) == 2
