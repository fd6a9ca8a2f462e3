"""``workbench models inspect <folder>``: what the workbench sees in a checkpoint folder, without loading it."""
from __future__ import annotations

from pathlib import Path

from .registry import FAMILIES, family_of_config


def family_lines() -> list[str]:
    """One line per registered family for ``workbench models list``."""
    return [f"{s.name:24s} family      {s.description} [model_type: {', '.join(s.model_types) or 'sdar (matched)'}]"
            for s in FAMILIES.values()]


def describe(path: str | Path, family: str | None = None) -> list[str]:
    """Lines describing the checkpoint folder ``path``: family, parameters (from the weight headers), mask id,
    block size, modes and semantics. Raises :class:`~workbench.model.families.spec.FamilyError` (one line) for a
    folder that is not a checkpoint, or for a family's layout its weights do not fit."""
    from .load import backbone_config, block_size_of, check_layout, checkpoint_keys, load_tokenizer, mask_token_of, \
        read_config

    p = Path(path)
    raw = read_config(p)
    spec = family_of_config(raw, p, name=family)
    if spec is None:
        return [f"folder:      {p}", f"model_type:  {raw.get('model_type')} (an ordinary causal LM: AR mode; "
                "diffusion after `workbench train lm` converts it)"]
    lines = [f"folder:      {p}", f"family:      {spec.name} ({spec.description})",
             f"model_type:  {raw.get('model_type')}"]
    tok = load_tokenizer(p)
    if spec.backbone is not None:
        cfg = backbone_config(spec, raw)
        keys = checkpoint_keys(p)
        check_layout(spec, cfg, keys, p)
        lines.append(f"backbone:    {spec.backbone} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                     f"vocab {cfg.vocab_size}); parameters: {_count_parameters(p):,}")
        rows = cfg.vocab_size
    else:
        rows = int(raw.get("text_config", {}).get("vocab_size") or raw.get("vocab_size") or len(tok))
    mask = mask_token_of(spec, raw, tok, rows, p)
    block = block_size_of(spec, raw, p)
    lines += [f"mask id:     {mask if mask is not None else 'none (open positions hold random tokens)'}",
              f"block size:  {block if block is not None else 'any'}",
              f"modes:       {', '.join(sorted(spec.modes))}",
              f"attention:   denoising {spec.diffusion_attention}; "
              f"commit {spec.commit_attention or 'none (recomputed)'}",
              f"logits:      {'shifted (position i predicts i + 1)' if spec.shift else 'unshifted'}; "
              f"blocks {'at absolute positions' if spec.aligned else 'from the prompt end'}; "
              f"KV cache {'exact' if spec.exact_cache else 'none in the reference (full recompute)'}",
              f"tokenizer:   {len(tok)} tokens; chat template: {'yes' if tok.chat_template else 'no'}",
              f"reference:   {spec.reference}"]
    return lines


def _count_parameters(path: Path) -> int:
    """Parameters of the folder's safetensors weights, from their headers."""
    import json

    from safetensors import safe_open

    files = [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                n = 1
                for d in h.get_slice(k).get_shape():
                    n *= d
                total += n
    return total


__all__ = ["describe", "family_lines"]
