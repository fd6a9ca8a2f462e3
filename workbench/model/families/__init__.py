"""Released diffusion LMs (NLD, SDAR, LLaDA, Dream, Fast-dLLM v2, I-DLM, DiffusionGemma) opened natively on
transformers' built-in classes: what a family is (:mod:`.spec`), the registry (:mod:`.registry`, built-in entries in
:mod:`.builtin`), the adapters that
hold each family's semantics (:mod:`.adapters`), the loader (:mod:`.load`) and tiny checkpoints in each family's
on-disk layout (:mod:`.fixtures`)."""
from __future__ import annotations

from .registry import FAMILIES, family_of_config, get_family, register_family  # noqa: F401
from .spec import FamilyError, FamilySpec  # noqa: F401
