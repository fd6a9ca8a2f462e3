"""DiffuSpec (arXiv:2510.02358): a diffusion language model drafts for an AR target; causal-consistency path
search (CPS, §4.2) picks a left-to-right path through the draft's token lattice with a causal n-gram proxy,
and an adaptive draft-length controller (ADL, §4.3) sizes the next draft. Verification is the target's own
(lossless at temperature 0, Proposition 4.1).

Modules: :mod:`.ngram` (the Kneser–Ney proxy, kenlm queries), :mod:`.cps`, :mod:`.adl`, :mod:`.decode`
(Algorithm 1), :mod:`.decoders` (registry entries), :mod:`.evaluate` (the ablation table of Table 2),
:mod:`.tune` (the Optuna sweep of ADL), :mod:`.cli`.
"""
