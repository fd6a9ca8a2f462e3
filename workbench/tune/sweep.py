"""``workbench sweep``: a multi-objective Optuna study over a decoding policy's threshold (and the block
length when asked): maximise TPF and maximise accuracy on fixed held-out prompts. Resumable by study
name; several workers may share one storage; exports the Pareto front (Parquet) and plots it."""
from __future__ import annotations

import json
import time
from functools import partial
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from ..atomic import atomic_path, write_bytes, write_json
from ..tasks.run import (TaskPrompts, completions, decode_task, options_of, pass_at, sample_records, score,
                         setting_label, write_samples)
from .storage import StorageLost, check_existing_study, check_study_identity, make_storage, mark_worker, open_study
from ..tasks.run import TaskConfig
from .team import TEAM_MAY_CHANGE, TeamOptions, label_study, watch_study
from .workers import optimize_until, run_workers, worker_seed
from ..model.loading import ModelLoading

SWEEP_POLICIES = ("confidence", "sampler")
ACCURACY_METRICS = ("agree_serial", "token_acc", "pass@1")


@dataclass
class SweepConfig(TeamOptions, ModelLoading, TaskConfig):
    """Multi-objective threshold sweep (maximise tpf, maximise accuracy). The shared-study options (a lost database
    server, the dashboard) come from :class:`~workbench.tune.team.TeamOptions`."""

    model: str = "builtin:tiny"
    """Checkpoint directory or 'builtin:tiny'."""
    policy: str = "confidence"
    """Decoding policy whose threshold is tuned: confidence or sampler."""
    sampler: str | None = None
    """Trained sampler directory (policy = sampler)."""
    sampler_fallback: str = "confidence"
    """The sampler policy's one position when none reaches τ: 'confidence' (the model's most confident one, serial
    decoding's choice) or 'sampler' (the sampler's top one; the ablation)."""
    study: str = "threshold-sweep"
    """Study name; rerunning with the same name and storage resumes the study."""
    storage: str | None = None
    """None → SQLite file in out_dir; an RDB URL; or a journal file path for many workers."""
    out_dir: str = "runs/sweep"
    """Run directory: optuna.db (default storage), trials.parquet, pareto.parquet, pareto.png."""
    n_trials: int = 20
    """Total completed trials the study should reach (a resumed study runs only the missing ones)."""
    threshold_low: float = 0.3
    """Lower end of the threshold search range."""
    threshold_high: float = 1.0
    """Upper end of the threshold search range."""
    block_lengths: list[int] | None = None
    """Block length(s); with several and tune_block_length, B is a categorical parameter. Default [32]; with
    --policy sampler, the sampler's own block length (another one is refused)."""
    tune_block_length: bool = False
    """Also search over ``block_lengths``."""
    accuracy: str = "agree_serial"
    """Accuracy objective: agree_serial (agreement with the serial target), token_acc (vs the real text) or pass@1
    (the share of a task's problems solved; implies --task humaneval)."""
    objective: str | None = None
    """The accuracy objective under its other name (``--objective pass@1``): sets --accuracy."""
    mode: str = "real"
    """Context mode: real or free."""
    corpus: str = "stdlib"
    """Corpus of the held-out prompts."""
    n_prompts: int = 16
    """Held-out prompts per trial."""
    prompt_len: int = 192
    """Maximum prompt length (tokens)."""
    gen_len: int = 64
    """Generated tokens per prompt (a multiple of every block length)."""
    batch_size: int = 16
    """Prompts decoded together."""
    precision: str = "auto"
    """'auto' (bf16 autocast where the device has native bf16 matmuls, fp32 on a CPU that would emulate them:
    docs/guides/precision.md; the study records the precision it resolved to), 'fp32' or 'bf16' (autocast)."""
    optuna_sampler: str = "tpe"
    """Optuna sampler: tpe (Optuna 5's default) or nsga2."""
    seed: int | None = 0
    """Optuna sampler seed (a resumed study uses seed + its trial count; worker i of ``n_workers`` uses
    seed + 7919·i; machines sharing one storage need their own)."""
    n_workers: int = 1
    """Worker processes on this machine, all on the one study (``workbench.tune.workers``)."""
    heartbeat_interval: int = 30
    """Seconds between heartbeats of a running trial (RDB storage); a trial silent for 3 intervals is failed and
    retried (a killed worker's trial never stays RUNNING)."""
    def __post_init__(self):
        from ..sampler.block import sampler_block_lengths

        self.block_lengths = sampler_block_lengths(self.block_lengths, self.sampler if self.policy == "sampler"
                                                   else None, [32])
        if self.objective is not None:          # --objective is --accuracy under its other name
            self.accuracy, self.objective = self.objective, None
        if self.accuracy == "pass@1" and not self.task:
            self.task = "humaneval"
        if self.task:                           # a task is decoded free-running
            self.mode = "free"

    def validate(self) -> None:
        from ..decoding.base import check_precision

        check_precision(self.precision, allow_auto=True)
        self.validate_team()
        if self.n_workers < 1:
            raise ValueError(f"--n_workers must be ≥ 1, got {self.n_workers}")
        if self.heartbeat_interval <= 0:
            raise ValueError(f"--heartbeat_interval must be positive, got {self.heartbeat_interval}")
        if self.policy not in SWEEP_POLICIES:
            raise ValueError(f"unknown sweep policy {self.policy!r}; valid: {', '.join(SWEEP_POLICIES)}")
        from ..evaluation.harness import MODES

        if self.mode not in MODES:
            raise ValueError(f"unknown context mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.accuracy not in ACCURACY_METRICS:
            raise ValueError(f"unknown accuracy objective {self.accuracy!r}; valid: {', '.join(ACCURACY_METRICS)}")
        if self.task:
            if self.accuracy != "pass@1":
                raise ValueError(f"--task {self.task} is tuned for pass@1, not {self.accuracy} (a task has no real text "
                                 "or serial target to agree with); use --accuracy pass@1")
            from ..tasks.run import options_of

            options_of(self).validate("workbench sweep")
        if not 0 <= self.threshold_low < self.threshold_high:
            raise ValueError("need 0 ≤ threshold_low < threshold_high")
        if self.policy == "confidence" and not (0 < self.threshold_low and self.threshold_high <= 1):
            raise ValueError("confidence thresholds must lie in (0, 1]")
        if self.policy == "sampler" and not self.sampler:
            raise ValueError("--policy sampler needs --sampler <trained sampler directory>")
        from ..sampler.policy import check_fallback

        check_fallback(self.sampler_fallback)        # a DecodeError, which is a ValueError
        if not self.block_lengths:
            raise ValueError("--block_lengths is empty; give at least one block length, e.g. [32]")
        for b in self.block_lengths:
            if b <= 0 or self.gen_len % b:
                raise ValueError(f"block length {b} must be positive and divide gen_len {self.gen_len}")
        if self.policy == "sampler":
            from ..sampler.block import check_sampler_block_lengths

            check_sampler_block_lengths(self.block_lengths, self.sampler, every=True)


class ThresholdObjective:
    """Decodes the fixed prompts at a trial's (B, τ) and returns (tpf, accuracy). Serial targets are
    computed once per block length and cached (they do not depend on the trial)."""

    def __init__(self, cfg: SweepConfig):
        from ..corpus import by_split, load_corpus
        from ..sampler.policy import LoadedSampler
        from ..model.load import load_model, resolve_device
        from ..evaluation.prompts import make_prompts

        self.cfg = cfg
        self.model, self.tok, _ = load_model(cfg.model, resolve_device("auto"))
        self.task = options_of(cfg)
        self.pad = self.tok.pad_token_id or 0
        if self.task:                           # the task's problems; pass@1 by running each trial's answers
            from ..evaluation.task import task_as_prompts

            self.task_prompts = TaskPrompts.build(self.task, self.tok)
            self.prompts = task_as_prompts(self.task_prompts, cfg.gen_len, self.pad)
        else:
            self.prompts = make_prompts(by_split(load_corpus(cfg.corpus), "test"), cfg.n_prompts, cfg.prompt_len,
                                        cfg.gen_len, self.tok)
        self.extra = ({"sampler": LoadedSampler.load(cfg.sampler, self.model.device), "fallback": cfg.sampler_fallback}
                      if cfg.policy == "sampler" else {})
        self._serial: dict[int, list[list[int]]] = {}

    def _decode(self, policy: str, b: int, **kw):
        from ..evaluation.harness import decode_prompts

        return decode_prompts(self.model, policy, self.prompts, self.cfg.mode, self.cfg.batch_size,
                        self.tok.pad_token_id or 0, block_length=b, precision=self.cfg.precision, **kw)

    def serial(self, b: int) -> list[list[int]]:
        """The serial decode at block length ``b`` (the agreement reference), decoded once and cached."""
        if b not in self._serial:
            self._serial[b] = self._decode("serial", b).tokens
        return self._serial[b]

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        mark_worker(trial)
        cfg = self.cfg
        b = trial.suggest_categorical("block_length", cfg.block_lengths) if cfg.tune_block_length else cfg.block_lengths[0]
        tau = trial.suggest_float("threshold", cfg.threshold_low, cfg.threshold_high)
        if self.task:
            return self._task_trial(trial, b, tau)
        res = self._decode(cfg.policy, b, threshold=tau, **self.extra)
        gen = np.asarray(res.tokens)
        ref = np.asarray(self.serial(b)) if cfg.accuracy == "agree_serial" else np.asarray([p.real for p in self.prompts])
        tpf = float(np.mean([res.tpf(i) for i in range(len(gen))]))
        acc = float((gen == ref).mean())
        trial.set_user_attr("tpf_real", float(np.mean([res.tpf_real(i) for i in range(len(gen))])))
        trial.set_user_attr("block_length", b)
        return tpf, acc

    def _task_trial(self, trial: optuna.Trial, b: int, tau: float) -> tuple[float, float]:
        """A trial on the task: decode its problems at (B, τ) free-running (cut at the stop tokens), run the
        completions, return (mean tpf over problems, pass@1); the answers go to ``samples/trial-<n>.jsonl``."""
        cfg, tp = self.cfg, self.task_prompts
        res = decode_task(self.model, cfg.policy, tp, cfg.gen_len, cfg.batch_size, self.pad, block_length=b,
                          threshold=tau, precision=cfg.precision, **self.extra)
        comps = completions(self.tok, tp, res.tokens)
        acc = pass_at(score(tp, {0: [comps]}, self.task, progress=False)[0])["pass@1"]
        label = setting_label(b, tau)
        write_samples(Path(cfg.out_dir) / "samples" / f"trial-{trial.number:05d}.jsonl",
                      sample_records(tp, comps, cfg.policy, label, 0, block_length=b, threshold=tau,
                                     trial=trial.number))
        n = len(res.tokens)
        trial.set_user_attr("tpf_real", float(np.mean([res.tpf_real(i) for i in range(n)])))
        trial.set_user_attr("block_length", b)
        return float(np.mean([res.tpf(i) for i in range(n)])), float(acc)


#: Settings of a sweep's out_dir that a rerun may change: how many trials and workers, how the next parameters
#: are drawn and searched. Every setting that changes a measurement stays fixed (:data:`MEASUREMENT`), and so do
#: the study's name and storage (the folder's exports are that study's).
SWEEP_MAY_CHANGE = ("n_trials", "n_workers", "seed", "heartbeat_interval", "optuna_sampler", "threshold_low",
                    "threshold_high", "strict_family", "attn_implementation", "exec_workers",
                    "confirm_run_unsafe_code", *TEAM_MAY_CHANGE)
#: The settings that change a trial's measurement (tpf, accuracy): a study records them with the fingerprints of
#: its model, sampler and prompt set (:func:`measurement_identity`), and refuses a resume that changes any.
MEASUREMENT = ("model", "policy", "sampler", "sampler_fallback", "block_lengths", "tune_block_length", "accuracy",
               "mode", "corpus", "n_prompts", "prompt_len", "gen_len", "batch_size", "precision")
#: The task settings a task sweep's study records beside :data:`MEASUREMENT` (a sweep without ``--task`` records none,
#: so its identity is unchanged).
TASK_MEASUREMENT = ("task", "problems", "prompt_format", "exec_timeout")


def measurement_identity(cfg: SweepConfig, objective: "ThresholdObjective") -> dict:
    """What a trial of ``cfg`` measures: the :data:`MEASUREMENT` settings, and the fingerprints of the model's
    weights and tokenizer, of the sampler's weights and of the prompt set (token ids of every prompt and its
    real continuation), so that a changed folder behind the same path is seen too."""
    from ..model.fingerprint import model_fingerprint, tokenizer_hash
    from ..trajectories.collect import prompt_digest

    ident = {k: getattr(cfg, k) for k in MEASUREMENT}
    if cfg.task:                                # what a task trial measures: its problems, format and time limit
        ident.update({k: getattr(cfg, k) for k in TASK_MEASUREMENT})
    ident.update(model_fingerprint=model_fingerprint(objective.model), tokenizer_hash=tokenizer_hash(objective.tok),
                 prompt_digest=prompt_digest(objective.prompts),
                 sampler_fingerprint=_file_digest(Path(cfg.sampler) / "sampler.safetensors") if cfg.sampler else None)
    return json.loads(json.dumps(ident))


def _file_digest(path: Path) -> str | None:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def resolved_precision(cfg: SweepConfig) -> SweepConfig:
    """``cfg`` with 'auto' precision resolved for the device the trials decode on
    (:func:`~workbench.decoding.base.resolve_precision`), so the run record and the study's identity hold what
    was measured: a study resumed on a machine that resolves 'auto' otherwise is refused by name."""
    from dataclasses import replace

    from ..decoding.base import resolve_precision
    from ..model.load import resolve_device

    return replace(cfg, precision=resolve_precision(cfg.precision, resolve_device("auto")))


def run_sweep(cfg: SweepConfig) -> dict:
    """Create or resume the study, run until it has ``n_trials`` finished trials, export and plot.

    Everything that can be refused is checked first (:func:`~workbench.run_folder.check_run` for the out_dir,
    :func:`~workbench.tune.storage.check_study_identity` for the study). Ctrl-C or SIGTERM fails the trials in flight (a rerun runs them
    again), exports the finished ones and ends with :class:`~workbench.interrupts.Interrupted`."""
    from ..interrupts import Interrupted
    from ..run_folder import check_run, open_run, run_settings, update_record

    cfg.validate()
    cfg = resolved_precision(cfg)
    folder_args = dict(path=cfg.out_dir, kind="sweep", settings=run_settings(cfg), may_change=SWEEP_MAY_CHANGE,
                       state="trials.parquet")
    check_run(**folder_args)
    if cfg.storage:                             # a bad --storage fails before anything is written
        make_storage(cfg.storage, Path(cfg.out_dir), cfg.heartbeat_interval)
    optuna.logging.set_verbosity(optuna.logging.ERROR)   # a trial's error reaches the command line once, from us
    key = json.dumps(asdict(cfg), sort_keys=True)
    _OBJECTIVES[key] = objective = ThresholdObjective(cfg)
    ident = measurement_identity(cfg, objective)
    _check_existing(cfg, ident)                 # a study that measured something else: refused before any write
    try:
        with open_run(**folder_args) as folder:
            out = folder.path
            write_json(out / "config.json", asdict(cfg))
            study = _open(cfg, 0)
            check_study_identity(study, ident)
            label_study(study, ["tpf", cfg.accuracy], decoder=cfg.policy, block_lengths=list(cfg.block_lengths),
                        model=cfg.model)
            before = _completed(study)
            t0 = time.time()
            try:
                if before < cfg.n_trials:
                    with watch_study(cfg.study, cfg.storage, out, cfg.dashboard):
                        run_workers(partial(_sweep_worker, asdict(cfg)), cfg.n_workers, study)
            except Interrupted as e:
                export_study(study, out, cfg.accuracy)
                raise Interrupted(e.signum, f"interrupted after {_completed(study)} finished trials (exported to "
                                            f"{out}); rerun the same command to run the rest") from None
            trials = export_study(study, out, cfg.accuracy)
            update_record(folder, finished=_completed(study) >= cfg.n_trials)
    finally:
        _OBJECTIVES.clear()                     # the cache spans one sweep (its workers and the retry pass)
    return {"study": cfg.study, "trials_before": before, "trials_after": _completed(study),
            "wall_s": time.time() - t0, "pareto": trials["pareto"].to_dict(orient="records"), "out_dir": str(out)}


def _check_existing(cfg: SweepConfig, ident: dict) -> None:
    """:func:`~workbench.tune.storage.check_study_identity` on the study ``cfg.study`` if it exists already, in a
    shared ``--storage`` or in the out_dir's own ``optuna.db`` (nothing is created)."""
    if cfg.storage or (Path(cfg.out_dir) / "optuna.db").is_file():
        check_existing_study(cfg.study, make_storage(cfg.storage, Path(cfg.out_dir), cfg.heartbeat_interval), ident)


def _completed(study: optuna.Study) -> int:
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


def _open(cfg: SweepConfig, index: int) -> optuna.Study:
    return open_study(cfg.study, cfg.storage, Path(cfg.out_dir), cfg.optuna_sampler, worker_seed(cfg.seed, index),
                      cfg.heartbeat_interval, directions=["maximize", "maximize"])


#: The loaded objective (model, prompts, serial targets) of the sweep this process is running.
_OBJECTIVES: dict[str, "ThresholdObjective"] = {}


def _sweep_worker(cfg: dict, index: int, ready=lambda: None) -> None:
    """Worker ``index`` of a sweep (:func:`~workbench.tune.workers.run_workers`): open the study, load the model,
    wait for the other workers (``ready``) and run trials until the study has ``n_trials`` complete ones."""
    key = json.dumps(cfg, sort_keys=True)
    cfg = SweepConfig(**cfg)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = _open(cfg, index)
    if key not in _OBJECTIVES:              # once per process (the parent's retry pass reuses its model)
        _OBJECTIVES[key] = ThresholdObjective(cfg)
    objective = _OBJECTIVES[key]
    ready()                                 # all workers loaded: start together
    optimize_until(study, objective, cfg.n_trials, (optuna.trial.TrialState.COMPLETE,), cfg.reconnect_s,
                   "workbench sweep")


def export_study(study: optuna.Study, out: Path, accuracy: str = "accuracy") -> dict:
    """Write ``trials.parquet`` (all finished trials), ``pareto.parquet`` (the Pareto front) and ``pareto.png``, each
    renamed into place when complete (:mod:`workbench.atomic`)."""
    rows = []
    best = {t.number for t in study.best_trials}
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        rows.append({"number": t.number, "tpf": t.values[0], accuracy: t.values[1], **t.params,
                     **{f"user_{k}": v for k, v in t.user_attrs.items()}, "pareto": t.number in best})
    df = pd.DataFrame(rows)
    write_bytes(out / "trials.parquet", df.to_parquet(index=False))
    pareto = df[df["pareto"]].sort_values("tpf") if len(df) else df
    write_bytes(out / "pareto.parquet", pareto.to_parquet(index=False))
    if len(df):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4.2))
        ax.scatter(df["tpf"], df[accuracy], s=16, alpha=0.5, label="trials")
        ax.plot(pareto["tpf"], pareto[accuracy], "-o", color="tab:red", ms=4, label="Pareto front")
        ax.set_xlabel("tokens per forward (tpf)")
        ax.set_ylabel(accuracy.replace("_", " "))
        ax.set_title(f"study {study.study_name}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        with atomic_path(out / "pareto.png") as tmp:
            fig.savefig(tmp, dpi=120, format="png")
        plt.close(fig)
    return {"trials": df, "pareto": pareto}


def main(argv: list[str]) -> int:
    """``workbench sweep``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench sweep", SweepConfig, argv)
    try:
        r = run_sweep(cfg)
    except StorageLost as e:                    # the database server went away for good: one line, exit 1
        return e.report()
    print(f"study {r['study']}: {r['trials_before']} → {r['trials_after']} finished trials in {r['wall_s']:.0f} s; "
          f"Pareto front ({len(r['pareto'])} points) in {r['out_dir']}/pareto.parquet")
    for p in r["pareto"]:
        print(f"  B={p.get('block_length', p.get('user_block_length'))} τ={p['threshold']:.3f}  tpf={p['tpf']:.3f}  "
              f"{[k for k in p if k in ACCURACY_METRICS][0]}={p[[k for k in p if k in ACCURACY_METRICS][0]]:.3f}")
    return 0
