"""What a family of released diffusion LMs is: a ``model_type`` → built-in transformers backbone, weight-name map and
decoding semantics (facts per family in ``docs/models.md``, "Released diffusion LMs"). The registry of
families is :mod:`workbench.model.families.registry`; the built-in entries are :mod:`.builtin`.

A family's semantics live in its :class:`FamilySpec` and its adapter class alone
(:mod:`workbench.model.families.adapters`); decoders, the collector, the SOL search and the trainers call the
adapter's methods (``new_cache``, ``extend``, ``diffusion_logits``, ``mask_token_id``, ``modes``) and never test
which family they hold.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import CheckpointError

#: Attention of the queries of one forward, by phase (see :class:`FamilySpec`):
#: ``window``: the block sees the cached prefix and itself (NLD's denoising forward);
#: ``causal``: each position sees the positions up to itself (an AR commit; I-DLM everywhere);
#: ``block_causal``: a position sees every position whose absolute block (``position // block_size``) is not
#: after its own (SDAR, Fast-dLLM v2: prompt, denoising and commit alike);
#: ``full``: every position sees the whole sequence, future masks included (LLaDA, Dream).
ATTENTIONS = ("window", "causal", "block_causal", "full")
#: Decoding modes a family may have: ``diffusion`` (denoise masked blocks) and ``ar`` (next-token logits from a
#: causal forward: AR decoding, self-speculation, ISD).
MODES = ("diffusion", "ar")


class FamilyError(CheckpointError):
    """A checkpoint folder of a released diffusion LM that cannot be opened (unknown ``model_type``, weights that
    do not fit the family's layout, a mask id outside the vocabulary, a mode the family does not have)."""


@dataclass(frozen=True)
class FamilySpec:
    """One registered family of released diffusion LMs.

    Attributes:
        name: registry name (``workbench models list``, ``--model <name>:<folder>`` to force a family).
        model_types: the ``model_type`` values of the family's ``config.json`` (aliases included).
        backbone: ``model_type`` of the built-in transformers class that computes it (``llama``, ``qwen2``,
            ``qwen3``, ``ministral3``; ``None`` for a family with its own native class).
        key_renames: ``(pattern, replacement)`` regular expressions applied in order to the checkpoint's weight
            names to give the built-in class's names (transformers' ``key_mapping``); empty when they agree.
        inverse_renames: the renames back, from the built-in names to the family's (writing fixtures).
        loader: ``loader(path, raw config, device, dtype, attn_implementation) -> backbone`` for a family with its
            own native class (``backbone`` None); default: the built-in class of ``backbone`` with
            :attr:`key_renames`.
        config_map: ``config_map(raw config dict) -> dict`` of the built-in config's fields (default: the raw
            fields, without the family's own).
        inverse_config: ``inverse_config(built-in config dict) -> dict`` of the family's own field names, for
            writing a checkpoint in the family's layout (tests, fixtures); default: the built-in fields.
        mask_field: ``config.json`` field holding the mask token id (``None``: no mask token).
        mask_token: text of the mask token in the family's tokenizer, used when the config has no mask field.
        block_field: ``config.json`` field holding the trained block size (``None``: any block length).
        default_block: block size when the config does not give one (the reference decoder's default).
        diffusion_attention: attention of a denoising forward (one of :data:`ATTENTIONS`).
        commit_attention: attention of a forward that commits tokens to the KV cache (``None``: the family has
            no exact cache; every forward recomputes the whole sequence).
        shift: logits are shifted (position ``i`` predicts token ``i + 1``; block position 0 is predicted by the
            last context position's logit): Dream, Fast-dLLM v2, I-DLM.
        aligned: blocks sit at absolute positions (``position // block_size``): the prompt's tail is clean
            tokens inside the first decoded block (SDAR, Fast-dLLM v2).
        modes: decoding modes (subset of :data:`MODES`).
        adapter: ``adapter(backbone, spec, mask_token_id, block_size) -> model``: the adapter class.
        format_of: the family whose on-disk format this family ships in (I-DLM: ``"sdar"``), so that a folder of
            that format may be either; ``<family>:<folder>`` forces one, and a family chosen without it is named
            in one line (:func:`~workbench.model.families.registry.choose_family`).
        matches: ``matches(raw config dict) -> str | None`` for a family with a :attr:`format_of`: the evidence
            (a phrase) that a folder of the shared format is this family, or ``None``.
        reference: where the semantics were read (repository and file).
        description: one line for ``workbench models list``.
    """

    name: str
    model_types: tuple[str, ...]
    backbone: str | None
    adapter: Callable
    key_renames: tuple[tuple[str, str], ...] = ()
    inverse_renames: tuple[tuple[str, str], ...] = ()
    loader: Callable | None = None
    config_map: Callable[[dict], dict] | None = None
    inverse_config: Callable[[dict], dict] | None = None
    mask_field: str | None = "mask_token_id"
    mask_token: str | None = None
    block_field: str | None = "block_size"
    default_block: int | None = None
    diffusion_attention: str = "window"
    commit_attention: str | None = "causal"
    shift: bool = False
    aligned: bool = False
    modes: frozenset = field(default_factory=lambda: frozenset({"diffusion"}))
    format_of: str | None = None
    matches: Callable[[dict], str | None] | None = None
    reference: str = ""
    description: str = ""

    def __post_init__(self):
        for a in (self.diffusion_attention, self.commit_attention):
            if a is not None and a not in ATTENTIONS:
                raise ValueError(f"family {self.name}: unknown attention {a!r}; valid: {', '.join(ATTENTIONS)}")
        if not set(self.modes) <= set(MODES):
            raise ValueError(f"family {self.name}: unknown modes {sorted(set(self.modes) - set(MODES))}")

    @property
    def exact_cache(self) -> bool:
        """True when a KV cache reproduces the family's forward exactly (False: the whole sequence is recomputed
        every forward, as the reference does)."""
        return self.commit_attention is not None

    def semantics(self) -> dict:
        """The family's semantics as a JSON-able dict (recorded in trajectory stores and ``models inspect``)."""
        return {"family": self.name, "diffusion_attention": self.diffusion_attention,
                "commit_attention": self.commit_attention, "shift": self.shift, "aligned": self.aligned,
                "exact_cache": self.exact_cache, "modes": sorted(self.modes)}


def rename_key(key: str, renames: tuple[tuple[str, str], ...]) -> str:
    """Apply ``renames`` (``(pattern, replacement)`` regular expressions) to ``key`` in order, each once, as
    transformers' ``key_mapping`` does when loading."""
    import re

    for pattern, repl in renames:
        key = re.sub(pattern, repl, key, count=1)
    return key


__all__ = ["rename_key", "ATTENTIONS", "MODES", "FamilySpec", "FamilyError"]
