"""A diffusion drafter with its own KV cache of the verified prefix (DiffuSpec's and SimSD's drafters): a
tri-mode model in diffusion mode or a DEER drafter (arXiv:2512.15176 §3.2), proposing a block of masks."""
from __future__ import annotations

import math

import torch

from ..decoding.sampling import NO_TOP_K, NO_TOP_P, sampling_probs


class BlockDrafter:
    """A diffusion drafter with its own KV cache of the verified prefix, for one sequence.

    ``kind='trimode'``: a :class:`~workbench.model.trimode.TriModeLM` in diffusion mode (e.g. the converted
    SmolLM2): the verified tokens are appended with :meth:`~TriModeLM.extend` (one causal forward), then the
    block of masks is read with :meth:`~TriModeLM.diffusion_logits`. ``kind='deer'``: a DEER drafter, whose one
    forward appends the verified tokens causally and reads ``[SEP, masks]`` bidirectionally
    (:func:`~workbench.deer.attention.draft_block_logits`).

    ``cache``: share this KV cache (the verifier's) instead of keeping one, when the drafter is the verifier's
    own diffusion mode (a self-drafter: the clean prefix's keys and values are the same in both modes). The
    verified tokens the cache lacks and the block are then one forward
    (:meth:`~workbench.model.trimode.TriModeLM.extend_and_diffuse`), whose AR logits at the last verified
    token (:attr:`last_ar_logits`, ``(V,)``) score the draft's first token, so the verifier's forward holds only
    the draft: two forwards per step instead of three.
    """

    def __init__(self, model, kind: str = "trimode", sep_id: int | None = None, cache=None):
        if kind not in ("trimode", "deer"):
            raise ValueError(f"unknown drafter kind {kind!r}; valid: trimode, deer")
        if kind == "deer" and sep_id is None:
            raise ValueError("a DEER drafter needs its separator id")
        if cache is not None and kind != "trimode":
            raise ValueError("only a tri-mode self-drafter shares the verifier's cache")
        self.model, self.kind, self.sep_id = model, kind, sep_id
        self.shared = cache is not None
        self.cache = cache if self.shared else model.new_cache()
        self.n_cached = self.cache.get_seq_length() if self.shared else 0
        self.last_ar_logits: torch.Tensor | None = None
        self.calls = 0
        self.last_order = torch.zeros(0, dtype=torch.long)
        self.last_tokens = torch.zeros(0, dtype=torch.long)

    @torch.no_grad()
    def propose(self, verified: list[int], k: int, steps: int = 1, temperature: float = 0.0,
                generator: torch.Generator | None = None, top_k: int = NO_TOP_K,
                top_p: float = NO_TOP_P) -> torch.Tensor:
        """Log-probabilities ``(k, vocab)`` (float32) of a block of ``k`` masks after ``verified`` (token ids).

        With ``steps`` > 1 each pass fixes the ⌈k / steps⌉ most confident undecided positions (DiffuSpec Eq. 4)
        and the next pass reads them as tokens; a position keeps the distribution of the pass that fixed it.
        :attr:`last_order` ``(k,)`` holds the pass (1-based) that fixed each position (SimSD's temporal labels)
        and :attr:`last_tokens` ``(k,)`` the token fixed there: its row's argmax at temperature 0, else a draw
        from ``softmax(logits / temperature)`` filtered by ``top_k`` / ``top_p``
        (:func:`~workbench.decoding.sampling.sampling_probs`; later passes read the drawn tokens)."""
        dev = self.model.device
        if self.shared:                             # the verifier may have appended and cropped since
            self.n_cached = self.cache.get_seq_length()
        pending = torch.tensor([verified[self.n_cached:]], dtype=torch.long, device=dev)
        mask_id = self.model.mask_token_id
        block = torch.full((1, k), mask_id, dtype=torch.long, device=dev)
        out = torch.empty((k, 0))
        order = torch.zeros(k, dtype=torch.long, device=dev)
        undecided = torch.ones(k, dtype=torch.bool, device=dev)
        per_step = math.ceil(k / steps)
        for s in range(steps):
            logits = self._forward(pending if s == 0 else pending[:, :0], block)[0].float()
            logits[:, mask_id] = float("-inf")
            lp = torch.log_softmax(logits, -1)
            if s == 0:
                out = lp.clone()
                self.n_cached = len(verified)
            conf, arg = lp.max(-1)
            conf = torch.where(undecided, conf, torch.full_like(conf, -float("inf")))
            fix = conf.topk(min(per_step, int(undecided.sum()))).indices
            out[fix] = lp[fix]
            if temperature > 0:
                arg = arg.clone()
                arg[fix] = torch.multinomial(sampling_probs(logits[fix], temperature, top_k, top_p), 1,
                                             generator=generator)[:, 0]
            block[0, fix] = arg[fix]
            order[fix] = s + 1
            undecided[fix] = False
            if not undecided.any():
                break
        self.last_order = order
        self.last_tokens = block[0].clone()
        return out

    def _forward(self, pending: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        dev = block.device
        w, k = pending.shape[1], block.shape[1]
        if self.kind == "deer":
            from .attention import draft_block_logits

            sep = torch.full((1, 1), self.sep_id, dtype=torch.long, device=dev)
            valid = torch.ones((1, self.n_cached + w + k + 1), dtype=torch.bool, device=dev)
            self.calls += 1
            return draft_block_logits(self.model, pending, torch.cat([sep, block], 1), valid, self.cache)[:, 1:]
        if w and self.shared:
            self.calls += 1
            valid = torch.ones((1, self.n_cached + w + k), dtype=torch.bool, device=dev)
            ar, diff = self.model.extend_and_diffuse(pending, block, self.cache, valid)
            self.last_ar_logits = ar[0, -1]
            return diff
        if w:
            self.model.extend(pending, self.cache, torch.ones((1, self.n_cached + w), dtype=torch.bool, device=dev),
                              logits_to_keep=1)
            self.calls += 1
        total = self.n_cached + w
        self.calls += 1
        return self.model.diffusion_logits(block, self.cache, torch.ones((1, total + k), dtype=torch.bool, device=dev))
