"""DEER (arXiv:2512.15176): a separate diffusion drafter aligned to an AR target in two stages (Stage I AR-style
distillation, Stage II Scribe refinement, §3.1) and block-wise speculative decoding with it (§3.2, Alg. 1).

Modules: :mod:`.models` (target / drafter, shared tokenizer check), :mod:`.teacher` (teacher answers as
Parquet), :mod:`.masking` and :mod:`.losses` (Eq. 1–4 as pure functions), :mod:`.attention` (the
drafter's block forward), :mod:`.module` / :mod:`.train` (Lightning), :mod:`.decode` (Alg. 1),
:mod:`.evaluate` (τ, acceptance distribution, speedup, Stage I vs II, α sensitivity, vs linear SS).
"""
from .decode import DeerResult, deer_decode
from .losses import deer_loss
from .masking import stage1_spans, stage1_weights, stage2_spans, stage2_weights
from .models import TokenizerMismatchError, build_drafter, check_shared_tokenizer, load_target

__all__ = ["DeerResult", "deer_decode", "deer_loss", "stage1_spans", "stage1_weights", "stage2_spans",
           "stage2_weights", "TokenizerMismatchError", "build_drafter", "check_shared_tokenizer", "load_target"]
