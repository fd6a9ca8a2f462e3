"""The exception types the CLI reports as one-line user errors (exit status 2)."""
from __future__ import annotations

from .corpus import CorpusError
from .model.io import CheckpointError
from .tokenizer import TokenizerError
from .utils import RunDirError

try:  # jsonargparse's own parse error (bad option, bad YAML)
    from jsonargparse import ArgumentError as _ArgError
except ImportError:  # pragma: no cover
    _ArgError = ValueError

try:  # Lightning's refusal of a trainer set-up (devices it cannot see, a strategy the accelerator lacks)
    from lightning_fabric.utilities.exceptions import MisconfigurationException as _Misconfig
except ImportError:  # pragma: no cover
    _Misconfig = ValueError

USER_ERRORS = (CorpusError, CheckpointError, TokenizerError, RunDirError, ValueError, FileNotFoundError, _ArgError,
               _Misconfig)
