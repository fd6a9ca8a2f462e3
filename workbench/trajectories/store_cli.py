"""``workbench store info|verify``."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from ..model.loading import ModelLoading


@dataclass
class StoreInfoConfig:
    """Print sizes, row counts, label balance per B and category, bytes per row."""

    store: str = "trajectories/tiny-serial.zarr"
    """Store path."""


@dataclass
class StoreVerifyConfig(ModelLoading):
    """Verify a store: shapes, row ranges, label / final-id consistency, NaNs, and the model/tokenizer match."""

    store: str = "trajectories/tiny-serial.zarr"
    """Store path."""
    model: str | None = None
    """Checkpoint directory or 'builtin:tiny' whose fingerprint and tokenizer must match the store."""


def main(argv: list[str]) -> int:
    """``workbench store info|verify``: print a store's summary or check it; returns the exit code."""
    from ..cli_args import parse_dataclass
    from .store import store_info, verify_store

    if not argv or argv[0] not in ("info", "verify"):
        print("usage: workbench store info|verify --store <path> [--model <checkpoint>]", file=sys.stderr)
        return 2
    if argv[0] == "info":
        cfg = parse_dataclass("workbench store info", StoreInfoConfig, argv[1:])
        print(json.dumps(store_info(cfg.store), indent=2, default=str))
        return 0
    cfg = parse_dataclass("workbench store verify", StoreVerifyConfig, argv[1:])
    fp = th = None
    if cfg.model:
        from ..model.load import load_model
        from ..model.fingerprint import model_fingerprint, tokenizer_hash

        model, tok, _ = load_model(cfg.model, "cpu")
        fp, th = model_fingerprint(model), tokenizer_hash(tok)
    summary = verify_store(cfg.store, model_fingerprint=fp, tokenizer_hash=th)
    print(json.dumps({"ok": True, **summary}, indent=2, default=str))
    return 0
