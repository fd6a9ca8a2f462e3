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


def pytest_configure(config):
    """Under pytest-xdist (``make test``: two workers), one math thread per worker and per subprocess it starts.
    Two workers of two threads each oversubscribe a 2-core machine: the suite took 15 min 25 s that way against
    7 min 54 s at one thread a worker (``benchmarks/RESULTS.md``, tenth session). A thread count set in the
    environment is kept."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


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


@pytest.fixture
def cli(capfd, monkeypatch):
    """Run the ``workbench`` CLI in this process: ``cli(*args, env=None, cwd=None)`` -> CompletedProcess.

    For one-line-error tests and short runs, without an interpreter start-up (about 8 s of imports a call on 2
    cores). Like :func:`run_cli` it runs from the repository root (or ``cwd``) and returns the status ``main()``
    hands to ``sys.exit`` and what reaches stdout and stderr: the commands' own lines, warnings (under the filters
    a fresh interpreter starts with, plus the ones workbench modules add on import), log records of WARNING and
    above (Python's last-resort handler in a fresh process) and transformers' logger. Afterwards it restores what a
    command may change for the process: environment variables, random states, torch threads and default dtype,
    logger levels. Signals, kills, exit-time output, variables read at import time (``HF_HUB_OFFLINE``), spawned
    workers and ``__main__`` need :func:`run_cli`.
    """
    import logging
    import random
    import subprocess
    import sys
    import warnings

    import numpy as np
    from transformers.utils import logging as hf_logging

    from workbench import cli as workbench_cli
    from workbench.trajectories.store import quiet_zarr_task_noise

    def write_warning(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    loggers = [logging.getLogger(n) for n in ("pytorch_lightning.utilities.rank_zero",
                                              "lightning.pytorch.utilities.rank_zero", "optuna")]

    def run(*args: str, env=None, cwd=None):
        monkeypatch.chdir(REPO if cwd is None else cwd)
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        capfd.readouterr()
        environ = dict(os.environ)
        rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        levels = [lg.level for lg in loggers]
        hf_handlers = [h for h in hf_logging.get_logger().handlers if isinstance(h, logging.StreamHandler)]
        hf_streams = [h.setStream(sys.stderr) for h in hf_handlers]
        last_resort = logging.StreamHandler(sys.stderr)
        last_resort.setLevel(logging.WARNING)
        logging.getLogger().addHandler(last_resort)
        with warnings.catch_warnings():
            warnings.resetwarnings()                       # python's defaults, not pytest's recording filters
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.filterwarnings("ignore", category=category)
            quiet_zarr_task_noise()
            warnings.showwarning = write_warning           # printed, as a fresh interpreter does
            try:
                code = workbench_cli.main([str(a) for a in args])
            except SystemExit as e:                        # an option parser's own exit
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            finally:
                logging.getLogger().removeHandler(last_resort)
                for h, stream in zip(hf_handlers, hf_streams):
                    h.setStream(stream)
                for lg, level in zip(loggers, levels):
                    lg.setLevel(level)
                hf_logging.set_verbosity(verbosity)
                (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
                for k in set(os.environ) - set(environ):   # e.g. Lightning's PL_GLOBAL_SEED
                    del os.environ[k]
                os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
                torch.set_rng_state(rng[0])
                np.random.set_state(rng[1])
                random.setstate(rng[2])
                torch.set_num_threads(threads)
                torch.set_default_dtype(dtype)
        out = capfd.readouterr()
        return subprocess.CompletedProcess(["workbench", *args], code, out.out, out.err)
    return run


@pytest.fixture(scope="session")
def micro_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """An untrained micro model saved as a workbench checkpoint directory."""
    from workbench.model.io import save_checkpoint

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ckpt") / "micro"
    save_checkpoint(TriModeLM(LlamaForCausalLM(preset_config("micro")), MASK_ID), tokenizer, out, {"preset": "micro"})
    return out


def bpe_tokenizer():
    """A small byte-level BPE tokenizer (320 tokens) trained on a few stdlib files, with an end-of-sequence
    token and **no mask token** (as SmolLM2's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    src = stdlib_root()
    texts = [(src / f).read_text() for f in ("json/decoder.py", "json/encoder.py", "textwrap.py", "string.py")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


@pytest.fixture(scope="session")
def ar_checkpoint(tmp_path_factory) -> Path:
    """A random-initialised two-layer Llama saved like a pretrained AR model, with :func:`bpe_tokenizer`."""
    from transformers import LlamaConfig

    fast = bpe_tokenizer()
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, eos_token_id=fast.eos_token_id, pad_token_id=fast.eos_token_id,
                      bos_token_id=None)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ar") / "ar_model"
    LlamaForCausalLM(cfg).save_pretrained(out)
    fast.save_pretrained(out)
    return out


from contextlib import contextmanager  # noqa: E402


@contextmanager
def stop_lightning_at(step: int):
    """Every Lightning ``Trainer`` made inside stops at ``max_steps = step`` (a run interrupted there: its
    checkpoint and log stay, the schedule keeps its full length)."""
    import pytorch_lightning as pl

    orig = pl.Trainer.__init__

    def short(self, *args, **kw):
        kw["max_steps"] = step
        orig(self, *args, **kw)

    pl.Trainer.__init__ = short
    try:
        yield
    finally:
        pl.Trainer.__init__ = orig
