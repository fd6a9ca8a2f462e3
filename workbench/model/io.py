"""Checkpoint I/O: ``save_pretrained`` directories with the tokenizer and a ``workbench.json``.

``workbench.json`` holds the mask token id, the block lengths the model was trained with, the preset
and the training recipe, so any tool can reload the model with plain ``AutoModelForCausalLM`` and
``AutoTokenizer`` and still know how to decode it.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from ..tokenizer import TokenizerError, check_tokenizer_fits, require_mask_token
from .errors import CheckpointError
from .trimode import TriModeLM

WORKBENCH_JSON = "workbench.json"


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
                    dtype: torch.dtype = torch.float32, family: str | None = None,
                    attn_implementation: str | None = None,
                    strict_family: bool | None = None) -> tuple[TriModeLM, PreTrainedTokenizerBase, dict]:
    """Load any local Hugging Face causal-LM checkpoint as a :class:`TriModeLM`, or a released diffusion LM of a
    registered family (:mod:`workbench.model.families`: chosen by the config's ``model_type``, or by ``family``)
    as its family's adapter.

    Args:
        path: a ``save_pretrained`` directory (``config.json`` + weights + tokenizer files).
        family: a registered family name that overrides the config's ``model_type`` (``<family>:<folder>``).
        add_mask_token: add ``[MASK]`` to a tokenizer that lacks one and resize the embeddings. Without it,
            a tokenizer with no mask token gives a model for AR decoding only (its diffusion paths raise
            :class:`TokenizerError` naming ``--add_mask_token``).
        device, dtype: where and how to place the weights.
        attn_implementation: the attention implementation (default: the process's ``--attn_implementation``, else
            ``sdpa`` for a released dLLM and the model class's own default for any other checkpoint;
            :func:`~workbench.model.loading.attn_implementation`). A checkpoint's own ``config.json`` setting, a
            training choice, is never used.
        strict_family: refuse a family guessed for a folder whose format two families share (default: the
            process's ``--strict_family``); otherwise the guess is named in one line on stderr once the folder
            opened (:func:`~workbench.model.families.registry.announce`).

    Returns ``(model, tokenizer, workbench_meta)``.

    Raises:
        CheckpointError: the path does not exist or is not a Hugging Face checkpoint directory, its weights do not
            fit its config (a tensor of another shape is named with both shapes), hold NaN or infinity, or a
            released dLLM's family cannot be opened (:class:`~workbench.model.families.spec.FamilyError`).
        TokenizerError: the tokenizer does not fit the model's embedding (another model's tokenizer files,
            :func:`~workbench.tokenizer.check_tokenizer_fits`), or a mask token cannot be added.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"model path {p} does not exist; pass a local save_pretrained directory")
    if not (p / "config.json").is_file():
        raise CheckpointError(f"{p} is not a Hugging Face checkpoint (no config.json); pass a save_pretrained directory")
    from .families.load import load_family, read_config
    from .families.registry import announce, choose_family, refuse_guess
    from .finite import check_finite
    from .loading import attn_implementation as resolve_attn

    raw = read_config(p)
    choice = choose_family(raw, p, name=family)
    if choice is not None:
        refuse_guess(choice, p, strict_family)
        model, tok, semantics = load_family(p, choice.spec, raw, device=device, dtype=dtype,
                                            attn_implementation=attn_implementation)
        announce(choice, p)
        return model, tok, {**read_workbench_json(p), "family": semantics}
    attn = resolve_attn(attn_implementation, default=None)      # None: the class's own default, not config.json's
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
            config = AutoConfig.from_pretrained(p)
            config._attn_implementation = None                  # a training choice; never inherited
            backbone, info = AutoModelForCausalLM.from_pretrained(p, config=config, dtype=dtype,
                                                                  output_loading_info=True,
                                                                  ignore_mismatched_sizes=True,
                                                                  attn_implementation=attn)
        finally:
            hf_logging.set_verbosity(verbosity)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"could not load a causal LM from {p}: {type(e).__name__}: {' '.join(str(e).split())}") from None
    if info.get("mismatched_keys"):
        from .families.load import wrong_shape

        name, got, want = sorted(info["mismatched_keys"])[0]
        raise CheckpointError(wrong_shape(p, name, got, want))
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise CheckpointError(f"{p}: the weights of {len(missing)} parameters (e.g. {missing[0]}) are not in the "
                              "checkpoint, so they would be random; its config.json does not match its weights")
    check_finite(backbone, p)
    rows = backbone.get_input_embeddings().num_embeddings
    # a [MASK] one past the embedding (added to the tokenizer only) gets its row below
    check_tokenizer_fits(tok, rows + int(tok.mask_token_id == rows), p)
    added = tok.mask_token_id is None
    mask_id = require_mask_token(tok, add=True) if add_mask_token or not added else None
    if mask_id is not None and (added or mask_id >= rows):
        add_embedding_rows(backbone, len(tok))
    backbone.to(device).eval()
    return TriModeLM(backbone, mask_id), tok, meta


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


__all__ = ["CheckpointError", "TokenizerError", "load_checkpoint", "save_checkpoint", "read_workbench_json"]
