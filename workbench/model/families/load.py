"""Opening a released diffusion LM's checkpoint folder with transformers' built-in classes and no remote code
(issue 57 §1): config translation, weight-name map, the family's own tokenizer and mask id, one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .spec import FamilyError, FamilySpec, rename_key

#: Weight files a checkpoint folder may hold (safetensors, single or sharded with an index).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def read_config(path: str | Path) -> dict:
    """The folder's ``config.json`` as a dict. Raises :class:`FamilyError` (one line) when it is missing or not
    JSON."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise FamilyError(f"{path} is not a Hugging Face checkpoint (no config.json); pass a checkpoint folder")
    try:
        raw = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FamilyError(f"{f} is not valid JSON ({e}); restore the config.json that came with the weights") from None
    if not isinstance(raw, dict):
        raise FamilyError(f"{f} does not hold a JSON object; restore the config.json that came with the weights")
    return raw


def checkpoint_keys(path: str | Path) -> list[str]:
    """The weight names of the folder's safetensors files, read from their headers (no tensor is loaded).
    Raises :class:`FamilyError` when the folder has no safetensors weights."""
    from safetensors import safe_open

    p = Path(path)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            return sorted(json.loads(index.read_text())["weight_map"])
        except (json.JSONDecodeError, KeyError) as e:
            raise FamilyError(f"{index} is not a safetensors index ({type(e).__name__}: {e}); restore it") from None
    single = p / "model.safetensors"
    if not single.is_file():
        raise FamilyError(f"{p} holds no safetensors weights ({' or '.join(WEIGHT_FILES)}); convert .bin weights "
                          "with safetensors first")
    try:
        with safe_open(str(single), framework="pt") as f:
            return sorted(f.keys())
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file, in one line
        raise FamilyError(f"{single} is not a readable safetensors file ({type(e).__name__}: {e}); "
                          "restore it") from None


def backbone_config(spec: FamilySpec, raw: dict):
    """The built-in transformers config of ``spec``'s backbone for the raw ``config.json`` dict ``raw``."""
    from transformers import AutoConfig

    fields = spec.config_map(raw) if spec.config_map is not None else dict(raw)
    try:
        return AutoConfig.for_model(spec.backbone, **fields)
    except Exception as e:  # noqa: BLE001
        raise FamilyError(f"the config.json of this {spec.name} checkpoint does not give a {spec.backbone} config "
                          f"({type(e).__name__}: {' '.join(str(e).split())})") from None


