"""Adapter folders checked against their weights and the model they go on, before anything is loaded: the
peft config (``adapter_config.json``: target modules, rank) against the tensors in ``adapter_model.safetensors``
(read as names and shapes only) and against the model's linear layers and embedding width.

Imports no model class, so the adapter loaders of every layer (``model.gated_lora``, ``speculative.adapter``) can
call it without an import cycle."""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from .errors import CheckpointError

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: Prefix peft puts before the base model's module names (in the saved weights and in a wrapped model).
_PEFT_PREFIX = "base_model.model."
#: Suffix of a peft *trainable tokens* weight (the rows of the tokens it trains, e.g. the added mask token).
_TOKEN_ROWS = ".token_adapter.trainable_tokens_delta"
_RESAVE = "re-save the adapter from the run that trained it, or re-train it"


def check_adapter(adapter_dir: str | Path, backbone) -> None:
    """Check the peft LoRA adapter in ``adapter_dir`` before it is loaded onto ``backbone`` (a plain or peft-wrapped
    causal LM), reading only the names and shapes of its weights (the safetensors header): the modules its weights
    adapt are exactly those its ``adapter_config.json`` ``target_modules`` select in ``backbone``; every LoRA pair
    has the config's rank ``r`` (or its ``rank_pattern`` entry) and the shapes of the module it adapts; trained token
    rows (the mask row of a gated adapter) match ``trainable_token_indices`` and the embedding width.

    Raises ``FileNotFoundError`` if there is no ``adapter_config.json``, and :class:`CheckpointError` (one line naming
    the folder, what differs and the fix) for an unreadable config, a missing, truncated or unreadable
    ``adapter_model.safetensors``, or any mismatch. An adapter saved as ``adapter_model.bin`` only has its config
    read: its shapes cannot be had without loading it."""
    d = Path(adapter_dir)
    cfg = _adapter_config(d)
    shapes = _adapter_shapes(d)
    if shapes is None:
        return
    pairs = _lora_pairs(d, shapes)
    linear = _linear_features(backbone)
    _check_targets(d, cfg, set(pairs), linear)
    for module, (a, b) in pairs.items():
        _check_lora_pair(d, cfg, module, a, b, linear)
    _check_token_rows(d, cfg, shapes, backbone.get_input_embeddings().embedding_dim)


def _adapter_config(d: Path) -> dict:
    """``d``'s ``adapter_config.json`` as a dict; raises ``FileNotFoundError`` / :class:`CheckpointError`."""
    f = d / ADAPTER_CONFIG
    if not f.is_file():
        raise FileNotFoundError(f"{d} is not a peft adapter directory (no {ADAPTER_CONFIG})")
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{f} is not valid JSON ({e}); {_RESAVE}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{f} holds no JSON object; {_RESAVE}")
    return cfg


def _adapter_shapes(d: Path) -> dict[str, tuple[int, ...]] | None:
    """Name → shape of every tensor in ``d``'s ``adapter_model.safetensors`` (header only; ``None`` for a peft
    ``adapter_model.bin``); raises :class:`CheckpointError` for a missing, truncated or unreadable file."""
    from safetensors import safe_open

    f = d / ADAPTER_WEIGHTS
    if not f.is_file():
        if (d / "adapter_model.bin").is_file():
            return None
        raise CheckpointError(f"{d} holds {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}; {_RESAVE}")
    try:
        with safe_open(f, "pt") as st:
            return {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for every bad header
        raise CheckpointError(f"{f} is truncated or not a safetensors file ({' '.join(str(e).split())}); "
                              f"{_RESAVE}") from None


def _lora_pairs(d: Path, shapes: dict) -> dict[str, tuple[tuple, tuple]]:
    """Module name (in the plain model) → shapes of its ``(lora_A, lora_B)`` weights; raises
    :class:`CheckpointError` for a module with one of the two only."""
    found: dict[str, dict[str, tuple]] = {}
    for key, shape in shapes.items():
        m = re.fullmatch(r"(.+)\.(lora_[AB])\.weight", key)
        if m:
            found.setdefault(m[1].removeprefix(_PEFT_PREFIX), {})[m[2]] = shape
    for module, pair in found.items():
        if len(pair) != 2:
            raise CheckpointError(f"{d}/{ADAPTER_WEIGHTS} holds {next(iter(pair))} but not the other LoRA matrix of "
                                  f"{module}; {_RESAVE}")
    return {module: (pair["lora_A"], pair["lora_B"]) for module, pair in found.items()}


def _linear_features(backbone) -> dict[str, tuple[int, int]]:
    """``(in, out)`` features of each linear (or GPT-2 ``Conv1D``) module of ``backbone`` by its name in the plain
    model: a peft wrapper's prefix, its ``base_layer`` and its LoRA matrices are looked through."""
    out = {}
    for name, mod in backbone.named_modules():
        if ".lora_" in name or name.endswith("base_layer"):
            continue
        base = getattr(mod, "base_layer", mod)
        if isinstance(base, torch.nn.Linear):
            out[name.removeprefix(_PEFT_PREFIX)] = (base.in_features, base.out_features)
        elif type(base).__name__ == "Conv1D":                  # weight (in, out)
            out[name.removeprefix(_PEFT_PREFIX)] = tuple(base.weight.shape)
    return out


def _targeted(targets, module: str) -> bool:
    """Whether peft's ``target_modules`` (a list of name suffixes, or one regular expression) select ``module``."""
    if isinstance(targets, str):
        return targets == "all-linear" or re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in targets)


