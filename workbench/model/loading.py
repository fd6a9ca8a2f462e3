"""How every command loads a model: the attention implementation and whether a guessed family is refused.

A released checkpoint's ``config.json`` can name training settings (SDAR-8B-Chat and I-DLM's training configs carry
``"attn_implementation": "flex_attention"``, which segfaults on a CPU). Inference never takes the attention
implementation from the checkpoint: it is the workbench's choice (``sdpa``), or ``--attn_implementation``.

Every command whose config loads a model takes the two options of :class:`ModelLoading` (a mixin of the commands'
config dataclasses, on the command line and in ``--config`` files). A parsed value becomes the setting of the
process, the environment variables :data:`ATTN_ENV` and :data:`STRICT_ENV`, so every model the command loads
(drafters, the model a store names, Lightning's worker processes) uses it; a script may set the variables itself.

This module imports only the standard library, so a command's options and their one-line errors cost no
``torch`` import.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

#: Environment variable holding the attention implementation every model of the process is loaded with.
ATTN_ENV = "WORKBENCH_ATTN_IMPLEMENTATION"
#: Environment variable that, set to ``1``, turns the line naming a guessed family into an error.
STRICT_ENV = "WORKBENCH_STRICT_FAMILY"
#: The attention implementations transformers 5 serves (``ALL_ATTENTION_FUNCTIONS`` plus ``eager``).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3",
                        "flash_attention_4")
#: The implementation a released dLLM's backbone gets when none is asked for: PyTorch's scaled-dot-product attention
#: takes the adapters' additive float 4-D masks on every device, and is what transformers picks for their backbones
#: (Llama, Qwen2, Qwen3, Ministral3, DiffusionGemma) when the config names none. An ordinary checkpoint gets its
#: class's own default (eager for Gemma 2, sdpa for the others).
DEFAULT_ATTN = "sdpa"


def check_attn_implementation(name: str) -> None:
    """Raise ``ValueError`` (one line, listing the valid names) for an unknown attention implementation."""
    if name not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"unknown attn_implementation {name!r}; valid: {', '.join(ATTN_IMPLEMENTATIONS)}")


@dataclass(kw_only=True)
class ModelLoading:
    """The model-loading options every command that loads a model takes (a mixin of its config dataclass).

    A value given (on the command line or in a ``--config`` file) is exported to :data:`ATTN_ENV` /
    :data:`STRICT_ENV` for the rest of the process. Raises ``ValueError`` (one line) for an unknown attention
    implementation."""

    attn_implementation: str | None = None
    """Attention implementation of every model loaded: 'sdpa', 'eager', 'flex_attention' (needs a CUDA device) or
    'flash_attention_2'/'_3'/'_4' (needs the flash-attn package). Default: sdpa for a released diffusion LM, the
    model class's own for any other checkpoint. A checkpoint's own config.json setting (a training choice) is never
    used."""
    strict_family: bool = False
    """Refuse, instead of naming in one line, a family chosen for a folder whose format two families share (SDAR and
    I-DLM); <family>:<folder> then picks one."""

    def __post_init__(self):
        if self.attn_implementation is not None:
            check_attn_implementation(self.attn_implementation)
            os.environ[ATTN_ENV] = self.attn_implementation
        if self.strict_family:
            os.environ[STRICT_ENV] = "1"


def attn_implementation(asked: str | None = None, default: str | None = DEFAULT_ATTN) -> str | None:
    """The attention implementation to load a model with: ``asked``, else the process's (:data:`ATTN_ENV`), else
    ``default`` (``None``: the model class's own default, which transformers picks), whatever the checkpoint's
    ``config.json`` says.

    Raises :class:`~workbench.model.errors.CheckpointError` (one line) for an unknown name, and for
    ``flex_attention`` where no CUDA device is visible: PyTorch's FlexAttention forward crashes the process on a
    CPU (a segmentation fault, or heap corruption, under PyTorch 2.13)."""
    from .errors import CheckpointError

    name = asked or os.environ.get(ATTN_ENV) or default
    if name is None:
        return None
    if name not in ATTN_IMPLEMENTATIONS:
        raise CheckpointError(f"unknown attn_implementation {name!r}; valid: {', '.join(ATTN_IMPLEMENTATIONS)}")
    if name == "flex_attention":
        import torch

        if not torch.cuda.is_available():
            raise CheckpointError("attn_implementation flex_attention needs a CUDA device (FlexAttention's forward "
                                  "crashes on a CPU); use --attn_implementation sdpa or eager here")
    return name


def strict_family() -> bool:
    """True when a guessed family must be refused (:data:`STRICT_ENV` set to ``1``/``true``)."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


_NOTICES: set[str] = set()


def notice(line: str) -> None:
    """Print ``line`` once per command on stderr, as one plain line (``workbench: note: ...``); a model loaded
    twice by one command (a drafter, a second copy) does not repeat it."""
    if line not in _NOTICES:
        _NOTICES.add(line)
        print(f"workbench: note: {line}", file=sys.stderr, flush=True)


def reset_notices() -> None:
    """Forget the lines printed (``workbench.cli.main`` calls it at the start of every command)."""
    _NOTICES.clear()


__all__ = ["ATTN_ENV", "STRICT_ENV", "ATTN_IMPLEMENTATIONS", "DEFAULT_ATTN", "ModelLoading",
           "check_attn_implementation", "attn_implementation", "strict_family", "notice", "reset_notices"]
