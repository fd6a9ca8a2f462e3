"""workbench: diffusion-LM samplers and drafter alignment.

The public Python API is what ``docs/python-api.md`` uses, importable from the package itself
(``import workbench as wb``; ``wb.load_model("tiny")``). Each name lives in its own module and is imported on first
use, so ``import workbench`` stays as cheap as the package's ``__init__`` (no torch, no transformers):

- models: :func:`~workbench.model.load.load_model` (a named model, a released family's folder, a local checkpoint),
  :func:`~workbench.assets.shipped_artefact` (a sampler, drafter or proxy shipped for a model);
- decoding: :func:`~workbench.decoding.registry.load_decoders`, :func:`~workbench.decoding.registry.get_decoder`,
  :func:`~workbench.decoding.registry.get_policy`, :class:`~workbench.decoding.base.DecodeResult`,
  :class:`~workbench.decoding.base.DecodeError`;
- scoring: :func:`~workbench.corpus.load_corpus`, :func:`~workbench.evaluation.prompts.make_prompts`,
  :class:`~workbench.evaluation.harness.EvalConfig`, :func:`~workbench.evaluation.harness.evaluate_model`,
  :func:`~workbench.evaluation.harness.summarize`;
- trajectories: :class:`~workbench.trajectories.collect.CollectConfig`,
  :func:`~workbench.trajectories.collect.run_collect`, :class:`~workbench.trajectories.store.StoreReader`;
- SOL: :func:`~workbench.sol.runner.run_sol`.
"""
from __future__ import annotations

import importlib

#: Public name -> the module that defines it (imported on first access, PEP 562).
_EXPORTS = {
    "load_model": "workbench.model.load",
    "shipped_artefact": "workbench.assets",
    "load_decoders": "workbench.decoding.registry",
    "get_decoder": "workbench.decoding.registry",
    "get_policy": "workbench.decoding.registry",
    "DecodeResult": "workbench.decoding.base",
    "DecodeError": "workbench.decoding.base",
    "load_corpus": "workbench.corpus",
    "make_prompts": "workbench.evaluation.prompts",
    "EvalConfig": "workbench.evaluation.harness",
    "evaluate_model": "workbench.evaluation.harness",
    "summarize": "workbench.evaluation.harness",
    "CollectConfig": "workbench.trajectories.collect",
    "run_collect": "workbench.trajectories.collect",
    "StoreReader": "workbench.trajectories.store",
    "run_sol": "workbench.sol.runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import a public name from its module on first access (``workbench.load_model``) and keep it here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
