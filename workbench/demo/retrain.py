"""``workbench demo --retrain``: reproduce the shipped model from its recorded training legs."""
from __future__ import annotations

from pathlib import Path

from .config import SHIPPED_LEGS, DemoConfig


def retrain(cfg: DemoConfig) -> str:
    """Train the model to evaluate: ``cfg.train_config``, or by default the shipped model's legs
    (:data:`SHIPPED_LEGS`, each starting from the previous leg's output). Returns the last model directory.

    The legs write to ``<out_dir>.retrain/`` (``train``, ``train_leg2``, ...), outside the demo's staging
    folder, which any failure deletes: an interrupted retrain (hours on a CPU) is resumed by running the same
    command again. A leg whose model already reached its last step is reused, and the interrupted leg
    continues from its last checkpoint (``workbench train lm`` resumes bit-exactly)."""
    from ..cli_args import parse_dataclass
    from ..model.io import read_workbench_json
    from ..train.lm import LMTrainConfig, train_lm

    configs = Path(__file__).parent.parent / "configs"
    legs = [cfg.train_config] if cfg.train_config else [str(configs / name) for name in SHIPPED_LEGS]
    root = Path(str(cfg.out_dir) + ".retrain")
    model = None
    for i, yaml_path in enumerate(legs):
        argv = ["--config", yaml_path, "--out_dir", str(root / ("train" if i == 0 else f"train_leg{i + 1}")),
                "--corpus", cfg.corpus, "--progress_bar", str(cfg.progress_bar).lower()]
        if model is not None:
            argv += ["--init_from", model]
        leg = parse_dataclass("train", LMTrainConfig, argv)
        done = Path(leg.out_dir) / "model"
        if read_workbench_json(done).get("global_step", -1) >= (leg.stop_at_step or leg.max_steps):
            model = str(done)
            continue
        model = str(train_lm(leg))
    return model
