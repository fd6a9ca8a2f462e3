"""Per-token gated LoRA (I-DLM App. G, Table 6; NLD-style tri-mode conversion of a pretrained AR model).

Every adapted linear layer computes, for token position ``j``,

    h_j = W x_j + g_j · (α / r) · B A x_j,        g_j ∈ {0, 1}

with ``g_j = 1`` at noisy-stream positions (the diffusion or proposal pathway) and ``g_j = 0`` at clean
positions. I-DLM Table 6 gates on [MASK] positions (``1[j ∈ M]``); here the whole noisy stream is gated, so the
unmasked tokens of a partly masked NLD block also take the residual, in training and at inference alike (for
I-DLM's all-mask stream the two rules are the same). Clean positions therefore run the frozen base model
exactly: AR mode, the prefix KV cache, the self-speculation verifier and the I-DLM causal anchor ``p`` are the
base model's own, and linear self-speculation (draft with the adapter, verify without) or R-ISD is lossless with
respect to the base by construction.

Mechanism: a peft ``LoraConfig`` on every attention and MLP linear layer (``q, k, v, o, gate, up, down`` for
Llama-style families), plus the new mask token's embedding row as peft *trainable tokens* (the only base row
that changes; with tied embeddings peft updates the tied output row too). For training, the gate is a forward
hook on each ``lora_B`` module that multiplies its output ``(N, Q, out)`` by ``g`` ``(N, Q, 1)``; with ``g`` all
ones or all zeros the hook is bypassed (the adapter is simply on, or disabled through peft's per-layer flag). For
inference, peft's layers are replaced by :class:`~workbench.model.lora_linear.GatedLoRALinear`, which computes the
same thing without peft's per-call Python and reads the gate itself. The saved
adapter is an ordinary peft directory: ``PeftModel.from_pretrained(base_with_mask_row, adapter_dir)`` reloads
the weights; the gating itself is this module's.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

#: Attention and MLP linear layers of the Llama-style families (Llama, Qwen, Mistral, Gemma, SmolLM).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Attribute set on the backbone (a ``PeftModel``) that carries the gate.
_GATE_ATTR = "_workbench_lora_gate"
#: Attribute set on a peft backbone by :func:`adapters_disabled`: its tuner layers, found once.
_LAYERS_ATTR = "_workbench_tuner_layers"


@dataclass
class LoRAGate:
    """The current per-token gate ``(N, Q, 1)`` (``None``: no scaling) shared by every ``lora_B`` hook (training
    form) or every :class:`~workbench.model.lora_linear.GatedLoRALinear` (inference form), and whether the adapter
    is ``off`` (:func:`adapters_disabled`; the training form reads peft's per-layer flag instead)."""

    gate: torch.Tensor | None = None
    off: bool = False
    merged: bool = False
    """Inference form only: forwards with the adapter on at every position use ``W + s·BA`` merged into one
    weight per layer (:func:`merged_adapter`)."""
    _cast: tuple | None = field(default=None, repr=False, compare=False)   # (gate, dtype, gate in dtype)

    def hook(self, module: nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
        return output if self.gate is None else output * self.gate.to(output.dtype)

    def cast(self, dtype: torch.dtype) -> torch.Tensor:
        """``gate`` as 0 / 1 in ``dtype`` ``(N, Q, 1)``, converted once per gate and dtype, not once per layer."""
        g = self.gate
        if self._cast is None or self._cast[0] is not g or self._cast[1] != dtype:
            self._cast = (g, dtype, g.to(dtype))                 # holds g, so its identity is not reused
        return self._cast[2]


def lora_size_bytes(backbone: nn.Module, rank: int, targets=DEFAULT_TARGETS, bytes_per_param: int = 2) -> int:
    """Bytes of the LoRA matrices ``A (r × in)`` and ``B (out × r)`` on every ``targets`` linear layer of
    ``backbone`` (bf16 by default), to pick the rank that fits an asset budget. Raises ``ValueError`` if no
    target module exists."""
    total, found = 0, 0
    for name, mod in backbone.named_modules():
        if isinstance(mod, nn.Linear) and name.split(".")[-1] in targets:
            total += rank * (mod.in_features + mod.out_features)
            found += 1
    if not found:
        raise ValueError(f"none of the target modules {list(targets)} exists in the model; pass --lora_targets")
    return total * bytes_per_param


def attach_gated_lora(model, rank: int, alpha: float, targets=DEFAULT_TARGETS, train_mask_row: bool = True):
    """Wrap ``model.backbone`` (a :class:`~workbench.model.trimode.TriModeLM`) in a gated peft LoRA, in place.

    Args:
        model: a TriModeLM whose tokenizer has a mask token (its embedding row exists).
        rank, alpha: LoRA ``r`` and ``α`` (update scaled by ``α / r``; NLD uses r = 128, α = 512).
        targets: linear module names that get adapters (default: every attention and MLP projection).
        train_mask_row: also train the mask token's embedding row (peft ``trainable_token_indices``).

    Returns ``model``; only the LoRA matrices (and the mask row) require grad afterwards.
    Raises ``ValueError`` for ``rank ≤ 0``, a model that already carries an adapter, or absent targets.
    """
    from peft import LoraConfig, get_peft_model

    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    if is_gated(model) or hasattr(model.backbone, "peft_config"):
        raise ValueError("the model already carries a LoRA adapter")
    lora_size_bytes(model.backbone, rank, targets)           # raises for absent targets
    extra = {"trainable_token_indices": {"embed_tokens": [model.mask_token_id]}} if train_mask_row else {}
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets), bias="none", **extra)
    model.backbone = get_peft_model(model.backbone, cfg)
    _install_gate(model.backbone)
    return model


