"""Models shipped inside the package (``workbench/assets/<name>``)."""
from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent


def shipped_models() -> list[str]:
    """Names of the full models shipped in ``workbench/assets`` (folders with a ``config.json``)."""
    return sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file())


def builtin_model_path(name: str) -> Path:
    """Folder of the shipped model ``name`` (e.g. ``tiny``). Raises ``FileNotFoundError`` if absent."""
    p = ASSETS / name
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"no shipped model {name!r} in {ASSETS}; train one with `workbench demo --retrain`")
    return p
