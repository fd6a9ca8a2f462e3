"""Per-forward cost of a converted (gated-LoRA) model's inference paths, each fix against what it replaced.

On ``smollm2-135m-trimode`` (or ``--model``), after a ``--prefix``-token prompt in the KV cache, batch 1:

* ``ar_step``: one AR token (adapter off): the base weights switched on through peft's ``disable_adapter()``,
  which walks the model and computes its adapter status on every call, against
  :func:`~workbench.model.gated_lora.adapters_disabled`, which flips the same per-layer flag on layers found once;
* ``gated_forward``: ``--tokens`` new tokens with the LoRA on the last three quarters (a quadratic
  self-speculation forward at k = 2 is 12 tokens): peft's trainable-tokens wrapper, which rebuilds the whole
  embedding and tied head with the mask row swapped in at every forward, against the row baked into the base
  weight (:func:`~workbench.model.gated_lora.bake_mask_rows`);
* ``gated_forward_lora_layer``: the same forward through peft's ``lora.Linear`` layers with the gate as a forward
  hook (the training form) against their inference form,
  :class:`~workbench.model.lora_linear.GatedLoRALinear` (the same operations without peft's per-call Python);
* ``gated_forward_lora_order``: that inference form with peft's order of operations (``B A x`` gated and scaled on
  the ``(N, Q, out)`` side, as before 2026-11-26) against its order now (gate on ``A x``, scaling folded into
  ``B``, sum in place), at ``--tokens`` new tokens and at the collector's batch (``--batch`` rows × 8 new tokens,
  all gated);
* ``cost``: what the adapter adds: the gated ``--tokens`` forward against the same forward with the adapter off,
  and that base-only forward against one AR token (its cost in AR steps);
* ``precision``: the AR step in 'bf16' (fp32 weights under bf16 autocast, re-cast at every forward) against
  'bf16-true' (weights stored in bf16, :func:`~workbench.decoding.base.cast_for_precision`), and fp32.

The two sides of each pair alternate, ``--repeats`` rounds of ``--n`` forwards each, so that machine load falls
on both alike. One JSON line per pair: median ms per forward of each side and their ratio.
Run e.g. ``python benchmarks/bench_gated_inference.py --threads 2``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from workbench.decoding.base import autocast_for, cast_for_precision
from workbench.model.gated_lora import adapters_disabled, lora_positions
from workbench.model.load import load_model


def _ms_per_forward(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3


def _pair(name: str, a, b, labels: tuple[str, str], n: int, repeats: int) -> dict:
    a(), b()                                                   # warm-up
    ta, tb = [], []
    for _ in range(repeats):
        ta.append(_ms_per_forward(a, n))
        tb.append(_ms_per_forward(b, n))
    ma, mb = statistics.median(ta), statistics.median(tb)
    return {"benchmark": "gated_inference", "pair": name, f"{labels[0]}_ms": round(ma, 2),
            f"{labels[1]}_ms": round(mb, 2), "ratio": round(ma / mb, 3)}


def _forward(model, ids: torch.Tensor, cache, valid: torch.Tensor, on, switch=None):
    """One cached forward of ``ids`` under ``lora_positions(on)`` (or the ``switch`` context), then crop."""
    def run():
        with torch.no_grad(), (switch() if switch is not None else lora_positions(model, on)):
            model._cached_forward(ids, cache, valid, causal=True)
        cache.crop(-ids.shape[1])
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-trimode")
    ap.add_argument("--prefix", type=int, default=256, help="prompt tokens in the KV cache")
    ap.add_argument("--tokens", type=int, default=12, help="new tokens of the gated forward")
    ap.add_argument("--n", type=int, default=20, help="forwards per timing round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="rows of the collector-shaped gated forward")
    ap.add_argument("--pairs", default="precision,peft,order,cost",
                    help="which pairs: precision (AR step), peft (peft's wrapper and layers), order (LoRA path "
                         "order), cost (the adapter's share of a gated forward)")
    args = ap.parse_args()
    pairs = set(args.pairs.split(","))
    valid = {"precision", "peft", "order", "cost"}
    if not pairs <= valid:
        raise SystemExit(f"--pairs: unknown {sorted(pairs - valid)}; valid: {', '.join(sorted(valid))}")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)

    def prefill(model, precision):
        ids = torch.randint(0, 40000, (1, args.prefix), generator=g)
        cache = model.new_cache()
        with torch.no_grad(), autocast_for(model.device, precision):
            model.extend(ids, cache, torch.ones_like(ids, dtype=torch.bool))
        return cache

    rows = []
    one = torch.randint(0, 40000, (1, 1), generator=g)
    kv1 = torch.ones(1, args.prefix + 1, dtype=torch.bool)
    q = args.tokens
    new = torch.randint(0, 40000, (1, q), generator=g)
    kvq = torch.ones(1, args.prefix + q, dtype=torch.bool)
    gate = torch.zeros(1, q, dtype=torch.bool)
    gate[:, q // 4:] = True

    # precision: the AR step in bf16 autocast, bf16-true and fp32 (separate models, same weights)
    by_precision = {}
    for precision in ("fp32", "bf16", "bf16-true") if "precision" in pairs else ():
        model, _, _ = load_model(args.model)
        model.eval()
        cast_for_precision(model, precision)
        cache = prefill(model, precision)
        ctx = autocast_for(model.device, precision)

        def step(model=model, cache=cache, ctx=ctx):
            with ctx:
                _forward(model, one, cache, kv1, False)()
        by_precision[precision] = step
    if by_precision:
        rows.append(_pair("ar_step_precision", by_precision["bf16"], by_precision["bf16-true"],
                          ("bf16_autocast", "bf16_true"), args.n, args.repeats))
        rows.append(_pair("ar_step_precision", by_precision["fp32"], by_precision["bf16-true"],
                          ("fp32", "bf16_true"), args.n, args.repeats))
    del by_precision

    # the inference model, bf16-true
    model, _, _ = load_model(args.model)
    model.eval()
    cast_for_precision(model, "bf16-true")
    cache = prefill(model, "bf16-true")
    if "peft" in pairs:
        rows += _peft_pairs(args, model, cache, one, kv1, new, kvq, gate)
    if "order" in pairs:
        rows += _order_pairs(args, model, cache, prefill, new, kvq, gate, g)
    if "cost" in pairs:
        rows.append(_pair("gated_forward_lora_cost", _forward(model, new, cache, kvq, gate),
                          _forward(model, new, cache, kvq, False), ("gated", "adapter_off"), args.n, args.repeats))
        rows.append(_pair("forward_tokens_vs_ar_step", _forward(model, new, cache, kvq, False),
                          _forward(model, one, cache, kv1, False), (f"tokens_{q}", "ar_step"), args.n, args.repeats))
    for r in rows:
        print(json.dumps(r))


def _peft_pairs(args, model, cache, one, kv1, new, kvq, gate) -> list[dict]:
    """peft's trainable-tokens wrapper against the baked mask row, peft's adapter switch against
    ``adapters_disabled``, peft's LoRA layers against their inference form."""
    rows = []
    # the gated forward: peft's trainable-tokens wrapper against the baked row (both through peft's LoRA layers),
    # then peft's LoRA layers against their inference form (both baked)
    from workbench.model.gated_lora import bake_mask_rows

    wrapped, wcache = _trainable_load(args)
    peft_layers, pcache = _trainable_load(args)
    bake_mask_rows(peft_layers.backbone)
    # the adapter switch, on peft's layers (the inference form has its own, the gate's `off`)
    rows.append(_pair("ar_step_adapter_off",
                      _forward(peft_layers, one, pcache, kv1, None, peft_layers.backbone.disable_adapter),
                      _forward(peft_layers, one, pcache, kv1, None, lambda: adapters_disabled(peft_layers.backbone)),
                      ("peft_disable_adapter", "adapters_disabled"), args.n, args.repeats))
    rows.append(_pair("gated_forward_mask_row", _forward(wrapped, new, wcache, kvq, gate),
                      _forward(peft_layers, new, pcache, kvq, gate), ("peft_wrapper", "baked_row"), args.n,
                      args.repeats))
    del wrapped, wcache
    rows.append(_pair("gated_forward_lora_layer", _forward(peft_layers, new, pcache, kvq, gate),
                      _forward(model, new, cache, kvq, gate), ("peft_lora_linear", "gated_lora_linear"), args.n,
                      args.repeats))
    del peft_layers, pcache
    return rows


