"""The confidence sampler (NLD App. A): network, loss, streaming store data, Lightning module and runner.

``SamplerNet`` maps per-position features (N, B, 144) of a block state to commit logits (N, B);
``train_sampler`` trains it on a trajectory store with BCE on masked positions and early stopping on
held-out AUC, and ``save_sampler`` / ``load_sampler`` store it with the store's feature spec and model
fingerprint. Lightning-dependent parts (``data``, ``module``, ``train``) are imported lazily.
"""
from .loss import masked_bce
from .network import (KINDS, SAMPLER_PRESETS, SamplerConfig, SamplerError, SamplerNet, count_parameters,
                      load_sampler, sampler_preset, save_sampler)

__all__ = ["masked_bce", "KINDS", "SAMPLER_PRESETS", "SamplerConfig", "SamplerError", "SamplerNet",
           "count_parameters", "load_sampler", "sampler_preset", "save_sampler"]
