"""The inference form of a gated LoRA linear layer (I-DLM App. G, Table 6): peft's computation without its
per-call bookkeeping.

For token position ``j`` an adapted linear layer computes

    h_j = W x_j + g_j · (α / r) · B A x_j,        g_j ∈ {0, 1}

(:mod:`workbench.model.gated_lora`). peft's ``lora.Linear.forward`` does this in the same aten operations, but
around them it checks its arguments, walks its active adapters, casts and dispatches a forward hook (the gate)
on ``lora_B``: about 85 µs of Python per layer, 210 layers on SmolLM2-135M, so a gated 12-token forward cost
about 1.4× a base-only one of the same tokens (``benchmarks/bench_gated_inference.py``). :class:`GatedLoRALinear`
computes the same values without that Python, reading the gate from the shared
:class:`~workbench.model.gated_lora.LoRAGate` itself, and in an order that keeps every elementwise operation on
the rank-``r`` side:

    u = g · (A x)   (N, Q, r);      h = W x + (s · B) u   (in place)

peft gates and scales the ``(N, Q, out)`` product instead: two elementwise passes over the layer's output. On
one SmolLM2 layer in bf16 at 12 rows the LoRA path costs 1.07× the base products in peft's order and 0.80× in
this one; on a whole gated forward of SmolLM2-135M (``benchmarks/bench_gated_inference.py --pairs order``, 2
cores) that is 1.01–1.09× faster at 12 new tokens and 1.02× at the collector's 64 × 8 rows: the LoRA path's cost
is mostly its 420 small products' per-call cost, which this order does not remove.
The outputs are still bitwise peft's: a gate of 1 leaves ``u``'s row as it is and a gate of 0 makes it zero, so
the row adds an exact zero (clean positions stay ``W x_j`` exactly); the scaling is folded into ``B`` only when it
is a power of two (this project's default α = 4r gives 4), where ``(s B) u = s (B u)`` exactly, and is applied to
``B u`` as peft does otherwise.

It keeps peft's submodule names (``base_layer``, ``lora_A.<adapter>``, ``lora_B.<adapter>``), so the state dict,
the model fingerprint and :func:`~workbench.decoding.base.cast_for_precision` see the same tensors. Inference
only: training and saving keep peft's layers (``load_gated_lora(..., trainable=True)``).
"""
from __future__ import annotations

import math

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
        self.fold_scaling = math.frexp(self.scaling)[0] == 0.5   # a power of two: (s B) u = s (B u) exactly
        self._b_scaled, self._b_key = None, None
        self._merged, self._merged_key = None, None

    def _scaled_b(self) -> torch.Tensor:
        """``s · B`` ``(out, r)``, cached until ``B`` changes (a cast, a device move or an in-place load changes its
        storage, version or dtype)."""
        b = self.lora_B[self.adapter].weight
        key = (b.data_ptr(), b._version, b.dtype, b.device)
        if key != self._b_key:
            with torch.no_grad():
                self._b_scaled = b.detach() * self.scaling
            self._b_key = key
        return self._b_scaled

    def merged_weight(self) -> torch.Tensor:
        """``W + s · B A`` ``(out, in)`` in ``W``'s dtype (summed in fp32, rounded once), cached until ``W``, ``A``
        or ``B`` changes. Used for forwards with the adapter on at every position when the gate's ``merged``
        flag is set (:func:`~workbench.model.gated_lora.merged_adapter`)."""
        w, a, b = self.base_layer.weight, self.lora_A[self.adapter].weight, self.lora_B[self.adapter].weight
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in (w, a, b))
        if key != self._merged_key:
            # fp32 even inside a decoder's bf16 autocast region, which would round B A to bf16 before the sum
            with torch.no_grad(), torch.autocast(w.device.type, enabled=False):
                delta = (b.detach().float() @ a.detach().float()) * self.scaling
                self._merged = (w.detach().float() + delta).to(w.dtype)
            self._merged_key = key
        return self._merged

    def drop_merged(self) -> None:
        """Free the cached merged weight."""
        self._merged, self._merged_key = None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = self.base_layer
        gate = self.gate
        if gate.merged and not gate.off and gate.gate is None:      # adapter on everywhere: one product
            return F.linear(x, self.merged_weight(), base.bias)
        result = F.linear(x, base.weight, base.bias)                  # (N, Q, out)
        if gate.off:
            return result
        a = self.lora_A[self.adapter].weight
        u = F.linear(x.to(a.dtype), a)                                # (N, Q, r)
        if gate.gate is not None:
            u = u * gate.cast(u.dtype)                                # clean rows: exact zeros
        if self.fold_scaling:
            return result.add_(F.linear(u, self._scaled_b()))                     # (N, Q, out)
        return result.add_(F.linear(u, self.lora_B[self.adapter].weight).mul_(self.scaling))

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
