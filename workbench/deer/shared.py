"""A DEER drafter that shares its target's frozen token embedding and LM head (arXiv:2512.15176 §3 and App. A).

A pretrained AR target (SmolLM2-135M) has no mask or separator token and a 49,152-token vocabulary, whose
embedding alone is 28 M parameters. Its drafter here is the target's own first ``n_layers`` decoder layers and
final norm, turned into a diffusion model by DEER's two stages, while the token embedding and the (tied) LM
head stay the target's frozen tensors: the same objects in memory, never trained, never shipped. What ships
is the drafter's own layers in bfloat16 (one SmolLM2 layer is 3.5 M parameters, 7.1 MB) and a
``workbench.json`` naming the base and its weight fingerprint.

Tokens the target lacks are provided without new trained rows:

* ``[MASK]`` is added as one new embedding row, the mean of the old rows (:func:`~workbench.model.io.
  add_embedding_rows`: deterministic, so the drafter can rebuild it from the base); the target's AR logits
  hide it (:attr:`~workbench.model.trimode.TriModeLM.hide_mask_logit`), so AR decoding is the base's exactly;
* ``[SEP]`` (DEER's separator before the draft block) reuses an existing special token of the base,
  ``<|im_start|>`` by default, which never occurs inside the stdlib answers.

Files of a shared drafter directory: ``drafter.safetensors`` (the non-shared tensors) and ``workbench.json``
(``format: deer-shared-base``, ``n_layers``, ``base_fingerprint``, ``mask_token_id``, ``sep_token``, training
metadata).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from ..model.io import CheckpointError, add_embedding_rows
from ..model.trimode import TriModeLM
from ..tokenizer import require_mask_token

SHARED_FORMAT = "deer-shared-base"
WEIGHTS = "drafter.safetensors"
META = "workbench.json"
#: Separator used when the target's tokenizer has none (an existing SmolLM2 special token).
DEFAULT_SEP = "<|im_start|>"


def is_shared_drafter(path: str | Path) -> bool:
    """True when ``path`` is a directory holding a shared-base DEER drafter."""
    f = Path(path) / META
    if not (Path(path) / WEIGHTS).is_file() or not f.is_file():
        return False
    try:
        return json.loads(f.read_text()).get("format") == SHARED_FORMAT
    except json.JSONDecodeError:
        return False


def prepare_target(target: TriModeLM, tok: PreTrainedTokenizerBase, sep_token: str = DEFAULT_SEP
                   ) -> tuple[TriModeLM, PreTrainedTokenizerBase]:
    """Give an AR target the mask and separator tokens DEER needs, without changing its AR outputs.

    Adds ``[MASK]`` (one mean-initialised embedding row) when the tokenizer lacks it, and hides that row from
    the AR logits; sets the tokenizer's separator to ``sep_token`` (an existing token) when it has none.
    Changes ``target`` and ``tok`` in place and returns them.

    Raises ``ValueError`` when ``sep_token`` is not in the vocabulary.
    """
    if tok.sep_token_id is None:
        if sep_token not in tok.get_vocab():
            raise ValueError(f"separator {sep_token!r} is not a token of the target's tokenizer; pass an existing "
                             "special token as --sep_token")
        tok.sep_token = sep_token
    if not target.has_mask_token or tok.mask_token_id is None:
        mask_id = require_mask_token(tok, add=True)
        if mask_id >= target.backbone.get_input_embeddings().num_embeddings:
            add_embedding_rows(target.backbone, len(tok))
        target.set_added_mask_token(mask_id)
    return target, tok


def _layer_list(backbone) -> tuple[str, torch.nn.ModuleList]:
    """``(qualified name, module list)`` of the backbone's decoder layers, for any Hugging Face family: the
    ModuleList with ``config.num_hidden_layers`` entries (``model.layers`` in Llama, Qwen, Mistral, Gemma;
    ``transformer.h`` in GPT-2; ``gpt_neox.layers``). Raises ``ValueError`` when there is none."""
    n = getattr(backbone.config, "num_hidden_layers", None)
    for name, mod in backbone.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and n:
            return name, mod
    raise ValueError(f"no list of {n} decoder layers found in this {type(backbone).__name__}; a shared-base "
                     "drafter needs a decoder-only Hugging Face model")


def _layers(backbone) -> torch.nn.ModuleList:
    return _layer_list(backbone)[1]


def drafter_from_target(target: TriModeLM, n_layers: int) -> TriModeLM:
    """A drafter of the target's first ``n_layers`` decoder layers (copied, trainable) and final norm, with
    the target's embedding and LM head shared (the same modules, frozen).

    Works for any decoder-only family whose config has ``num_hidden_layers`` (Llama, Qwen, Mistral, Gemma, GPT-2,
    GPT-NeoX). Raises ``ValueError`` for ``n_layers`` outside ``1..`` the target's depth, or no layer list.
    """
    tb = target.backbone
    prefix, layers = _layer_list(tb)
    if not 0 < n_layers <= len(layers):
        raise ValueError(f"the drafter's n_layers must be in 1..{len(layers)} (the target's depth), got {n_layers}")
    cfg = copy.deepcopy(tb.config)
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:n_layers]
    backbone = AutoModelForCausalLM.from_config(cfg).to(dtype=next(tb.parameters()).dtype)
    _share(backbone, tb)          # before loading: the fresh embedding is dropped, not filled
    keep = {k: v for k, v in _own_state(tb).items()
            if _layer_index(k, prefix) is None or _layer_index(k, prefix) < n_layers}
    missing, unexpected = backbone.load_state_dict(keep, strict=False)
    if unexpected or set(missing) & set(_own_state(backbone)):
        raise ValueError(f"the target's first {n_layers} layers do not fit a {n_layers}-layer copy of its config")
    backbone.to(target.device)
    return TriModeLM(backbone, target.mask_token_id)


def _layer_index(key: str, prefix: str) -> int | None:
    """Index of the decoder layer a state-dict key belongs to (``prefix.<i>.…``), or None."""
    if not key.startswith(prefix + "."):
        return None
    head = key[len(prefix) + 1:].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _shared_modules(backbone) -> list[torch.nn.Module]:
    mods = [backbone.get_input_embeddings()]
    out = backbone.get_output_embeddings()
    if out is not None:
        mods.append(out)
    return mods


def _own_state(backbone) -> dict:
    """The backbone's state dict without the shared embedding and head (their module prefixes found once)."""
    shared = [n + "." for n, m in backbone.named_modules() if any(m is s for s in _shared_modules(backbone))]
    return {k: v for k, v in backbone.state_dict().items() if not k.startswith(tuple(shared))}


