"""The two models of DEER (arXiv:2512.15176 §3): an AR **target** and a separate, smaller diffusion **drafter**.

* target: any causal LM loaded as a :class:`~workbench.model.trimode.TriModeLM` and used in AR mode only
  (``builtin:tiny`` by default, or a ``save_pretrained`` checkpoint directory);
* drafter: a :class:`~workbench.model.trimode.TriModeLM` built fresh from a small preset
  (``deer_drafter`` by default) with the target's tokenizer, loaded from any tri-mode checkpoint, or started
  from a released diffusion LM (:func:`released_family`; the paper starts its code drafter from Open-dCoder-0.5B,
  a released dLLM: DEER, arXiv:2512.15176 §4 and App. B).

Drafter and target must share one tokenizer: draft token ids are fed to the target unchanged, so
:func:`check_shared_tokenizer` compares the full vocabularies (token → id) and the special ids. A drafter started
from a released dLLM keeps that checkpoint's tokenizer, mask token and built-in class; its tokenizer must hold
every token of the target's at the same id and may add its own (mask, separator), and both models' logits must
have one width (:func:`check_speaks_target`).
"""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, PreTrainedTokenizerBase

from ..model.presets import PRESETS, preset_config
from ..model.trimode import TriModeLM
from ..tokenizer import TokenizerError

#: Special tokens whose ids must agree between drafter and target.
SPECIALS = ("mask_token_id", "sep_token_id", "eos_token_id", "pad_token_id")
#: ``workbench.json`` key of a DEER drafter trained from a released diffusion LM: that dLLM's family name.
RELEASED_KEY = "released_family"
#: Separator of a released dLLM's drafter whose tokenizer (and the target's) has none (as :mod:`.shared`'s).
DEFAULT_SEP = "<|im_start|>"


class TokenizerMismatchError(TokenizerError):
    """Drafter and target tokenizers differ (vocabulary ids or special tokens)."""


def check_shared_tokenizer(target_tok: PreTrainedTokenizerBase, drafter_tok: PreTrainedTokenizerBase) -> None:
    """Raise :class:`TokenizerMismatchError` (one line) unless both tokenizers map every token to the same
    id and agree on the mask, separator, end-of-sequence and padding ids; also raise it when the shared
    tokenizer has no mask or separator token (DEER needs both, arXiv:2512.15176 §3.1)."""
    tv, dv = target_tok.get_vocab(), drafter_tok.get_vocab()
    if len(tv) != len(dv):
        raise TokenizerMismatchError(f"drafter and target tokenizers differ: {len(dv)} tokens in the drafter, "
                                     f"{len(tv)} in the target; the drafter must use the target's tokenizer")
    for tok, i in sorted(tv.items(), key=lambda kv: kv[1]):
        if dv.get(tok) != i:
            raise TokenizerMismatchError(f"drafter and target tokenizers differ: token {tok!r} has id {i} in the "
                                         f"target and {dv.get(tok)} in the drafter")
    for name in SPECIALS:
        a, b = getattr(target_tok, name), getattr(drafter_tok, name)
        if a != b:
            raise TokenizerMismatchError(f"drafter and target tokenizers differ: {name} is {a} in the target and "
                                         f"{b} in the drafter")
    for name in ("mask_token_id", "sep_token_id"):
        if getattr(drafter_tok, name) is None:
            raise TokenizerMismatchError(f"the shared tokenizer has no {name[:-9]} token; DEER needs [MASK] and [SEP]")


def check_speaks_target(target: TriModeLM, target_tok: PreTrainedTokenizerBase, drafter: TriModeLM,
                        drafter_tok: PreTrainedTokenizerBase, what: str) -> None:
    """Raise :class:`TokenizerMismatchError` (one line) unless every token of the target's vocabulary has the same
    id in the drafter's (the drafter may add tokens: its mask, a separator) and both models' logits have one width.
    ``what``: the drafter, for the message."""
    from ..model.load import foreign_token

    foreign = foreign_token(target_tok, drafter_tok)
    if foreign is not None:
        raise TokenizerMismatchError(f"the drafter {what} does not speak the target's tokenizer (token {foreign!r} is "
                                     f"id {target_tok.get_vocab()[foreign]} in the target but "
                                     f"{drafter_tok.get_vocab().get(foreign)} in the drafter); start from a dLLM of "
                                     "the target's tokenizer")
    check_vocab_sizes(target, drafter)


def serves_deer(spec) -> bool:
    """True when the released family ``spec``'s denoising forward is DEER's drafter forward
    (:mod:`workbench.deer.attention`): a built-in backbone, a mask token, the block bidirectional over a causal KV
    prefix and itself (``window``, commits ``causal``), unshifted logits, blocks not tied to absolute positions."""
    return (spec.backbone is not None and bool(spec.mask_field or spec.mask_token)
            and spec.diffusion_attention == "window" and spec.commit_attention == "causal" and not spec.shift
            and not spec.aligned)


