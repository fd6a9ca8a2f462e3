"""Opening a released diffusion LM's checkpoint folder with transformers' built-in classes and no remote code:
config translation, weight-name map, the family's own tokenizer and mask id, one-line errors."""
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


def checkpoint_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor of the folder's safetensors weights (single, or the shards a
    ``model.safetensors.index.json`` names), read from the file headers: no tensor is loaded.

    Raises :class:`FamilyError` (one line) when the folder has no safetensors weights, the index is not one, a
    shard is missing, or a file is not readable safetensors."""
    from safetensors import safe_open

    p = Path(path)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as e:
            raise FamilyError(f"{index} is not a safetensors index ({type(e).__name__}: {e}); restore it") from None
    elif (p / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FamilyError(f"{p} holds no safetensors weights ({' or '.join(WEIGHT_FILES)}); convert .bin weights "
                          "with safetensors first")
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        f = p / name
        if not f.is_file():
            raise FamilyError(f"{index} names the shard {name}, which is not in {p}; restore the missing shard")
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    shapes[k] = tuple(h.get_slice(k).get_shape())
        except Exception as e:  # noqa: BLE001 - a truncated or foreign file, in one line
            raise FamilyError(f"{f} is not a readable safetensors file ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}); restore it") from None
    return shapes


def checkpoint_keys(path: str | Path) -> list[str]:
    """The sorted weight names of the folder's safetensors files (:func:`checkpoint_shapes`)."""
    return sorted(checkpoint_shapes(path))


#: Config fields holding special token ids, which must index the embedding.
SPECIAL_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def backbone_config(spec: FamilySpec, raw: dict):
    """The built-in transformers config of ``spec``'s backbone for the raw ``config.json`` dict ``raw``, without
    the training-only fields (:data:`~workbench.model.families.builtin.TRAINING_ONLY`).

    Raises :class:`FamilyError` (one line) for fields the backbone's config refuses, and for a special token id
    (pad, BOS, EOS) outside the vocabulary."""
    from transformers import AutoConfig

    fields = spec.config_map(raw) if spec.config_map is not None else dict(raw)
    try:
        cfg = AutoConfig.for_model(spec.backbone, **fields)
    except Exception as e:  # noqa: BLE001
        raise FamilyError(f"the config.json of this {spec.name} checkpoint does not give a {spec.backbone} config "
                          f"({type(e).__name__}: {' '.join(str(e).split())})") from None
    vocab = int(cfg.vocab_size)
    for field in SPECIAL_ID_FIELDS:
        value = getattr(cfg, field, None)
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and not (isinstance(i, int) and 0 <= i < vocab):
                raise FamilyError(f"the config.json of this {spec.name} checkpoint gives {field} {value}, outside its "
                                  f"vocabulary of {vocab} tokens; fix {field} (or vocab_size) in config.json")
    return cfg


