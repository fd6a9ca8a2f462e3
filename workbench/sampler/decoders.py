"""Registers the learned-sampler decoder (NLD §3.2, App. A) in :mod:`workbench.decoding.registry`."""
from ..decoding.registry import DecoderSpec, register_decoder


def _sampler(model, prompts, gen_len, block_length: int, threshold: float = 0.5, sampler=None, **kw):
    from .policy import sampler_decode

    return sampler_decode(model, prompts, gen_len, block_length, threshold=threshold, sampler=sampler, **kw)


def _load(path, model, tokenizer):
    from .policy import LoadedSampler

    return LoadedSampler.load(path, model.device)


register_decoder(DecoderSpec("sampler", _sampler, load=_load, sweep="block_length+threshold", block_commits=True,
                             ceiling="serial", needs="sampler",
                             options=("block_length", "threshold", "sampler", "fallback", "real_continuation",
                                      "use_cache", "pad_id", "precision", "on_step", "commit_last_block"),
                             reference="Nemotron-Labs-Diffusion (arXiv:2607.05722) §3.2, App. A: the learned sampler",
                             needs_hint="workbench train sampler --store <trajectory store>",
                             description="block diffusion, commit where the 4-layer sampler's probability ≥ τ"))
