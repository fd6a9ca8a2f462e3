"""A hand-built stand-in for TriModeLM whose diffusion logits we control exactly.

Vocabulary of ``V`` tokens; at a step where ``c`` positions of the block are already committed, the
top-1 token at block position ``j`` is ``(j + c) % V`` with probability ``conf[j]`` (the rest spread
evenly). So serial decoding commits positions in decreasing ``conf`` order and the top-1 of a position
changes with every commit, which makes labels hand-computable.
"""
from types import SimpleNamespace

import torch


class FakeCache:
    def __init__(self):
        self.length = 0

    def crop(self, n):
        self.length = self.length + n if n < 0 else n

    def get_seq_length(self):
        return self.length


class FakeTriMode:
    def __init__(self, conf, vocab=8, mask_token_id=7):
        self.conf = torch.tensor(conf, dtype=torch.float32)
        self.vocab, self.mask_token_id = vocab, mask_token_id
        self.device, self.mask_dtype = torch.device("cpu"), torch.float32
        self.backbone = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=4096, vocab_size=vocab))

    def new_cache(self):
        return FakeCache()

    def extend(self, ids, cache, key_valid, logits_to_keep=0):
        cache.length += ids.shape[1]
        return torch.zeros(ids.shape[0], logits_to_keep or ids.shape[1], self.vocab)

    def probs(self, block):
        n, b = block.shape
        c = (block != self.mask_token_id).sum(dim=1, keepdim=True)            # (N, 1)
        top = (torch.arange(b)[None, :] + c) % (self.vocab - 1)             # never the mask id
        p = ((1 - self.conf[:b]) / (self.vocab - 1))[None, :, None].expand(n, b, self.vocab).clone()
        p.scatter_(2, top[..., None], self.conf[:b][None, :, None].expand(n, b, 1))
        return p

    def diffusion_logits(self, block, cache, key_valid, future_masks=0):
        return torch.log(self.probs(block))
