"""Loading any ``--model`` value as a :class:`~workbench.model.trimode.TriModeLM`: a shipped model, a named real
model from the cache (:mod:`workbench.model.named`), a named base with its shipped gated adapter, or a local
Hugging Face checkpoint directory; and picking the torch device."""
from __future__ import annotations

import torch

from .families.prefix import family_prefix
from .io import CheckpointError, load_checkpoint, read_workbench_json


class AdapterMismatchError(CheckpointError):
    """An adapter trained on other base weights (or another tokenizer) than the model it is loaded onto."""


def resolve_device(name: str) -> torch.device:
    """``'auto'`` (CUDA if available, else CPU), ``'cpu'``, ``'cuda'`` or ``'cuda:N'`` as a ``torch.device``.

    Raises ``ValueError`` for an unknown name or a CUDA device this torch cannot see."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use 'auto', 'cpu' or 'cuda' (or 'cuda:N')") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but this torch has no CUDA device; use --device cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are "
                             "visible")
    return dev


def attach_adapter(model, tok, adapter_dir, trainable: bool = False):
    """Load the gated adapter in ``adapter_dir`` onto ``model`` (whose backbone is the plain base).

    The base must have the weights the adapter was trained on (``base_fingerprint`` in the adapter's
    ``workbench.json``, :func:`~workbench.model.fingerprint.weights_fingerprint` of the base before the mask
    row was added) and the same vocabulary; otherwise :class:`AdapterMismatchError` names both fingerprints.
    Adds the mask token the adapter was trained with when the tokenizer lacks it. Returns ``(model, tok)``.
    """
    from ..tokenizer import require_mask_token
    from .fingerprint import weights_fingerprint
    from .gated_lora import load_gated_lora
    from .io import add_embedding_rows
    from .trimode import TriModeLM

    meta = read_workbench_json(adapter_dir)
    want = meta.get("base_fingerprint")
    got = weights_fingerprint(model.backbone)
    if want and want != got:
        raise AdapterMismatchError(f"the adapter in {adapter_dir} was trained on base weights {want}, but the model "
                                   f"given has weights {got}; load it on the base it was trained on")
    mask_id = require_mask_token(tok, add=True)
    if meta.get("mask_token_id") is not None and int(meta["mask_token_id"]) != mask_id:
        raise AdapterMismatchError(f"the adapter in {adapter_dir} was trained with mask token id "
                                   f"{meta['mask_token_id']}, but this tokenizer gives {mask_id}")
    backbone = model.backbone
    if mask_id >= backbone.get_input_embeddings().num_embeddings:
        add_embedding_rows(backbone, len(tok))
    dev = model.device
    out = TriModeLM(backbone, mask_id)
    load_gated_lora(out, adapter_dir, trainable=trainable)
    out.backbone.to(dev)
    return out, tok


def load_model(spec: str, device="cpu", add_mask_token: bool = False, dtype: torch.dtype = torch.float32,
               trainable_adapter: bool = False, attn_implementation: str | None = None,
               strict_family: bool | None = None):
    """Load ``spec`` → ``(TriModeLM, tokenizer, workbench_meta)``.

    ``spec``: ``tiny`` / ``builtin:tiny`` (shipped), a named real model (``smollm2-135m``, fetched into the cache
    on first use), a named base + shipped gated adapter (``smollm2-135m-trimode``), a checkpoint directory (a
    released diffusion LM's is opened by its family, :mod:`workbench.model.families`; ``<family>:<folder>`` forces
    one), or a
    gated-adapter folder (a ``workbench train lm`` run's ``model/``, loaded on the base its ``workbench.json``
    names).
    ``trainable_adapter``: load a gated adapter in its training form (peft layers, gradients on its LoRA
    matrices and mask row; :func:`~workbench.model.gated_lora.load_gated_lora`) instead of the inference form.
    ``attn_implementation``, ``strict_family``: see :func:`~workbench.model.io.load_checkpoint` (default: the
    command's ``--attn_implementation`` / ``--strict_family``, :mod:`workbench.model.loading`).
    Raises :class:`~workbench.model.io.CheckpointError` (one line) for anything that cannot be loaded.
    """
    from .named import resolve

    family, spec = family_prefix(str(spec))
    path, adapter = resolve(spec)
    model, tok, meta = load_checkpoint(path, add_mask_token=add_mask_token and adapter is None, device=device,
                                       dtype=dtype, family=family, attn_implementation=attn_implementation,
                                       strict_family=strict_family)
    if adapter is not None:
        model, tok = attach_adapter(model, tok, adapter, trainable=trainable_adapter)
        meta = {**meta, "adapter": str(adapter), "adapter_meta": read_workbench_json(adapter)}
    return model, tok, meta


def released_family(spec: str | None):
    """The :class:`~workbench.model.families.spec.FamilySpec` of ``spec`` when it is a released diffusion LM (a
    folder whose ``config.json`` names a registered family, or ``<family>:<folder>``), else ``None`` (a tri-mode
    checkpoint, ``builtin:<name>``, a named model, a missing path). Reads only ``config.json``."""
    from pathlib import Path

    from .families.load import read_config
    from .families.registry import FAMILIES, family_of_config

    if not spec:
        return None
    family, folder = family_prefix(str(spec))
    if family is not None:
        return FAMILIES[family]
    if not (Path(folder) / "config.json").is_file():
        return None
    return family_of_config(read_config(folder), folder)


def foreign_token(target_tokenizer, drafter_tokenizer) -> str | None:
    """The first token (by id) of the target's vocabulary whose id differs in the drafter's, or ``None`` when the
    drafter speaks the target's tokenizer (it may add tokens, as Dream adds its mask token to Qwen2.5's)."""
    want, got = target_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    return next((t for t, i in sorted(want.items(), key=lambda kv: kv[1]) if got.get(t) != i), None)


def load_released_drafter(spec: str, target, target_tokenizer):
    """A released diffusion LM (:func:`released_family`) loaded as a drafter for ``target``, or ``None`` when
    ``spec`` is not one.

    The drafter must speak the target's tokenizer (:func:`foreign_token`), and both must have logits of the same
    width. Raises :class:`AdapterMismatchError` (one line) otherwise."""
    if released_family(spec) is None:
        return None
    drafter, dtok, _ = load_model(spec, target.device)
    foreign = foreign_token(target_tokenizer, dtok)
    if foreign is not None or drafter.vocab_size != target.vocab_size:
        why = (f"token {foreign!r} is id {target_tokenizer.get_vocab()[foreign]} in the target but "
               f"{dtok.get_vocab().get(foreign)} in the drafter" if foreign is not None
               else f"logits of {drafter.vocab_size} vs {target.vocab_size} tokens")
        raise AdapterMismatchError(f"the drafter {spec} does not speak the target's tokenizer ({why}); use a drafter "
                                   "of the target's tokenizer")
    return drafter


__all__ = ["released_family", "foreign_token", "load_released_drafter", "family_prefix", "load_model",
           "resolve_device", "attach_adapter", "AdapterMismatchError"]
