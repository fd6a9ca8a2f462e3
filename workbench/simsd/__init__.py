"""SimSD (arXiv:2606.02544): speculative decoding between two diffusion models. A small diffusion drafter drafts a
block in its own order; the diffusion target verifies every drafted token in one forward through token-level
temporal causal attention (§3.1) and accepts along the draft order with min(1, p/q) (Eq. 2).

Modules: :mod:`.layout` (the temporal mask of Eq. 1 and RoPE-copied positions), :mod:`.decode` (§3.2),
:mod:`.decoders` (registry entry), :mod:`.precision` (§4.3's approximation, measured).
"""