def check_layout(spec: FamilySpec, cfg, keys: list[str], where) -> None:
    """Compare the checkpoint's weight names, renamed by ``spec.key_renames``, with the built-in class's.

    Raises :class:`FamilyError` naming the first missing and the first unexpected weight (after renaming), so a
    folder of another family or a damaged index is refused before anything is loaded."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        want = set(AutoModelForCausalLM.from_config(cfg).state_dict())
    if getattr(cfg, "tie_word_embeddings", False):
        want.discard("lm_head.weight")
    got = {rename_key(k, spec.key_renames) for k in keys}
    missing, unexpected = sorted(want - got), sorted(got - want)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (first: {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (first: {unexpected[0]})")
        raise FamilyError(f"{where}: the weights do not fit the {spec.name} layout ({'; '.join(parts)}, after "
                          f"renaming to {spec.backbone}'s names); is this a {spec.name} checkpoint?")


def load_tokenizer(path: str | Path):
    """The checkpoint's own tokenizer, read from its ``tokenizer.json`` / ``tokenizer_config.json`` without the
    config's ``auto_map`` (a released dLLM's remote code is never run, and transformers would ask whether to run
    it). Falls back to ``AutoTokenizer`` for a folder without ``tokenizer.json``. Raises :class:`FamilyError` when
    no tokenizer can be read."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    p = Path(path)
    try:
        if (p / "tokenizer.json").is_file():
            tok = PreTrainedTokenizerFast.from_pretrained(p)
            if tok.chat_template is None and (p / "chat_template.jinja").is_file():
                tok.chat_template = (p / "chat_template.jinja").read_text()
            return tok
        return AutoTokenizer.from_pretrained(p, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - one line
        raise FamilyError(f"could not load a tokenizer from {p} ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}); the folder needs tokenizer.json") from None


def mask_token_of(spec: FamilySpec, raw: dict, tok, rows: int, where) -> int | None:
    """The family's mask id: the config's ``spec.mask_field``, else the id of ``spec.mask_token`` in the
    tokenizer. Raises :class:`FamilyError` when it is missing or outside the ``rows`` of the embedding."""
    mask = raw.get(spec.mask_field) if spec.mask_field else None
    if mask is None and spec.mask_token:
        got = tok.convert_tokens_to_ids(spec.mask_token)
        mask = got if got is not None and got != tok.unk_token_id else None
    if mask is None:
        if spec.mask_field is None and spec.mask_token is None:
            return None
        raise FamilyError(f"{where}: no mask token id ({spec.mask_field} in config.json, or the token "
                          f"{spec.mask_token!r} in the tokenizer); a {spec.name} checkpoint has one")
    if not isinstance(mask, int) or not 0 <= mask < rows:
        raise FamilyError(f"{where}: mask token id {mask} is outside the vocabulary ({rows} embedding rows); "
                          f"fix {spec.mask_field} in config.json")
    return mask


def block_size_of(spec: FamilySpec, raw: dict, where) -> int | None:
    """The trained block size: config field ``spec.block_field`` or ``spec.default_block``. Raises
    :class:`FamilyError` for a value that is not a positive integer."""
    block = raw.get(spec.block_field) if spec.block_field else None
    block = spec.default_block if block is None else block
    if block is not None and (not isinstance(block, int) or block <= 0):
        raise FamilyError(f"{where}: {spec.block_field} = {block!r} is not a positive block size; fix config.json")
    return block


def load_weights(cls, path: str | Path, family: str, **kwargs):
    """``cls.from_pretrained(path, output_loading_info=True, **kwargs)`` with transformers' load report silenced,
    every failure as one :class:`FamilyError` line, and a weight the folder lacks refused (its value would be
    random). Returns the model."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = cls.from_pretrained(path, output_loading_info=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - one line
        raise FamilyError(f"could not load the {family} weights of {path}: {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise FamilyError(f"{path}: {len(missing)} weights of the {family} layout were not loaded (first: "
                          f"{missing[0]}); the folder's weights are incomplete")
    return model


def load_family(path: str | Path, spec: FamilySpec, raw: dict, device="cpu", dtype: torch.dtype = torch.float32):
    """Open the checkpoint folder ``path`` of family ``spec`` (``raw``: its ``config.json``).

    Builds ``spec.backbone``'s built-in class from the translated config, loads the safetensors weights (single or
    sharded) under ``spec.key_renames`` with ``trust_remote_code`` never used, and wraps it in the family's adapter
    with the mask id and block size read from the checkpoint.

    Returns ``(model, tokenizer, family)``: ``family`` is :meth:`~workbench.model.families.spec.FamilySpec.semantics`
    with the mask id, block size and ``model_type`` (``workbench.model.io.load_checkpoint`` puts it in the meta).

    Raises :class:`FamilyError` (one line) for weights that do not fit the layout, a tokenizer that cannot be
    read, a mask id outside the vocabulary or a bad block size.
    """
    from transformers import AutoModelForCausalLM

    p = Path(path)
    tok = load_tokenizer(p)
    if spec.loader is not None:
        backbone = spec.loader(p, raw, device, dtype)
    else:
        cfg = backbone_config(spec, raw)
        check_layout(spec, cfg, checkpoint_keys(p), p)
        backbone = load_weights(AutoModelForCausalLM, p, spec.name, config=cfg, dtype=dtype,
                                key_mapping=dict(spec.key_renames) or None)
    rows = backbone.get_input_embeddings().num_embeddings
    mask = mask_token_of(spec, raw, tok, rows, p)
    block = block_size_of(spec, raw, p)
    if mask is not None and tok.mask_token is None:
        tok.mask_token = tok.convert_ids_to_tokens(mask)      # the checkpoint's own token, no row added
    backbone.to(device).eval()
    model = spec.adapter(backbone, spec, mask, block)
    family = {**spec.semantics(), "mask_token_id": mask, "block_size": block, "model_type": raw.get("model_type")}
    return model, tok, family


__all__ = ["load_family", "load_weights", "read_config", "checkpoint_keys", "backbone_config", "check_layout", "load_tokenizer",
           "mask_token_of", "block_size_of"]