def _forward_of(spec) -> str:
    """What ``spec``'s forward does that DEER's drafter forward does not, in words."""
    parts = []
    if spec.backbone is None:
        parts.append("its own native class")
    if not (spec.mask_field or spec.mask_token):
        parts.append("no mask token")
    if spec.diffusion_attention != "window":
        parts.append({"full": "full bidirectional attention over the whole sequence",
                      "block_causal": "block-causal attention at absolute positions",
                      "causal": "causal attention (masks are look-ahead slots)"}[spec.diffusion_attention])
    if spec.commit_attention is None:
        parts.append("no KV cache")
    elif spec.aligned and spec.diffusion_attention == "window":
        parts.append("blocks at absolute positions")
    if spec.shift:
        parts.append("shifted logits")
    return ", ".join(parts)


def released_family(spec: str | None):
    """The :class:`~workbench.model.families.spec.FamilySpec` of ``spec`` when it is a released diffusion LM
    (:func:`workbench.model.load.released_family`), else ``None``. Reads only ``config.json``.

    Raises :class:`~workbench.model.families.spec.FamilyError` (one line, naming the family) for a family whose
    forward cannot serve DEER's drafter (:func:`serves_deer`): DEER's drafter attends causally to the verified prefix
    (a KV cache) and bidirectionally to ``[SEP, masks]``, unshifted, which is NLD's window attention; SDAR and
    Fast-dLLM v2 (block-causal at absolute positions), LLaDA and Dream (full attention, no KV cache), I-DLM (causal,
    shifted) and DiffusionGemma (no mask token) are refused."""
    from ..model.families.registry import FAMILIES
    from ..model.families.spec import FamilyError
    from ..model.load import family_prefix, released_family as find_family

    fam = find_family(spec)
    if fam is not None and not serves_deer(fam):
        folder = family_prefix(str(spec))[1]
        able = ", ".join(sorted(s.name for s in FAMILIES.values() if serves_deer(s)))
        raise FamilyError(f"a DEER drafter cannot start from the {fam.name} checkpoint {folder}: its forward has "
                          f"{_forward_of(fam)}, but DEER's drafter reads the verified prefix causally (KV cache) and "
                          f"[SEP, masks] bidirectionally with unshifted logits; families that can: {able}")
    return fam


def give_separator(tok: PreTrainedTokenizerBase, drafter: TriModeLM, target_tok: PreTrainedTokenizerBase,
                   sep_token: str = DEFAULT_SEP) -> int:
    """Set the separator of a released dLLM's tokenizer ``tok`` (in place) and return its id: the target's
    separator if it has one, else ``tok``'s own, else the existing token ``sep_token``, else ``sep_token`` added at
    the first unused row of the drafter's embedding (released checkpoints pad their embedding past the tokenizer;
    no parameter is added, the logits keep their width).

    Raises :class:`~workbench.tokenizer.TokenizerError` (one line) when ``sep_token`` is no token and the embedding
    has no unused row, or the separator is the mask token."""
    rows = drafter.backbone.get_input_embeddings().num_embeddings
    if target_tok.sep_token_id is not None:
        tok.sep_token = target_tok.sep_token
    elif tok.sep_token_id is None:
        if sep_token in tok.get_vocab():
            tok.sep_token = sep_token
        elif len(tok) < rows:
            tok.add_special_tokens({"sep_token": sep_token})
        else:
            raise TokenizerError(f"the drafter's tokenizer has no separator token {sep_token!r} and its embedding no "
                                 f"unused row for one ({rows} rows, {len(tok)} tokens); pass one of its existing "
                                 "special tokens as --sep_token")
    sep = tok.sep_token_id
    if sep is None or not 0 <= sep < rows or sep == drafter.mask_token_id:
        raise TokenizerError(f"separator {tok.sep_token!r} (id {sep}) is not a usable DEER separator of the drafter "
                             f"({rows} embedding rows, mask id {drafter.mask_token_id}); pass another --sep_token")
    return int(sep)


def count_parameters(model: TriModeLM) -> int:
    """Number of distinct parameters of ``model`` (tied embeddings counted once)."""
    return sum(p.numel() for p in model.backbone.parameters())


