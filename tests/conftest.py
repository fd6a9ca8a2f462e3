import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from workbench.corpus import stdlib_root
from workbench.model.presets import preset_config
from workbench.model.trimode import TriModeLM
from workbench.tokenizer import MASK_ID, byte_tokenizer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def micro_model() -> TriModeLM:
    """A randomly initialised micro-preset tri-mode model in fp32 eval mode (seeded)."""
    torch.manual_seed(0)
    return TriModeLM(LlamaForCausalLM(preset_config("micro")).eval(), MASK_ID)


@pytest.fixture(scope="session")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A copy of a few standard-library packages (~150 files): a real-code corpus small enough for tests."""
    root = tmp_path_factory.mktemp("corpus")
    src = stdlib_root()
    for pkg in ("email", "json", "asyncio", "importlib", "concurrent", "logging", "http", "urllib", "xml"):
        if (src / pkg).is_dir():
            shutil.copytree(src / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def run_cli(*args: str, timeout: int = 300, env=None):
    """Run the ``workbench`` CLI in a subprocess; returns CompletedProcess (text)."""
    import subprocess
    import sys

    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=e)


@pytest.fixture(scope="session")
def micro_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """An untrained micro model saved as a workbench checkpoint directory."""
    from workbench.model.io import save_checkpoint

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ckpt") / "micro"
    save_checkpoint(TriModeLM(LlamaForCausalLM(preset_config("micro")), MASK_ID), tokenizer, out, {"preset": "micro"})
    return out