def _share(backbone, target_backbone) -> None:
    """Point ``backbone``'s embedding and head at the target's modules and freeze them."""
    emb = target_backbone.get_input_embeddings()
    backbone.set_input_embeddings(emb)
    head = target_backbone.get_output_embeddings()
    if head is not None:
        backbone.set_output_embeddings(head)
    for m in _shared_modules(target_backbone):
        for p in m.parameters():
            p.requires_grad_(False)


def save_shared_drafter(drafter: TriModeLM, target: TriModeLM, tok: PreTrainedTokenizerBase, out_dir: str | Path,
                        meta: dict, base_fingerprint: str) -> Path:
    """Write the drafter's own (non-shared) tensors in bfloat16 and ``workbench.json`` to ``out_dir``.

    ``base_fingerprint``: :func:`~workbench.model.fingerprint.weights_fingerprint` of the prepared target (the
    base the drafter must be loaded on; its mask row is deterministic)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bb = drafter.backbone
    own = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in _own_state(bb).items()}
    save_file(own, str(out / WEIGHTS))
    info = {**meta, "format": SHARED_FORMAT, "n_layers": len(_layers(bb)), "base_fingerprint": base_fingerprint,
            "mask_token_id": drafter.mask_token_id, "sep_token": tok.sep_token,
            "vocab_size": bb.get_input_embeddings().num_embeddings}
    (out / META).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out


def load_shared_drafter(path: str | Path, target: TriModeLM, tok: PreTrainedTokenizerBase,
                        base_fingerprint: str | None = None) -> TriModeLM:
    """Rebuild a shared-base drafter on ``target`` (prepared with :func:`prepare_target`) from ``path``.

    ``base_fingerprint``: the prepared target's weights fingerprint (checked against the drafter's; skipped when
    ``None``).

    Raises :class:`~workbench.model.io.CheckpointError` (one line) when the drafter was trained on other base
    weights (both fingerprints named), with another mask token, vocabulary size or separator, or when its
    tensors do not fit the target's architecture.
    """
    from safetensors.torch import load_file

    path = Path(path)
    meta = json.loads((path / META).read_text())
    want = meta.get("base_fingerprint")
    if base_fingerprint is not None and want and want != base_fingerprint:
        raise CheckpointError(f"the DEER drafter in {path} was trained on base weights {want}, but the target has "
                              f"weights {base_fingerprint}; use the target it was trained on")
    vocab = target.backbone.get_input_embeddings().num_embeddings
    for key, have in (("mask_token_id", target.mask_token_id), ("vocab_size", vocab), ("sep_token", tok.sep_token)):
        if meta.get(key) is not None and meta[key] != have:
            raise CheckpointError(f"the DEER drafter in {path} has {key} {meta[key]!r}, the target {have!r}; "
                                  "prepare the target as in training (workbench.deer.shared.prepare_target)")
    drafter = drafter_from_target(target, int(meta["n_layers"]))
    state = load_file(str(path / WEIGHTS))
    dtype = next(p for p in drafter.backbone.parameters() if p.requires_grad).dtype
    try:
        missing, unexpected = drafter.backbone.load_state_dict({k: v.to(dtype) for k, v in state.items()},
                                                               strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"the DEER drafter in {path} does not fit the target's architecture "
                              f"({str(e).splitlines()[0]})") from None
    missing = sorted(set(missing) & set(_own_state(drafter.backbone)))
    if missing or unexpected:
        raise CheckpointError(f"the DEER drafter in {path} does not fit the target: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    return drafter.to(target.device).eval()


def load_drafter_for(path: str | Path, target: TriModeLM, tok: PreTrainedTokenizerBase) -> TriModeLM:
    """Load the shared-base drafter in ``path`` for ``target``: prepares the target (mask and separator tokens,
    in place, :func:`prepare_target`) with the drafter's separator and checks the base fingerprint.

    Raises :class:`~workbench.model.io.CheckpointError` as :func:`load_shared_drafter`."""
    from ..model.fingerprint import weights_fingerprint

    meta = json.loads((Path(path) / META).read_text())
    prepare_target(target, tok, meta.get("sep_token") or DEFAULT_SEP)
    drafter = load_shared_drafter(path, target, tok, weights_fingerprint(target))
    drafter.sep_token_id = int(tok.sep_token_id)
    return drafter


def load_standalone(path: str | Path, device=None) -> tuple[TriModeLM, PreTrainedTokenizerBase]:
    """Load the shared-base drafter in ``path`` on its own copy of the base it was trained on (the ``target``
    recorded in its ``workbench.json``), for a target that is not that base itself, e.g. the gated tri-mode
    conversion of the same base (whose AR mode is the base exactly). Only the drafter's layers and the base's
    embedding and head stay in memory. Returns ``(drafter, the prepared base tokenizer)``.

    Raises :class:`~workbench.model.io.CheckpointError` when the record names no base or the base's weights
    differ from those the drafter was trained on."""
    from ..model.load import load_model

    meta = json.loads((Path(path) / META).read_text())
    base = meta.get("target")
    if not base:
        raise CheckpointError(f"the DEER drafter in {path} does not record its base model ('target'); load it "
                              "with that base as the target")
    target, tok, _ = load_model(str(base), device or "cpu")
    target.eval()
    return load_drafter_for(path, target, tok), tok


__all__ = ["load_drafter_for", "load_standalone", "SHARED_FORMAT", "is_shared_drafter", "prepare_target", "drafter_from_target", "save_shared_drafter",
           "load_shared_drafter"]