def check_layout(spec: FamilySpec, cfg, shapes, where) -> None:
    """Compare the checkpoint's weight names, renamed by ``spec.key_renames``, and shapes with the built-in class's.

    ``shapes``: :func:`checkpoint_shapes` of the folder (a list of names checks the names only). Raises
    :class:`FamilyError` naming the first missing and the first unexpected weight (after renaming), or the first
    tensor whose shape differs (both shapes), so a folder of another family, a damaged index or a config.json of
    other sizes is refused before anything is loaded."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(cfg).state_dict().items()}
    if getattr(cfg, "tie_word_embeddings", False):
        want.pop("lm_head.weight", None)
    if not isinstance(shapes, dict):
        shapes = dict.fromkeys(shapes)
    got = {rename_key(k, spec.key_renames): (k, v) for k, v in shapes.items()}
    missing, unexpected = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (first: {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (first: {unexpected[0]})")
        raise FamilyError(f"{where}: the weights do not fit the {spec.name} layout ({'; '.join(parts)}, after "
                          f"renaming to {spec.backbone}'s names); is this a {spec.name} checkpoint?")
    for name in sorted(want):
        ckpt_name, shape = got[name]
        if shape is not None and tuple(shape) != want[name]:
            raise FamilyError(wrong_shape(where, ckpt_name, shape, want[name]))


def wrong_shape(where, name: str, got, want) -> str:
    """The one-line message of a checkpoint tensor whose shape is not the one its config.json describes."""
    return (f"{where}: tensor {name} has shape {list(got)} in the weights, but config.json describes "
            f"{list(want)}; the weights and config.json do not belong together (restore the config.json that came "
            "with the weights)")


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
    tokenizer.

    Raises :class:`FamilyError` (one line) when it is missing, outside the ``rows`` of the embedding, the id of
    the end-of-sequence, padding or beginning token, or not the tokenizer's own mask token
    (:func:`check_mask_token`)."""
    mask = raw.get(spec.mask_field) if spec.mask_field else None
    if mask is None and spec.mask_token:
        got = tok.convert_tokens_to_ids(spec.mask_token)
        mask = got if got is not None and got != tok.unk_token_id else None
    if mask is None:
        if spec.mask_field is None and spec.mask_token is None:
            return None
        raise FamilyError(f"{where}: no mask token id ({spec.mask_field} in config.json, or the token "
                          f"{spec.mask_token!r} in the tokenizer); a {spec.name} checkpoint has one")
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < rows:
        raise FamilyError(f"{where}: mask token id {mask} is outside the vocabulary ({rows} embedding rows); "
                          f"fix {spec.mask_field} in config.json")
    check_mask_token(mask, raw, tok, where, spec.mask_field or f"the tokenizer's {spec.mask_token!r}")
    return mask


