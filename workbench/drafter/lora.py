"""LoRA adapters (peft) on the diffusion draft pathway of a :class:`~workbench.model.trimode.TriModeLM`
(NLD §3.3): LoRA on the attention output projection ``o_proj`` only; the AR verifier is the same backbone
with the adapter disabled (:func:`~workbench.speculative.adapter.verifier_mode`).

Adapters are ordinary peft ``save_pretrained`` directories, loadable with
``PeftModel.from_pretrained(base_backbone, adapter_dir)``.
"""
from __future__ import annotations

import json
from pathlib import Path

from peft import LoraConfig, get_peft_model

from ..speculative.adapter import has_adapter, load_adapter  # noqa: F401  (re-exported for the drafter API)
from ..utils import staged_dir

#: Written next to the peft files: how the adapter was trained (base model, loss, metrics).
DRAFTER_JSON = "drafter.json"


#: The attention output projection in each model family, as a peft ``target_modules`` suffix: Llama, Qwen,
#: Mistral, Gemma, Phi-3, OLMo (``self_attn.o_proj``), GPT-2 (``attn.c_proj``, a Conv1D), GPT-NeoX (``attention.dense``),
#: Falcon / BLOOM (``self_attention.dense``), OPT / GPT-J (``attn.out_proj``).
ATTENTION_OUTPUT = ("self_attn.o_proj", "attn.c_proj", "attention.dense", "self_attention.dense", "attn.out_proj")


def _projections(backbone) -> list[str]:
    """Names of the backbone's linear (and GPT-2 Conv1D) modules."""
    import torch.nn as nn

    return [n for n, m in backbone.named_modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"]


def resolve_target_modules(backbone, names: list[str]) -> list[str]:
    """``names`` (peft suffixes) checked against ``backbone``; ``o_proj`` (NLD's choice, the default) becomes the
    family's attention output projection (:data:`ATTENTION_OUTPUT`) when the backbone has no ``o_proj``.

    Raises ``ValueError`` (one line naming ``--target_modules`` and candidate names) for a name that matches no
    linear module."""
    mods = _projections(backbone)
    out = []
    for name in names:
        if any(m == name or m.endswith("." + name) for m in mods):
            out.append(name)
            continue
        if name == "o_proj":
            found = [a for a in ATTENTION_OUTPUT if any(m.endswith("." + a) for m in mods)]
            if found:
                out.append(found[0])
                continue
        cands = sorted({".".join(m.split(".")[-2:]) for m in mods})
        raise ValueError(f"no linear module of this model matches target module {name!r}; pass --target_modules "
                         f"with names from: {', '.join(cands[:16])}")
    return out


def add_lora(model, rank: int, alpha: float, dropout: float = 0.0, target_modules=("o_proj",)):
    """Wrap ``model.backbone`` in a peft LoRA model in place and return ``model``.

    Args:
        model: a TriModeLM without adapter.
        rank: LoRA rank ``r`` (paper: 128; tiny preset: 16).
        alpha: LoRA ``α`` (paper: 512); the update is scaled by ``α / r``.
        dropout: LoRA dropout.
        target_modules: module names that get adapters (paper: ``o_proj`` only).

    Only the LoRA matrices require grad afterwards. Raises ``ValueError`` for ``rank ≤ 0``, an existing
    adapter, or target modules absent from the backbone.
    """
    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    if has_adapter(model):
        raise ValueError("the model already carries a LoRA adapter")
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                     bias="none")
    model.backbone = get_peft_model(model.backbone, cfg)
    return model


def save_adapter(model, out_dir: str | Path, info: dict | None = None) -> Path:
    """Save the adapter of ``model.backbone`` with ``save_pretrained`` (plus ``drafter.json`` = ``info``)
    into ``out_dir``, written as ``<out_dir>.partial`` then renamed (never half-written). The embeddings are not
    saved: the LoRA drafter does not train them, and a mask token added with ``--add_mask_token`` gets the same
    deterministic row (the mean embedding) at every load, so peft's default of saving a resized embedding would
    only copy the vocabulary into the adapter."""
    if not has_adapter(model):
        raise ValueError("the model carries no LoRA adapter to save")
    with staged_dir(out_dir) as tmp:
        model.backbone.save_pretrained(tmp, save_embedding_layers=False)
        (tmp / DRAFTER_JSON).write_text(json.dumps(info or {}, indent=2, sort_keys=True, default=str) + "\n")
    return Path(out_dir)


def lora_parameter_names(model) -> list[str]:
    """Names (in ``model.named_parameters()``) of the LoRA matrices."""
    return [n for n, _ in model.named_parameters() if "lora_" in n]