def _order_pairs(args, model, cache, prefill, new, kvq, gate, g) -> list[dict]:
    """The order of the LoRA path's operations, same layers: ``--tokens`` new tokens, then the collector's batch."""
    rows = []
    old_order, _, _ = load_model(args.model)
    old_order.eval()
    cast_for_precision(old_order, "bf16-true")
    _use_peft_order(old_order)
    ocache = prefill(old_order, "bf16-true")
    rows.append(_pair("gated_forward_lora_order", _forward(old_order, new, ocache, kvq, gate),
                      _forward(model, new, cache, kvq, gate), ("peft_order", "rank_side_order"), args.n,
                      args.repeats))
    wide = torch.randint(0, 40000, (args.batch, args.prefix), generator=g)
    block = torch.randint(0, 40000, (args.batch, 8), generator=g)
    kvb = torch.ones(args.batch, args.prefix + 8, dtype=torch.bool)
    caches = []
    for m in (old_order, model):
        c = m.new_cache()
        with torch.no_grad():
            m.extend(wide, c, torch.ones_like(wide, dtype=torch.bool))
        caches.append(c)
    rows.append(_pair("gated_forward_lora_order_batch", _forward(old_order, block, caches[0], kvb, True),
                      _forward(model, block, caches[1], kvb, True), ("peft_order", "rank_side_order"),
                      max(1, args.n // 4), args.repeats))
    return rows


def _use_peft_order(model) -> None:
    """Give every GatedLoRALinear of ``model`` the order of operations peft uses (and the inference form used
    before 2026-11-26): ``(W x + s · g · (B (A x)))``, gate and scaling on the ``(N, Q, out)`` product."""
    import types

    import torch.nn.functional as F

    from workbench.model.lora_linear import GatedLoRALinear

    def forward(self, x):
        result = F.linear(x, self.base_layer.weight, self.base_layer.bias)
        if self.gate.off:
            return result
        dtype = result.dtype
        a = self.lora_A[self.adapter].weight
        delta = F.linear(F.linear(x.to(a.dtype), a), self.lora_B[self.adapter].weight)
        if self.gate.gate is not None:
            delta = delta * self.gate.gate.to(delta.dtype)
        return (result + delta * self.scaling).to(dtype)

    for m in model.modules():
        if isinstance(m, GatedLoRALinear):
            m.forward = types.MethodType(forward, m)


def _trainable_load(args):
    """The model loaded for training (peft's layers, gate hook, trainable-tokens wrapper), bf16-true, with a
    ``--prefix`` cache of the same prompt as the inference model's."""
    from workbench.model.load import attach_adapter
    from workbench.model.named import resolve

    path, adapter = resolve(args.model)
    if adapter is None:
        raise SystemExit(f"{args.model} carries no gated adapter")
    base, tok, _ = load_model(str(path))
    wrapped, _ = attach_adapter(base, tok, adapter, trainable=True)
    wrapped.eval()
    cast_for_precision(wrapped, "bf16-true")
    ids = torch.randint(0, 40000, (1, args.prefix), generator=torch.Generator().manual_seed(0))
    wcache = wrapped.new_cache()
    with torch.no_grad():
        wrapped.extend(ids, wcache, torch.ones_like(ids, dtype=torch.bool))
    return wrapped, wcache


if __name__ == "__main__":
    main()
