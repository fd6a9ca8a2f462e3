"""Models shipped inside the package (``workbench/assets/<name>``)."""
from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent


def builtin_model_path(name: str) -> Path:
    """Folder of the shipped model ``name`` (e.g. ``tiny``). Raises ``FileNotFoundError`` if absent."""
    p = ASSETS / name
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"no shipped model {name!r} in {ASSETS}; train one with `workbench demo --retrain`")
    return p