def _ids(value) -> list[int]:
    """A config or tokenizer id field (an int, a list of ints, or None) as a list of ints."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def tokenizer_mask_id(tok) -> int | None:
    """The tokenizer's own mask token id: its declared ``mask_token``, else the one added special token whose text
    contains ``mask`` (``<|MASK|>``, ``<|mdm_mask|>``, ``|<MASK>|``...); ``None`` when it has none, or several."""
    if getattr(tok, "mask_token", None) is not None and tok.mask_token_id is not None:
        return int(tok.mask_token_id)
    found = [i for i, t in getattr(tok, "added_tokens_decoder", {}).items()
             if getattr(t, "special", False) and "mask" in str(t.content).lower()]
    return int(found[0]) if len(found) == 1 else None


def check_mask_token(mask: int, raw: dict, tok, where, field: str) -> None:
    """Refuse a mask id that is also the end-of-sequence, padding or beginning-of-sequence token (config.json's or
    the tokenizer's: decoding would stop at, or pad with, masks), or that is not the tokenizer's own mask token
    (:func:`tokenizer_mask_id`). Raises :class:`FamilyError` (one line) naming both ids and the field to fix."""
    for what, ids in (("end-of-sequence", _ids(raw.get("eos_token_id")) + _ids(tok.eos_token_id)),
                      ("padding", _ids(raw.get("pad_token_id")) + _ids(tok.pad_token_id)),
                      ("beginning-of-sequence", _ids(raw.get("bos_token_id")) + _ids(tok.bos_token_id))):
        if mask in ids:
            raise FamilyError(f"{where}: mask token id {mask} is also the {what} token "
                              f"({tok.convert_ids_to_tokens(mask)!r}); a mask needs a token of its own: fix {field}")
    own = tokenizer_mask_id(tok)
    if own is not None and own != mask:
        raise FamilyError(f"{where}: the mask token id {mask} ({tok.convert_ids_to_tokens(mask)!r}, from {field}) is "
                          f"not the tokenizer's mask token {tok.convert_ids_to_tokens(own)!r} (id {own}); set {field} "
                          f"to {own}, or restore the tokenizer that came with the weights")


def block_size_of(spec: FamilySpec, raw: dict, where) -> int | None:
    """The trained block size: config field ``spec.block_field`` or ``spec.default_block``. Raises
    :class:`FamilyError` for a value that is not a positive integer."""
    block = raw.get(spec.block_field) if spec.block_field else None
    block = spec.default_block if block is None else block
    if block is not None and (not isinstance(block, int) or block <= 0):
        raise FamilyError(f"{where}: {spec.block_field} = {block!r} is not a positive block size; fix config.json")
    return block


def load_weights(cls, path: str | Path, family: str, rename=None, **kwargs):
    """``cls.from_pretrained(path, output_loading_info=True, **kwargs)`` with transformers' load report silenced and
    every failure as one :class:`FamilyError` line: a weight the folder lacks (its value would be random), a tensor
    of another shape than the config describes (named, with both shapes; ``rename`` maps the class's weight names
    to the checkpoint's), or a weight holding NaN or infinity (:func:`~workbench.model.finite.check_finite`).
    Returns the model."""
    from transformers.utils import logging as hf_logging

    from ..finite import check_finite

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = cls.from_pretrained(path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - one line
        raise FamilyError(f"could not load the {family} weights of {path}: {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    rename = rename or (lambda k: k)
    mismatched = sorted(info.get("mismatched_keys") or [])
    if mismatched:
        name, got, want = mismatched[0]
        raise FamilyError(wrong_shape(path, rename(name), got, want))
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise FamilyError(f"{path}: {len(missing)} weights of the {family} layout were not loaded (first: "
                          f"{missing[0]}); the folder's weights are incomplete")
    try:
        check_finite(model, path, rename)
    except ValueError as e:
        raise FamilyError(str(e)) from None
    return model


def load_family(path: str | Path, spec: FamilySpec, raw: dict, device="cpu", dtype: torch.dtype = torch.float32,
                attn_implementation: str | None = None):
    """Open the checkpoint folder ``path`` of family ``spec`` (``raw``: its ``config.json``).

    Builds ``spec.backbone``'s built-in class from the translated config (training-only fields dropped), checks the
    weight names and shapes, the mask id and the block size, then loads the safetensors weights (single or
    sharded) under ``spec.key_renames`` with ``trust_remote_code`` never used, refuses non-finite weights, and wraps
    the backbone in the family's adapter with the mask id and block size read from the checkpoint.

    ``attn_implementation``: the backbone's attention implementation (default: the process's, else ``sdpa``;
    :func:`~workbench.model.loading.attn_implementation`), never the config's.

    Returns ``(model, tokenizer, family)``: ``family`` is :meth:`~workbench.model.families.spec.FamilySpec.semantics`
    with the mask id, block size, ``model_type`` and attention implementation (``workbench.model.io.load_checkpoint``
    puts it in the meta).

    Raises :class:`FamilyError` (one line) for weights that do not fit the layout or hold NaN/inf, a tokenizer that
    cannot be read, a bad mask id or block size.
    """
    from transformers import AutoModelForCausalLM

    from ..loading import attn_implementation as resolve_attn

    p = Path(path)
    attn = resolve_attn(attn_implementation)
    tok = load_tokenizer(p)
    block = block_size_of(spec, raw, p)
    inverse = (lambda k: rename_key(k, spec.inverse_renames)) if spec.inverse_renames else None
    if spec.loader is not None:
        backbone = spec.loader(p, raw, device, dtype, attn)
        mask = mask_token_of(spec, raw, tok, backbone.get_input_embeddings().num_embeddings, p)
    else:
        cfg = backbone_config(spec, raw)
        check_layout(spec, cfg, checkpoint_shapes(p), p)
        mask = mask_token_of(spec, raw, tok, int(cfg.vocab_size), p)
        backbone = load_weights(AutoModelForCausalLM, p, spec.name, rename=inverse, config=cfg, dtype=dtype,
                                key_mapping=dict(spec.key_renames) or None, attn_implementation=attn)
    if mask is not None and tok.mask_token is None:
        tok.mask_token = tok.convert_ids_to_tokens(mask)      # the checkpoint's own token, no row added
    backbone.to(device).eval()
    model = spec.adapter(backbone, spec, mask, block)
    family = {**spec.semantics(), "mask_token_id": mask, "block_size": block, "model_type": raw.get("model_type"),
              "attn_implementation": backbone.config._attn_implementation}
    return model, tok, family


__all__ = ["load_family", "load_weights", "read_config", "checkpoint_shapes", "checkpoint_keys", "backbone_config",
           "check_layout", "wrong_shape", "load_tokenizer", "mask_token_of", "tokenizer_mask_id", "check_mask_token",
           "block_size_of", "SPECIAL_ID_FIELDS"]
