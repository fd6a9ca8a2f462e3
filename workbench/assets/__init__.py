"""Models shipped inside the package (``workbench/assets/<name>``)."""
from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent


def shipped_models() -> list[str]:
    """Names of the full models shipped in ``workbench/assets`` (folders with a ``config.json``, other than the
    artefacts shipped for a model, see :func:`shipped_artefact`)."""
    return sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file()
                  and not any(p.name.endswith("-" + s) for s in ARTEFACT_KINDS.values()))


def builtin_model_path(name: str) -> Path:
    """Folder of the shipped model ``name`` (e.g. ``tiny``). Raises ``FileNotFoundError`` if absent."""
    p = ASSETS / name
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"no shipped model {name!r} in {ASSETS}; train one with `workbench demo --retrain`")
    return p


ARTEFACT_KINDS = {"sampler": "sampler", "drafter": "deer-drafter", "proxy": "proxy"}
"""Artefacts a shipped model may come with: option name -> folder suffix (``workbench/assets/<model>-<suffix>``)."""
ADAPTER_SUFFIXES = ("-trimode", "-idlm")
"""Named adapter models ``<base><suffix>``: without an artefact of their own they use the base's."""


def shipped_artefact(model: str, kind: str) -> Path | None:
    """The trained artefact of ``kind`` shipped for ``model``, or None when none ships.

    ``model`` is a model spec as the commands take it (``tiny``, ``builtin:tiny``, a named model); ``kind`` is
    ``'sampler'`` (a ``workbench train sampler`` folder, shipped as ``workbench/assets/<model>-sampler``) or
    ``'drafter'`` (a ``workbench train deer`` drafter, ``workbench/assets/<model>-deer-drafter``) or ``'proxy'``
    (a ``workbench diffuspec proxy`` n-gram proxy, ``workbench/assets/<model>-proxy``). Each shipped
    folder records how it was made in its ``workbench.json``. Raises ``ValueError`` for an unknown ``kind``."""
    if kind not in ARTEFACT_KINDS:
        raise ValueError(f"unknown artefact kind {kind!r}; valid: {', '.join(ARTEFACT_KINDS)}")
    name = model.removeprefix("builtin:")
    if "/" in name or not name:
        return None
    names = [name] + [name.removesuffix(s) for s in ADAPTER_SUFFIXES if name.endswith(s)]
    for n in names:               # a gated adapter model uses its base's artefacts (same tokenizer, same AR mode)
        p = ASSETS / f"{n}-{ARTEFACT_KINDS[kind]}"
        if p.is_dir():
            return p
    return None
