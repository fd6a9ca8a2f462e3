"""Options of ``workbench leaderboard`` (every field settable from YAML or the command line)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..decoding.base import DecodeError, check_precision, check_threshold
from ..decoding.sampling import check_sampling
from ..model.loading import ModelLoading
from ..tasks.run import SampledTaskConfig

MODES = ("real", "free")


@dataclass
class LeaderboardConfig(ModelLoading, SampledTaskConfig):
    """One table of every registered decoder against the SOL ceilings, on the same prompts."""

    model: str = "builtin:tiny"
    """The target: a shipped model ('tiny'), a named real model ('smollm2-135m-trimode'; `workbench models list`)
    or a checkpoint directory."""
    corpus: str = "stdlib"
    """Corpus of the held-out prompts ('stdlib', a directory of source files, or a .txt / .jsonl file)."""
    split: str = "test"
    """Corpus split of the prompts."""
    n_prompts: int = 16
    """Prompts (at most one per file, spread over categories)."""
    prompt_len: int = 128
    """Maximum prompt length (tokens; prompts end at a line boundary)."""
    gen_len: int = 64
    """Tokens generated per prompt (a multiple of every block length)."""
    block_lengths: list[int] | None = None
    """Block lengths B of the diffusion decoders; also the draft lengths k of the speculative decoders (NLD
    sweeps self-speculation by its block length) and the segment length of the real-context mode. Default
    [4, 8, 16, 32]; given --sampler (and the sampler decoder runs), the sampler's own block length, and a list
    without it is refused."""
    thresholds: list[float] = field(default_factory=lambda: [0.5, 0.7, 0.9, 0.95])
    """Confidence thresholds τ of the decoders that sweep one (confidence, sampler)."""
    modes: list[str] = field(default_factory=lambda: ["real", "free"])
    """Context modes: 'real' (every segment of B tokens conditioned on the real text) and 'free'."""
    decoders: list[str] = field(default_factory=list)
    """Decoders to run (default: every registered one). The references ar_greedy and serial always run: the
    agreement, lossless and speed-up columns compare with them."""
    real_context_decoders: list[str] | None = None
    """Decoders that also get real-context rows when --modes has 'real' (default: every decoder that runs in
    that mode). The references ar_greedy and serial always do. A real-context row costs as much as a
    free-running one; the demo keeps them for the decoders its real-context targets name (demo.TARGETS)."""
    temperature: float = 1.0
    """Temperature of the sampling decoders (ar_sample)."""
    top_k: int = 0
    """Top-k filter of the sampling decoders: sample among the k most likely tokens (0 = off; I-DLM Table 8
    uses 50)."""
    top_p: float = 1.0
    """Top-p (nucleus) filter of the sampling decoders, in (0, 1] (1 = off; I-DLM Table 8 uses 0.95)."""
    sampler: str | None = None
    """Trained sampler directory (`workbench train sampler`) for the sampler decoder (default: the sampler shipped
    for --model, workbench/assets/<model>-sampler, when there is one: tiny has one)."""
    drafter: str | None = None
    """DEER drafter checkpoint (`workbench train deer`) for the deer decoder (default: the drafter shipped for
    --model, workbench/assets/<model>-deer-drafter, when there is one: tiny has one)."""
    proxy: str | None = None
    """Causal n-gram proxy (`workbench diffuspec proxy`) for DiffuSpec's CPS (default: the proxy shipped for
    --model, workbench/assets/<model>-proxy, when there is one: tiny has one)."""
    adapter: str | None = None
    """LoRA drafter adapter (`workbench train lora`): the self-speculative decoders also run with it."""
    skip_missing: bool = False
    """A decoder named in --decoders whose artefact (sampler, drafter) is not given gets a row whose status says
    why, instead of an error. (With the default, every registered decoder, such decoders always get that row.)"""
    sol: bool = True
    """Compute the two SOL ceilings on the same prompts (free-running)."""
    sol_budget: int = 5000
    """Simulation forwards per block of the SOL search (NLD: 5000)."""
    batch_size: int = 16
    """Prompts decoded together in lockstep."""
    precision: str = "fp32"
    """'fp32', 'bf16' (fp32 weights, bf16 autocast) or 'bf16-true' (the target's weights stored in bf16, the
    same autocast; the fast one on a CPU, where 'bf16' re-casts every weight at every forward). The default is
    fp32, where a lossless claim is checkable: lossless decoders are exact there. In bf16 every decode path
    rounds its own way (a (k + 1)-token verify forward differently from AR's one-token steps, and bf16 AR greedy
    itself leaves fp32 AR greedy), so `lossless` is mostly false and the agreement columns show how much that
    costs; use bf16-true for wall-clock comparisons."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    add_mask_token: bool = False
    """Add a [MASK] token (and resize the embeddings) when the checkpoint's tokenizer has none."""
    out_dir: str = "runs/leaderboard"
    """Result directory: leaderboard.parquet, leaderboard.md, leaderboard.png, config.json (built in
    ``<out_dir>.partial`` and moved into place at the end)."""
    progress_bar: bool = True
    """Show a progress bar."""
    results_table: str | None = None
    """Also append this run's figures to a results table (JSON lines; the repository's is
    benchmarks/results.jsonl, rendered into the README's headline table by scripts/render_results.py)."""
    def __post_init__(self):
        from ..sampler.block import sampler_block_lengths

        self.block_lengths = sampler_block_lengths(self.block_lengths, self._given_sampler(), [4, 8, 16, 32])
        if self.task:                           # a task is decoded free-running (no real continuation to reset to)
            self.modes = ["free"]

    def _given_sampler(self) -> str | None:
        """``--sampler`` when the sampler decoder runs (every registered decoder, or named in ``--decoders``)."""
        return self.sampler if self.sampler and (not self.decoders or "sampler" in self.decoders) else None

    def validate(self) -> None:
        """Raise a one-line ``ValueError`` / ``DecodeError`` for an inconsistent configuration; with ``--task``, also
        for a bad task option, or (:class:`~workbench.tasks.execution.UnsafeCodeError`) a run without
        ``--confirm_run_unsafe_code``."""
        if self.task:
            from ..tasks.run import options_of

            options_of(self).validate("workbench leaderboard")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"--modes must be a non-empty list of {', '.join(MODES)}, got {self.modes}")
        if not self.block_lengths:
            raise ValueError("--block_lengths is empty; give at least one block length, e.g. [4, 8]")
        for b in self.block_lengths:
            if b <= 0 or self.gen_len % b:
                raise DecodeError(f"block length {b} must be positive and divide --gen_len {self.gen_len}")
        from ..sampler.block import check_sampler_block_lengths

        check_sampler_block_lengths(self.block_lengths, self._given_sampler())
        for t in self.thresholds:
            check_threshold(t)
        if self.n_prompts <= 0 or self.prompt_len <= 0 or self.batch_size <= 0:
            raise ValueError("--n_prompts, --prompt_len and --batch_size must be positive")
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_precision(self.precision)
        from ..decoding.registry import get_decoder, load_decoders

        registered = load_decoders()
        for name in [*self.decoders, *(self.real_context_decoders or [])]:
            get_decoder(name)                    # an unknown name: DecodeError listing the valid ones
        sweeping = [n for n in (self.decoders or registered) if get_decoder(n).sweep == "block_length+threshold"]
        if not self.thresholds and sweeping:     # they would have no row at all, and no "not run" line either
            raise ValueError(f"--thresholds is empty, which would drop the decoders that sweep a threshold "
                             f"({', '.join(sweeping)}); give at least one, e.g. [0.9], or leave them out with "
                             "--decoders")
        if self.sol_budget < 1:
            raise ValueError(f"--sol_budget must be ≥ 1, got {self.sol_budget}")
