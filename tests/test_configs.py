"""Every shipped YAML recipe in ``workbench/configs`` parses into the options of a command and validates (a misspelt or stale
key, e.g. after a field moved into ``DeviceConfig``, fails here instead of at the start of an hour-long leg)."""
from pathlib import Path

import pytest

from conftest import REPO
from workbench.cli_args import parse_dataclass


def _config_classes():
    from workbench.deer.evaluate import DeerEvalConfig
    from workbench.deer.teacher import TeacherConfig
    from workbench.deer.train import DeerTrainConfig
    from workbench.demo.config import DemoConfig
    from workbench.drafter.train import LoraTrainConfig
    from workbench.sampler.train import SamplerTrainConfig
    from workbench.train.lm import LMTrainConfig
    from workbench.trajectories.collect import CollectConfig

    return [LMTrainConfig, DeerTrainConfig, LoraTrainConfig, SamplerTrainConfig, TeacherConfig, DeerEvalConfig,
            DemoConfig, CollectConfig]


@pytest.mark.parametrize("path", sorted((REPO / "workbench" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_parses_into_one_command(path: Path):
    accepted = []
    for cls in _config_classes():
        try:
            cfg = parse_dataclass("t", cls, ["--config", str(path)])
        except (Exception, SystemExit):          # noqa: BLE001 - unknown keys or bad values: not this command
            continue
        if hasattr(cfg, "validate"):
            cfg.validate()                       # a recipe of this command must also be consistent
        accepted.append(cls.__name__)
    assert accepted, f"{path.name} parses into none of the commands' options"
