"""``workbench models inspect <folder>``: what the workbench sees in a checkpoint folder, without loading it."""
from __future__ import annotations

from pathlib import Path

from .registry import FAMILIES


def family_lines() -> list[str]:
    """One line per registered family for ``workbench models list``."""
    return [f"{s.name:24s} family      {s.description} [model_type: "
            f"{', '.join(s.model_types) or f'{s.format_of} (its format, shared)'}]" for s in FAMILIES.values()]


def describe(path: str | Path, family: str | None = None) -> list[str]:
    """Lines describing the checkpoint folder ``path`` (or ``<family>:<folder>``): family and why, parameters (from
    the weight headers), mask id, block size, modes, semantics, the attention implementation a command would load
    it with and the training-only fields of its config.json that inference ignores. A family guessed for a format
    two families share is named in one line on stderr (:func:`~.registry.announce`), or refused under
    ``--strict_family`` (:func:`~.registry.refuse_guess`).

    Raises :class:`~workbench.model.families.spec.FamilyError` (one line) for a folder that is not a checkpoint, an
    unknown family, a family's layout its weights do not fit, a guessed family under ``--strict_family``, or a bad
    attention implementation."""
    from .prefix import family_prefix
    from ..loading import attn_implementation
    from .builtin import TRAINING_ONLY
    from .load import backbone_config, block_size_of, check_layout, checkpoint_shapes, load_tokenizer, \
        mask_token_of, read_config
    from .registry import announce, choose_family, refuse_guess

    prefixed, folder = family_prefix(str(path))
    family = family or prefixed
    p = Path(folder)
    raw = read_config(p)
    choice = choose_family(raw, p, name=family)
    if choice is None:
        return [f"folder:      {p}", f"model_type:  {raw.get('model_type')} (an ordinary causal LM: AR mode; "
                "diffusion after `workbench train lm` converts it)"]
    refuse_guess(choice, p)
    spec = choice.spec
    attn = attn_implementation()
    lines = [f"folder:      {p}", f"family:      {spec.name} ({spec.description})",
             f"chosen by:   {choice.reason}" + (f" (a guess: {choice.families()} share this format; "
                                                f"{', '.join(o + ':' for o in choice.others)} forces the other)"
                                                if choice.guessed else ""),
             f"model_type:  {raw.get('model_type')}"]
    tok = load_tokenizer(p)
    if spec.backbone is not None:
        cfg = backbone_config(spec, raw)
        shapes = checkpoint_shapes(p)
        check_layout(spec, cfg, shapes, p)
        lines.append(f"backbone:    {spec.backbone} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                     f"vocab {cfg.vocab_size}); parameters: {_count_parameters(shapes):,}")
        rows = cfg.vocab_size
    else:
        rows = int(raw.get("text_config", {}).get("vocab_size") or raw.get("vocab_size") or len(tok))
    mask = mask_token_of(spec, raw, tok, rows, p)
    block = block_size_of(spec, raw, p)
    ignored = [f"{k} ({raw[k]})" if k.endswith("attn_implementation") else k for k in raw if k in TRAINING_ONLY]
    lines += [f"mask id:     {mask if mask is not None else 'none (open positions hold random tokens)'}",
              f"block size:  {block if block is not None else 'any'}",
              f"modes:       {', '.join(sorted(spec.modes))}",
              f"attention:   denoising {spec.diffusion_attention}; "
              f"commit {spec.commit_attention or 'none (recomputed)'}; implementation {attn}",
              f"logits:      {'shifted (position i predicts i + 1)' if spec.shift else 'unshifted'}; "
              f"blocks {'at absolute positions' if spec.aligned else 'from the prompt end'}; "
              f"KV cache {'exact' if spec.exact_cache else 'none in the reference (full recompute)'}",
              f"ignored:     {', '.join(ignored) if ignored else 'none'} (training-only config fields)",
              f"tokenizer:   {len(tok)} tokens; chat template: {'yes' if tok.chat_template else 'no'}",
              f"reference:   {spec.reference}"]
    announce(choice, p)
    return lines


def _count_parameters(shapes: dict) -> int:
    """Parameters of a folder's safetensors weights, from their header shapes (:func:`~.load.checkpoint_shapes`)."""
    total = 0
    for shape in shapes.values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


__all__ = ["describe", "family_lines"]
