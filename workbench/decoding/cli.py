"""``workbench decode``: decode one prompt with a named policy and print the continuation + counters."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.loading import ModelLoading


@dataclass
class DecodeConfig(ModelLoading):
    """Decode one prompt."""

    prompt: str = "def fibonacci(n):\n"
    """Prompt text, or @path to read it from a file."""
    model: str = "builtin:tiny"
    """A shipped model ('tiny'), a named real model ('smollm2-135m', 'smollm2-135m-trimode'; `workbench models
    list`) or a checkpoint directory."""
    policy: str = "confidence"
    """Decoding policy name (see workbench.decoding.POLICIES)."""
    gen_len: int = 64
    """Tokens to generate at most (decoding stops at the tokenizer's end-of-sequence token, as generate does)."""
    block_length: int | None = None
    """Block length of diffusion policies (default: the model's trained block size, e.g. 32 for NLD, else 16; the
    sampler policy's: the sampler's own, and another one is refused; a policy that sweeps no length, e.g. sdar or
    dream_*, keeps its own: the family's block, or none)."""
    threshold: float = 0.9
    """Confidence threshold τ in (0, 1]."""
    temperature: float = 1.0
    """Sampling temperature of ar_sample."""
    top_k: int = 0
    """Top-k filter of ar_sample: sample among the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Top-p (nucleus) filter of ar_sample, in (0, 1] (1 = off)."""
    precision: str = "fp32"
    """'fp32', 'bf16' (bf16 autocast on fp32 weights) or 'bf16-true' (weights stored in bf16; faster on CPU)."""
    merge_adapter: bool = False
    """Gated-LoRA models: forwards with the adapter on at every position (diffusion blocks, linear self-speculation
    drafts in the in_block layout) use one merged weight W + (α/r)·BA per layer, about a base forward's cost
    (lossless decoders stay lossless; in bf16 a draft token can differ by rounding). Needs a gated-LoRA model."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    add_mask_token: bool = False
    """Add a [MASK] token (and resize the embeddings) when the checkpoint's tokenizer has none."""
    drafter: str | None = None
    """Drafter of the deer and simsd policies (default: the one shipped for --model)."""
    sampler: str | None = None
    """Trained sampler of the sampler policy (default: the one shipped for --model)."""
    sampler_fallback: str = "confidence"
    """The sampler policy's one position when none reaches τ: 'confidence' (the model's most confident one, serial
    decoding's choice) or 'sampler' (the sampler's top one; the ablation)."""
    proxy: str | None = None
    """n-gram proxy of the diffuspec policies with CPS (default: the one shipped for --model)."""
    decoder_options: dict | None = None
    """Further options of the decoder, as upstream names them, e.g. '{cfg_scale: 1.0, remasking: random,
    temperature: 0.5}' for llada, '{temperature: 0.2, top_p: 0.95, alg_temp: 0.1}' for dream_*, '{steps: 16}'; an
    option the decoder does not have is refused in one line listing the ones it has (`workbench models list` and
    docs/models.md give each decoder's source)."""
    attention: str = "dense"
    """Attention path (``workbench.model.attention``): 'dense' (additive float masks), 'sdpa_bool' or 'flex'
    (FlexAttention block masks; GPU)."""


def _read_prompt(prompt: str) -> str:
    """The prompt text: ``prompt`` itself, or the UTF-8 text of the file ``@path``. Raises ValueError."""
    if not prompt.startswith("@"):
        return prompt
    path = Path(prompt[1:])
    if not path.is_file():
        raise ValueError(f"prompt file {path} does not exist or is not a file; pass --prompt @<text file>")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"prompt file {path} is not UTF-8 text") from None


def _artefact(cfg: DecodeConfig, model, tok):
    """``(option name, loaded artefact)`` for a policy that needs one (the given path or the one shipped for the
    model), or None. Raises ``ValueError`` naming the command that makes a missing one."""
    from ..assets import shipped_artefact
    from .registry import get_decoder

    spec = get_decoder(cfg.policy)
    if spec.needs is None:
        return None
    path = getattr(cfg, spec.needs, None) or shipped_artefact(cfg.model, spec.needs)
    if not path or not Path(path).exists():
        raise ValueError(f"the {cfg.policy} policy needs --{spec.needs} <path> (none given or shipped for "
                         f"{cfg.model}); make one with `{spec.needs_hint}`")
    return spec.needs, spec.load(str(path), model, tok)


def main(argv: list[str]) -> int:
    """``workbench decode``: decode prompts with a registered policy and print or save them; returns the exit code."""
    from ..cli_args import parse_dataclass
    from ..model.load import load_model, resolve_device
    from ..tokenizer import bos_prefix
    from . import get_policy
    from ..model.gated_lora import merged_adapter
    from .base import cast_for_precision, check_precision
    from .sampling import check_filters
    from .registry import get_decoder

    cfg = parse_dataclass("workbench decode", DecodeConfig, argv)
    fn = get_policy(cfg.policy)
    text = _read_prompt(cfg.prompt)
    check_precision(cfg.precision)
    check_filters(cfg.top_k, cfg.top_p)            # the temperature: the sampling policy's own check
    model, tok, _ = load_model(cfg.model, resolve_device(cfg.device), cfg.add_mask_token)
    cast_for_precision(model, cfg.precision)
    if cfg.merge_adapter:
        merged_adapter(model)
    from ..model.attention import set_attention_path

    set_attention_path(model, cfg.attention)
    artefact = _artefact(cfg, model, tok)
    ids = bos_prefix(tok) + tok(text, add_special_tokens=False)["input_ids"]   # the tokenizer's BOS convention
    spec = get_decoder(cfg.policy)
    block = cfg.block_length
    trained = (getattr(artefact[1], "meta", None) or {}).get("block_length") if artefact else None
    if trained is not None and cfg.policy == "sampler":    # a sampler decodes at the block length it was trained at
        if block is not None and block != int(trained):
            raise ValueError(f"--block_length {block} conflicts with the sampler, trained at block length {trained}: "
                             f"leave --block_length out (it defaults to the sampler's {trained}) or pass {trained}")
        block = int(trained)
    if block is None and spec.sweep != "none":        # a decoder without a swept length keeps its own (or none)
        block = getattr(model, "block_size", None) or 16
    kw = dict(block_length=block, precision=cfg.precision, pad_id=tok.pad_token_id or 0, eos_id=tok.eos_token_id)
    if get_decoder(cfg.policy).sweep == "block_length+threshold":      # confidence, sampler
        kw["threshold"] = cfg.threshold
    if cfg.policy == "sampler":
        kw["fallback"] = cfg.sampler_fallback
    if get_decoder(cfg.policy).temperature:                            # ar_sample
        kw.update(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    if artefact is not None:
        kw[artefact[0]] = artefact[1]
    kw.update(cfg.decoder_options or {})
    res = fn(model, [ids], cfg.gen_len, **kw)
    print(text + tok.decode(res.tokens[0]))
    print(f"--- {cfg.policy}: {len(res.tokens[0])} tokens, {res.forwards[0]} forwards (+{res.extra_forwards[0]} KV-commit), "
          f"tpf {res.tpf(0):.2f}, tpf_real {res.tpf_real(0):.2f}, {res.wall_time:.2f} s")
    return 0