def _check_targets(d: Path, cfg: dict, held: set[str], linear: dict) -> None:
    """The modules the weights adapt (``held``) are the ones ``target_modules`` select in the model (``linear``);
    raises :class:`CheckpointError` naming both lists."""
    targets = cfg.get("target_modules") or []
    narrowed = targets == "all-linear" or cfg.get("layers_to_transform") is not None or cfg.get("exclude_modules")
    want = set() if narrowed else {m for m in linear if _targeted(targets, m)}
    if all(_targeted(targets, m) for m in held) and want <= held:
        return
    listed = targets if isinstance(targets, str) else ", ".join(sorted(targets))
    kinds = ", ".join(sorted({m.rsplit(".", 1)[-1] for m in held})) or "no LoRA matrix"
    raise CheckpointError(f"{d}: {ADAPTER_CONFIG} lists target_modules [{listed}] but the weights hold {kinds}; "
                          f"{_RESAVE}")


def _rank(cfg: dict, module: str) -> int:
    """The LoRA rank of ``module``: its ``rank_pattern`` entry (peft's suffix match), else ``r``."""
    for pattern, r in (cfg.get("rank_pattern") or {}).items():
        if re.fullmatch(rf"(.*\.)?{pattern}", module):
            return int(r)
    return int(cfg.get("r", 8))                                # peft's default rank


def _check_lora_pair(d: Path, cfg: dict, module: str, a: tuple, b: tuple, linear: dict) -> None:
    """``lora_A`` is ``(r, in)`` and ``lora_B`` ``(out, r)`` for the config's rank and the model's ``module``;
    raises :class:`CheckpointError` naming the module and both shapes."""
    if module not in linear:
        raise CheckpointError(f"{d}: the weights adapt {module}, which this model has no linear layer of: the adapter "
                              "was trained on another model; load it on the base it was trained on")
    r = _rank(cfg, module)
    if a[0] != r or b[-1] != r:
        raise CheckpointError(f"{d}: {ADAPTER_CONFIG} says rank r = {r} but the weights of {module} have rank "
                              f"{a[0]}; {_RESAVE}")
    fan_in, fan_out = linear[module]
    if (a, b) != ((r, fan_in), (fan_out, r)):
        raise CheckpointError(f"{d}: the LoRA weights of {module} have shapes {list(a)} and {list(b)}, but this "
                              f"model's {module} maps {fan_in} to {fan_out} features: the adapter was trained on "
                              "another model; load it on the base it was trained on")


def _check_token_rows(d: Path, cfg: dict, shapes: dict, width: int) -> None:
    """Each trained-token weight (peft *trainable tokens*: the mask row) has one row per id its module lists in
    ``trainable_token_indices`` and the embedding ``width``; raises :class:`CheckpointError`."""
    indices = cfg.get("trainable_token_indices") or {}
    for key, shape in shapes.items():
        if not key.endswith(_TOKEN_ROWS):
            continue
        module = key[:-len(_TOKEN_ROWS)].removeprefix(_PEFT_PREFIX)
        ids = indices if isinstance(indices, list) else next(
            (v for k, v in indices.items() if _targeted([k], module)), [])
        if tuple(shape) != (len(ids), width):
            raise CheckpointError(f"{d}: the weights hold {list(shape)} trained token rows for {module}, but "
                                  f"{ADAPTER_CONFIG} lists {len(ids)} token ids (trainable_token_indices) and the "
                                  f"model's embedding is {width} wide; {_RESAVE}")


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "check_adapter"]
