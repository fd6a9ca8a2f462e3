"""``workbench demo``: the main job (:mod:`.run`), its options (:mod:`.config`), one module per stage
(:mod:`.stages`), the report (:mod:`.report`) and ``--retrain`` (:mod:`.retrain`)."""
from .config import HEADLINE, SHIPPED_LEGS, TARGETS, DemoConfig
from .report import degeneration
from .retrain import retrain
from .run import main, run_demo

# names the tests and older callers use
_degeneration, _retrain = degeneration, retrain

__all__ = ["DemoConfig", "HEADLINE", "SHIPPED_LEGS", "TARGETS", "main", "run_demo", "retrain", "degeneration"]