def load_target(spec: str, device: str | torch.device = "cpu") -> tuple[TriModeLM, PreTrainedTokenizerBase]:
    """Load the AR target (``'builtin:tiny'`` or a checkpoint directory) in eval mode.

    Raises :class:`~workbench.model.io.CheckpointError` / ``FileNotFoundError`` for a bad path and
    :class:`~workbench.tokenizer.TokenizerError` when its tokenizer has no mask token.
    """
    from ..model.load import load_model

    model, tok, _ = load_model(spec, device)
    model.eval()
    return model, tok


def keep_first_layers(model: TriModeLM, n_layers: int) -> TriModeLM:
    """Drop every decoder layer of ``model`` after the first ``n_layers`` (in place; returns ``model``): a
    smaller drafter initialised from a trained tri-mode model (embeddings, first layers, final norm, head).
    Any decoder-only family: the layer list is the one with ``num_hidden_layers`` entries (``model.layers``,
    GPT-2's ``transformer.h``, ``gpt_neox.layers``), and ``layer_types`` is cut to match.

    Raises ``ValueError`` when the backbone has no layer list or ``n_layers`` is not in ``1..len(layers)``.
    """
    from .shared import _layer_list

    name, layers = _layer_list(model.backbone)
    if not 0 < n_layers <= len(layers):
        raise ValueError(f"init_layers must be in 1..{len(layers)}, got {n_layers}")
    parent_name, _, attr = name.rpartition(".")
    parent = model.backbone.get_submodule(parent_name) if parent_name else model.backbone
    setattr(parent, attr, torch.nn.ModuleList(list(layers)[:n_layers]))
    cfg = model.backbone.config
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[:n_layers]
    return model


def family_config(target_config, preset: str, vocab_size: int):
    """The config of a fresh drafter in the target's own family, sized by ``preset`` (width, depth, heads):
    the target's config with those fields replaced (Hugging Face's attribute names map them, e.g. GPT-2's
    ``n_embd``), ``head_dim`` set to width / heads where the family has one, and ``layer_types`` following the
    target's pattern. Llama targets get the preset's own ``LlamaConfig`` (:func:`~workbench.model.presets.preset_config`).
    Raises ``ValueError`` for an unknown preset."""
    import copy

    from ..model.presets import preset_sizes

    if target_config.model_type == "llama":
        return preset_config(preset, vocab_size=vocab_size)
    sizes = preset_sizes(preset)
    cfg = copy.deepcopy(target_config)
    cfg.vocab_size = vocab_size
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        setattr(cfg, key, sizes[key])
    for key in ("intermediate_size", "num_key_value_heads"):
        if hasattr(cfg, key) and getattr(cfg, key) is not None:
            setattr(cfg, key, sizes[key])
    if hasattr(cfg, "n_inner"):                 # GPT-2's MLP width (None: 4 × width)
        cfg.n_inner = sizes["intermediate_size"]
    if getattr(cfg, "head_dim", None) is not None:
        cfg.head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
    if getattr(cfg, "layer_types", None):
        pattern = list(cfg.layer_types)
        cfg.layer_types = [pattern[i % len(pattern)] for i in range(sizes["num_hidden_layers"])]
    return cfg


