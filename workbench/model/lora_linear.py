"""The inference form of a gated LoRA linear layer (I-DLM App. G, Table 6): peft's computation without its
per-call bookkeeping.

For token position ``j`` an adapted linear layer computes

    h_j = W x_j + g_j · (α / r) · B A x_j,        g_j ∈ {0, 1}

(:mod:`workbench.model.gated_lora`). peft's ``lora.Linear.forward`` does this in the same aten operations, but
around them it checks its arguments, walks its active adapters, casts and dispatches a forward hook (the gate)
on ``lora_B``: about 85 µs of Python per layer, 210 layers on SmolLM2-135M, so a gated 12-token forward cost
about 1.4× a base-only one of the same tokens (``benchmarks/bench_gated_inference.py``). :class:`GatedLoRALinear`
runs the same operations in the same order, reading the gate from the shared
:class:`~workbench.model.gated_lora.LoRAGate` itself: its outputs are bitwise those of the peft layer with the
hook, and clean positions (``g_j = 0``) are ``W x_j`` exactly.

It keeps peft's submodule names (``base_layer``, ``lora_A.<adapter>``, ``lora_B.<adapter>``), so the state dict,
the model fingerprint and :func:`~workbench.decoding.base.cast_for_precision` see the same tensors. Inference
only: training and saving keep peft's layers (``load_gated_lora(..., trainable=True)``).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class GatedLoRALinear(nn.Module):
    """``base_layer(x) + g · (B A x) · scaling`` with ``g`` from ``gate`` (a ``LoRAGate``: ``off`` → base only,
    ``gate is None`` → adapter on everywhere, else a ``(N, Q, 1)`` tensor of 0 / 1).

    Args:
        base_layer: the frozen ``nn.Linear`` (``W``, optional bias).
        lora_A, lora_B: ``nn.Linear`` ``in → r`` and ``r → out`` without bias (peft's modules, reused).
        scaling: ``α / r``.
        gate: the gate object shared by every layer of the model.
        adapter: peft adapter name (the submodule key, ``"default"``).

    Input ``x``: ``(N, Q, in)``; output ``(N, Q, out)`` in ``x``'s result dtype, as peft returns it.
    """

    def __init__(self, base_layer: nn.Linear, lora_A: nn.Linear, lora_B: nn.Linear, scaling: float, gate,
                 adapter: str = "default"):
        super().__init__()
        self.base_layer = base_layer
        self.lora_A = nn.ModuleDict({adapter: lora_A})
        self.lora_B = nn.ModuleDict({adapter: lora_B})
        self.scaling = float(scaling)
        self.adapter = adapter
        object.__setattr__(self, "gate", gate)      # shared state, not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = self.base_layer
        result = F.linear(x, base.weight, base.bias)
        gate = self.gate
        if gate.off:
            return result
        dtype = result.dtype
        a = self.lora_A[self.adapter].weight
        delta = F.linear(F.linear(x.to(a.dtype), a), self.lora_B[self.adapter].weight)
        if gate.gate is not None:
            delta = delta * gate.gate.to(delta.dtype)
        return (result + delta * self.scaling).to(dtype)

    def extra_repr(self) -> str:
        w = self.base_layer.weight
        return f"in={w.shape[1]}, out={w.shape[0]}, r={self.lora_A[self.adapter].weight.shape[0]}, scaling={self.scaling}"


def lean_lora_layers(backbone: nn.Module, gate) -> int:
    """Replace every peft ``lora.Linear`` of ``backbone`` (a peft model with one plain LoRA adapter, no dropout,
    no DoRA or other variant) by a :class:`GatedLoRALinear` reading ``gate``, in place. Returns the number
    replaced.

    Raises ``ValueError`` for a layer this form does not cover (several adapters, dropout, a LoRA variant,
    a non-Linear base layer): load such an adapter for training instead (``trainable=True``).
    """
    from peft.tuners.lora.layer import Linear as LoraLinear

    found = [(name, mod) for name, mod in backbone.named_modules() if isinstance(mod, LoraLinear)]
    for name, mod in found:
        adapters = list(mod.lora_A.keys())
        if len(adapters) != 1 or mod.lora_variant or mod.merged or not isinstance(mod.base_layer, nn.Linear):
            raise ValueError(f"{name}: the inference form covers one plain LoRA adapter on an unmerged nn.Linear "
                             f"(adapters {adapters}, variants {list(mod.lora_variant)}); load it with trainable=True")
        (adapter,) = adapters
        if not isinstance(mod.lora_dropout[adapter], nn.Identity):
            raise ValueError(f"{name}: LoRA dropout is on; the inference form has none")
        lean = GatedLoRALinear(mod.base_layer, mod.lora_A[adapter], mod.lora_B[adapter], mod.scaling[adapter], gate,
                               adapter)
        parent, _, child = name.rpartition(".")
        setattr(backbone.get_submodule(parent), child, lean)
    return len(found)


__all__ = ["GatedLoRALinear", "lean_lora_layers"]