def load_gated_lora(model, adapter_dir, trainable: bool = False):
    """Attach the gated adapter saved in ``adapter_dir`` (peft format) to ``model.backbone`` in place.

    ``trainable=False`` (inference): the mask row is baked into the base weights (:func:`bake_mask_rows`) and every
    peft LoRA layer is replaced by its inference form (:class:`~workbench.model.lora_linear.GatedLoRALinear`: the
    same operations and outputs, same parameter names, without peft's per-call Python). ``trainable=True`` keeps
    peft's layers, with the gate as a forward hook, for training and saving.

    Raises ``FileNotFoundError`` if ``adapter_dir`` holds no ``adapter_config.json``, and
    :class:`~workbench.model.io.CheckpointError` (one line) for an adapter whose config disagrees with its weights or
    whose weights do not fit the model (:func:`~workbench.model.adapter_check.check_adapter`), before anything is loaded.
    """
    from peft import PeftModel

    from .adapter_check import check_adapter

    check_adapter(adapter_dir, model.backbone)
    model.backbone = PeftModel.from_pretrained(model.backbone, adapter_dir, is_trainable=trainable)
    if trainable:
        _install_gate(model.backbone)
        return model
    from .lora_linear import lean_lora_layers

    bake_mask_rows(model.backbone)
    gate = LoRAGate()
    lean_lora_layers(model.backbone, gate)       # peft's computation without its per-call bookkeeping
    setattr(model.backbone, _GATE_ATTR, gate)
    return model


def bake_mask_rows(backbone: nn.Module) -> int:
    """For inference: write each peft *trainable tokens* row (the mask token's embedding, and with tied
    embeddings its output row) into the base weight in place, and put the plain base layer back in place of
    peft's wrapper. Returns the number of wrappers removed.

    Why: with the adapter on, peft's wrapper rebuilds the whole matrix with the row swapped in on every
    forward (``index_copy`` out of place, twice with tied embeddings: 2 × 113 MB for SmolLM2-135M in fp32):
    a 12-token gated forward took 73 ms with it and takes 43 ms baked (bf16-true, 2 cores,
    ``benchmarks/bench_gated_inference.py``). What it keeps: AR mode stays the base model's exactly,
    because the only changed row is the added mask token's, which clean positions never take as input and
    whose AR logit column :meth:`~workbench.model.trimode.TriModeLM.hide_mask_column` hides. The mask row is
    then the trained one with the adapter off too, which no decoder reads. Training keeps peft's wrapper
    (``trainable=True`` loads never bake).
    """
    from peft.tuners.trainable_tokens.layer import TrainableTokensLayer
    from peft.utils.other import TrainableTokensWrapper

    swaps = [(name, mod) for name, mod in backbone.named_modules() if isinstance(mod, TrainableTokensWrapper)]
    for name, wrapper in swaps:
        layer: TrainableTokensLayer = wrapper.token_adapter
        weight = layer.base_layer.weight
        with torch.no_grad():
            for adapter, rows in layer.token_indices.items():
                index = torch.tensor(rows, device=weight.device)
                weight.index_copy_(0, index, layer.trainable_tokens_delta[adapter].to(weight))
        parent_name, _, child = name.rpartition(".")
        setattr(backbone.get_submodule(parent_name), child, layer.base_layer)
    return len(swaps)