def build_drafter(target: TriModeLM, target_tok: PreTrainedTokenizerBase, preset: str = "deer_drafter",
                  drafter_init: str | None = None, seed: int = 0, init_layers: int | None = None,
                  sep_token: str = DEFAULT_SEP) -> tuple[TriModeLM, PreTrainedTokenizerBase]:
    """The drafter: fresh from ``preset`` in the target's own family (:func:`family_config`; vocabulary size and
    specials of the target) or loaded from the tri-mode checkpoint ``drafter_init`` (optionally keeping only its
    first ``init_layers`` layers).

    ``drafter_init`` may be a released diffusion LM (:func:`released_family`: a family whose forward is DEER's
    drafter forward, NLD) or a DEER drafter trained from one (``released_family`` in its ``workbench.json``): the
    drafter is then that checkpoint's built-in class with its weights and mask token, and its own tokenizer is
    returned (the target's ids, checked by :func:`check_speaks_target`, plus its mask and the separator of
    :func:`give_separator`, from ``sep_token``). Such a drafter carries ``released_family`` (the family's name).

    Args:
        target: the AR target (only its vocabulary size is read).
        target_tok: the target's tokenizer; a fresh drafter reuses it.
        preset: model preset of a fresh drafter (see :mod:`workbench.model.presets`).
        drafter_init: optional checkpoint directory (or ``builtin:<name>``, or a released dLLM's folder) to start
            from instead.
        seed: initialisation seed of a fresh drafter.
        init_layers: keep the first ``init_layers`` decoder layers of ``drafter_init`` (:func:`keep_first_layers`).
        sep_token: the separator of a released dLLM whose tokenizer (and the target's) has none.

    Returns ``(drafter, tokenizer)``.

    Raises:
        ValueError: unknown preset, bad ``init_layers``.
        TokenizerMismatchError: ``drafter_init``'s tokenizer differs from the target's.
        CheckpointError: ``drafter_init`` is not a checkpoint directory, or a released dLLM of a family whose forward
            cannot serve DEER's drafter (:class:`~workbench.model.families.spec.FamilyError`).
        TokenizerError: a released dLLM without a usable separator (:func:`give_separator`).
    """
    if drafter_init:
        from ..model.load import load_model

        fam = released_family(drafter_init)
        drafter, tok, meta = load_model(drafter_init, target.device)
        origin = fam.name if fam is not None else meta.get(RELEASED_KEY)
        if origin:
            check_speaks_target(target, target_tok, drafter, tok, str(drafter_init))
            if fam is not None:
                give_separator(tok, drafter, target_tok, sep_token)
                # saved as the built-in class it is (save_pretrained would write the family's weight names back)
                if getattr(drafter.backbone, "_weight_conversions", None) is not None:
                    drafter.backbone._weight_conversions = None
            elif tok.sep_token_id is None:
                raise TokenizerMismatchError(f"the DEER drafter {drafter_init} has no separator token in its tokenizer")
            drafter.released_family = origin
        else:
            check_shared_tokenizer(target_tok, tok)
        if init_layers:
            keep_first_layers(drafter, init_layers)
        return drafter, tok
    if init_layers:
        raise ValueError("init_layers needs drafter_init (the checkpoint whose first layers are kept)")
    if preset not in PRESETS:
        raise ValueError(f"unknown drafter preset {preset!r}; valid: {', '.join(PRESETS)}")
    check_shared_tokenizer(target_tok, target_tok)          # needs [MASK] and [SEP]
    cfg = family_config(target.backbone.config, preset, target.backbone.get_input_embeddings().num_embeddings)
    cfg.pad_token_id, cfg.eos_token_id = target_tok.pad_token_id, target_tok.eos_token_id
    torch.manual_seed(seed)
    backbone = (LlamaForCausalLM(cfg) if cfg.model_type == "llama" else AutoModelForCausalLM.from_config(cfg))
    return TriModeLM(backbone.to(target.device), int(target_tok.mask_token_id)), target_tok


def load_drafter(path: str, target: TriModeLM, target_tok: PreTrainedTokenizerBase) -> TriModeLM:
    """Any DEER drafter for ``target``, in eval mode, with ``sep_token_id`` set: a shared-base drafter
    (:mod:`workbench.deer.shared`; prepares the target in place) or a full tri-mode checkpoint (one trained from a
    released dLLM keeps that dLLM's tokenizer: checked with :func:`check_speaks_target`).

    Raises :class:`TokenizerMismatchError` for another tokenizer or vocabulary size and
    :class:`~workbench.model.io.CheckpointError` for a bad path or a drafter of other base weights."""
    from ..model.io import load_checkpoint
    from .shared import is_shared_drafter, load_drafter_for, load_standalone

    if is_shared_drafter(path) and target.gated:
        # a gated tri-mode target (e.g. smollm2-135m-trimode) is not the drafter's base: load that base apart
        drafter, tok = load_standalone(path, target.device)
        if tok.mask_token_id != target_tok.mask_token_id:
            raise TokenizerMismatchError(f"drafter and target tokenizers differ: mask_token_id is "
                                         f"{target_tok.mask_token_id} in the target and {tok.mask_token_id} in the "
                                         "drafter")
        target_tok.sep_token = tok.sep_token
    elif is_shared_drafter(path):
        drafter = load_drafter_for(path, target, target_tok)
    else:
        drafter, tok, meta = load_checkpoint(path, device=target.device)
        if meta.get(RELEASED_KEY):          # trained from a released dLLM: its tokenizer may add mask and separator
            check_speaks_target(target, target_tok, drafter, tok, str(path))
            if tok.sep_token_id is None:
                raise TokenizerMismatchError(f"the DEER drafter {path} has no separator token in its tokenizer")
        else:
            check_shared_tokenizer(target_tok, tok)
        drafter.sep_token_id = int(tok.sep_token_id)
    check_vocab_sizes(target, drafter)
    return drafter.eval()


def check_vocab_sizes(target: TriModeLM, drafter: TriModeLM) -> None:
    """Raise :class:`TokenizerMismatchError` if the two models' output vocabularies differ in size
    (draft distributions ``q`` and target distributions ``p`` must live on the same ids, Eq. 5)."""
    vt, vd = target.vocab_size, drafter.vocab_size
    if vt != vd:
        raise TokenizerMismatchError(f"drafter vocabulary ({vd} logits) differs from the target's ({vt} logits)")
