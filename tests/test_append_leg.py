"""scripts/append_leg.py: shipping a continuation run as the next leg of a shipped model."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

_spec = importlib.util.spec_from_file_location("append_leg", Path(__file__).resolve().parents[1] / "scripts" / "append_leg.py")
append_leg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(append_leg)


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
    assert [(leg["config"], leg["steps"]) for leg in meta["legs"]] == [("(first leg)", 100), ("configs/leg2.yaml", 50)]
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