def save_gated_adapter(model, out_dir, meta: dict, dtype: torch.dtype = torch.bfloat16):
    """Save the gated adapter of ``model`` as a peft directory with its weights in ``dtype`` (bf16: about
    19.6 MB at r = 32 on SmolLM2-135M) plus ``workbench.json`` = ``meta`` + the mask token id. Written in
    ``<out_dir>.partial`` and renamed, so it is never half-written. Returns the directory."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    from ..utils import staged_dir

    if not is_gated(model):
        raise ValueError("the model carries no gated LoRA to save")
    with staged_dir(out_dir) as tmp:
        # the resized embedding itself stays out: only the mask row (trainable tokens) is the adapter's
        model.backbone.save_pretrained(tmp, save_embedding_layers=False)
        f = tmp / "adapter_model.safetensors"
        save_file({k: v.to(dtype).contiguous() for k, v in load_file(f).items()}, f, metadata={"format": "pt"})
        info = {**meta, "mask_token_id": model.mask_token_id, "adapter_dtype": str(dtype).replace("torch.", "")}
        (tmp / "workbench.json").write_text(json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    return Path(out_dir)


def _install_gate(backbone: nn.Module) -> None:
    gate = LoRAGate()
    for name, mod in backbone.named_modules():
        if name.endswith("lora_B") and isinstance(mod, nn.ModuleDict):
            for sub in mod.values():
                sub.register_forward_hook(gate.hook)
    setattr(backbone, _GATE_ATTR, gate)


def is_gated(model) -> bool:
    """True if ``model`` (TriModeLM) carries a gated LoRA."""
    return hasattr(model.backbone, _GATE_ATTR)


@contextlib.contextmanager
def adapters_disabled(backbone: nn.Module):
    """Run the forwards inside on the base weights of the peft model ``backbone`` (no-op for a plain model).

    The same switch as peft's ``disable_adapter()``: it sets the per-layer flag that peft sets
    (``BaseTunerLayer._disable_adapters``; each layer then runs its base layer alone) and restores it after, on
    the tuner layers found once per backbone. peft's context manager walks every module and computes the
    model's adapter status on each entry, about 16 ms per call on SmolLM2-135M: a third of a bf16 AR step,
    paid at every AR step or verify forward of a converted model.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = getattr(backbone, _LAYERS_ATTR, None)
    if layers is None:
        layers = [m for m in backbone.modules() if isinstance(m, BaseTunerLayer)]
        setattr(backbone, _LAYERS_ATTR, layers)
    gate: LoRAGate | None = getattr(backbone, _GATE_ATTR, None)
    was_off = gate.off if gate is not None else False
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    if gate is not None:
        gate.off = True                          # the inference form's switch
    try:
        yield
    finally:
        for layer, flag in zip(layers, before):
            layer._disable_adapters = flag
        if gate is not None:
            gate.off = was_off


def merged_adapter(model, on: bool = True):
    """Switch ``model`` (a TriModeLM with a gated LoRA loaded for inference) to merged weights for the forwards
    that have the adapter on at every position: diffusion blocks and linear self-speculation drafts in the
    default ``in_block`` layout. Each adapted layer then computes ``(W + (α/r)·B A) x`` in one product instead
    of ``W x + (α/r)·B (A x)``. ``on=False`` switches back and frees the merged weights. Returns ``model``.

    Why: decoding a 135 M model on a CPU is memory-bound, and the gated LoRA path adds 420 small products to
    every forward of SmolLM2-135M. A merged 3-token draft forward took 43 ms against 61 ms gated and 42 ms for
    the base alone, and linear self-speculation ran 1.13–1.17× faster (bf16-true, 2 cores; the lab notebook,
    ``benchmarks/RESULTS.md``, "the merged adapter for linear-SS drafts").

    Cost: one more copy of every adapted weight (about 200 MB in bf16 on SmolLM2-135M), summed in fp32 and
    rounded once to the weight's dtype, built here (so call it after any cast) and rebuilt when a weight changes.
    The values are not bitwise the unmerged ones: in bf16 a draft token can change where its two best logits are
    within rounding. Forwards with a per-token gate (quadratic SS, the ``clean_prefix`` draft layout, ISD) and
    AR mode are unchanged, so every self-speculation decoder stays lossless.

    Raises ``ValueError`` for a model without a gated LoRA in its inference form (``trainable=False`` loads).
    """
    from .lora_linear import GatedLoRALinear

    gate = getattr(model.backbone, _GATE_ATTR, None)
    layers = [m for m in model.backbone.modules() if isinstance(m, GatedLoRALinear)]
    if gate is None or not layers:
        raise ValueError("merging needs a gated LoRA loaded for inference (load_model(..., trainable_adapter=False))")
    for layer in layers:
        if on:
            layer.merged_weight()
        else:
            layer.drop_merged()
    gate.merged = bool(on)
    return model


@contextlib.contextmanager
def lora_positions(model, on):
    """Run the forwards inside with the LoRA residual at the positions marked by ``on``.

    ``on``: ``False`` (base only), ``True`` (adapter everywhere) or a bool tensor ``(N, Q)`` (per token). A
    tensor that is all False or all True takes the corresponding fast path. A model without gated LoRA ignores
    ``on``.

    ``False`` is :func:`adapters_disabled`.
    """
    if not is_gated(model):
        yield
        return
    gate: LoRAGate = getattr(model.backbone, _GATE_ATTR)
    if isinstance(on, torch.Tensor):
        if bool(on.all()):
            on = True
        elif not bool(on.any()):
            on = False
    if on is False:
        with adapters_disabled(model.backbone):
            yield
        return
    prev = gate.gate
    gate.gate = None if on is True else on[..., None]
    try:
        yield
    finally:
        gate.gate = prev


__all__ = ["DEFAULT_TARGETS", "attach_gated_lora", "load_gated_lora", "bake_mask_rows", "save_gated_adapter",
           "adapters_disabled", "lora_positions", "is_gated", "lora_size_bytes", "merged_adapter"]
