"""Checkpoint I/O: ``save_pretrained`` directories with the tokenizer and a ``workbench.json``.

``workbench.json`` holds the mask token id, the block lengths the model was trained with, the preset
and the training recipe, so any tool can reload the model with plain ``AutoModelForCausalLM`` and
``AutoTokenizer`` and still know how to decode it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from ..tokenizer import TokenizerError, check_tokenizer_fits, require_mask_token
from .trimode import TriModeLM

WORKBENCH_JSON = "workbench.json"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: Prefix peft puts before the base model's module names (in the saved weights and in a wrapped model).
_PEFT_PREFIX = "base_model.model."
#: Suffix of a peft *trainable tokens* weight (the rows of the tokens it trains, e.g. the added mask token).
_TOKEN_ROWS = ".token_adapter.trainable_tokens_delta"
_RESAVE = "re-save the adapter from the run that trained it, or re-train it"


class CheckpointError(ValueError):
    """Raised for a missing or non-Hugging-Face model path."""


def save_checkpoint(model: TriModeLM, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path,
                    meta: dict) -> Path:
    """Write ``model`` (safetensors), ``tokenizer`` and ``workbench.json`` (``meta`` + mask token id) to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.backbone.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    info = dict(meta)
    info["mask_token_id"] = model.mask_token_id
    (out / WORKBENCH_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out


def read_workbench_json(path: str | Path) -> dict:
    """The checkpoint's ``workbench.json`` as a dict (empty for a plain HF checkpoint)."""
    f = Path(path) / WORKBENCH_JSON
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{f} is not valid JSON ({e}); restore it from the run, or delete it to load "
                              "the checkpoint as a plain Hugging Face model") from None


def trained_context(meta: dict) -> int | None:
    """Longest training window (tokens) recorded in a checkpoint's ``workbench.json``, over the first run and
    every continuation leg; ``None`` for a checkpoint the workbench did not train. Positions past it were
    never seen in training, so decoding beyond it measures position extrapolation as well as the model."""
    cfgs = [meta.get("train_config") or {}] + [leg.get("train_config") or {} for leg in meta.get("legs", [])]
    lengths = [int(c["seq_len"]) for c in cfgs if c.get("seq_len")]
    return max(lengths) if lengths else None


def load_checkpoint(path: str | Path, add_mask_token: bool = False, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[TriModeLM, PreTrainedTokenizerBase, dict]:
    """Load any local Hugging Face causal-LM checkpoint as a :class:`TriModeLM`.

    Args:
        path: a ``save_pretrained`` directory (``config.json`` + weights + tokenizer files).
        add_mask_token: add ``[MASK]`` to a tokenizer that lacks one and resize the embeddings. Without it,
            a tokenizer with no mask token gives a model for AR decoding only (its diffusion paths raise
            :class:`TokenizerError` naming ``--add_mask_token``).
        device, dtype: where and how to place the weights.

    Returns ``(model, tokenizer, workbench_meta)``.

    Raises:
        CheckpointError: the path does not exist or is not a Hugging Face checkpoint directory.
        TokenizerError: the tokenizer does not fit the model's embedding (another model's tokenizer files,
            :func:`~workbench.tokenizer.check_tokenizer_fits`), or a mask token cannot be added.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"model path {p} does not exist; pass a local save_pretrained directory")
    if not (p / "config.json").is_file():
        raise CheckpointError(f"{p} is not a Hugging Face checkpoint (no config.json); pass a save_pretrained directory")
    try:
        tok = AutoTokenizer.from_pretrained(p)
    except Exception as e:  # noqa: BLE001 - report any tokenizer loading failure in one line
        raise CheckpointError(f"could not load a tokenizer from {p}: {type(e).__name__}: {e}") from None
    meta = read_workbench_json(p)
    try:
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()         # transformers prints a multi-line load report on mismatches
        try:
            backbone, info = AutoModelForCausalLM.from_pretrained(p, dtype=dtype, output_loading_info=True)
        finally:
            hf_logging.set_verbosity(verbosity)
    except Exception as e:  # noqa: BLE001
        if "mismatched_sizes" in str(e) or "size mismatch" in str(e):
            raise CheckpointError(f"{p}: the weights do not have the shapes its config.json describes (e.g. another "
                                  "hidden size or vocabulary); restore the config.json that came with the weights") from None
        raise CheckpointError(f"could not load a causal LM from {p}: {type(e).__name__}: {' '.join(str(e).split())}") from None
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise CheckpointError(f"{p}: the weights of {len(missing)} parameters (e.g. {missing[0]}) are not in the "
                              "checkpoint, so they would be random; its config.json does not match its weights")
    rows = backbone.get_input_embeddings().num_embeddings
    # a [MASK] one past the embedding (added to the tokenizer only) gets its row below
    check_tokenizer_fits(tok, rows + int(tok.mask_token_id == rows), p)
    added = tok.mask_token_id is None
    mask_id = require_mask_token(tok, add=True) if add_mask_token or not added else None
    if mask_id is not None and (added or mask_id >= rows):
        add_embedding_rows(backbone, len(tok))
    backbone.to(device).eval()
    return TriModeLM(backbone, mask_id), tok, meta


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


def add_embedding_rows(backbone, vocab: int) -> None:
    """Resize the input (and tied output) embeddings to ``vocab`` rows; new rows are the mean of the old
    ones (deterministic, unlike transformers' sampled mean resizing)."""
    emb = backbone.get_input_embeddings()
    old = emb.num_embeddings
    mean = emb.weight.detach().mean(dim=0)
    backbone.resize_token_embeddings(vocab, mean_resizing=False)
    with torch.no_grad():
        backbone.get_input_embeddings().weight[old:] = mean
        out = backbone.get_output_embeddings()
        if out is not None and out.weight.data_ptr() != backbone.get_input_embeddings().weight.data_ptr():
            out.weight[old:] = out.weight[:old].mean(dim=0)


__all__ = ["CheckpointError", "TokenizerError", "load_checkpoint", "save_checkpoint", "read_workbench_json",
           "check_adapter"]
