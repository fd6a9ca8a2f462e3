"""``workbench diffuspec tune``: an Optuna sweep of ADL's guardrails and increment (k_min, k_max, δ) for our
tokenizer (DiffuSpec, arXiv:2510.02358 §5 fixes k_min = 20, k_max = 30, δ = 10 for Qwen/Dream tokenizers; a byte-level or
49 k-token BPE model needs its own), with CPS on, on validation-split prompts (never the test split).

Objective: cost-weighted tokens per forward (tokens ÷ (target forwards + drafter forwards × the drafter's
parameter share)), deterministic, so the sweep does not chase timing noise; tokens/s and MAT of each trial are
kept as user attributes. Files in ``out_dir``: ``trials.csv``, ``best.json``, ``study.db`` (resumable: a rerun
adds trials to the same study).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..atomic import write_json, write_text
from ..model.loading import ModelLoading


@dataclass
class TuneConfig(ModelLoading):
    """The ADL sweep (DiffuSpec §4.3)."""

    model: str = "tiny"
    """Target (and 'self' drafter): 'tiny', 'smollm2-135m-trimode' or a checkpoint directory."""
    drafter: str = "self"
    """'self' or a DEER drafter directory."""
    proxy: str | None = None
    """n-gram proxy (default: the one shipped for --model)."""
    n_trials: int = 20
    """Optuna trials (added to the study in out_dir)."""
    n_prompts: int = 4
    """Validation prompts per trial."""
    prompt_len: int = 128
    """Maximum prompt length in tokens."""
    gen_len: int = 48
    """Tokens per prompt."""
    k_max_limit: int = 24
    """Largest k_max tried (tokens)."""
    seed: int = 0
    """Sampler seed (TPE)."""
    precision: str = "fp32"
    """'fp32' or 'bf16'."""
    out_dir: str = "runs/diffuspec/tune"
    """Output directory (study.db, trials.csv, best.json)."""

    def validate(self) -> None:
        """Raise ``ValueError`` for a bad setting."""
        if self.n_trials < 1 or self.n_prompts < 1 or self.gen_len < 1 or self.k_max_limit < 2:
            raise ValueError("n_trials, n_prompts and gen_len must be >= 1 and k_max_limit >= 2")


def run(cfg: TuneConfig) -> dict:
    """Run the sweep; returns the best parameters with their objective."""
    import optuna

    from ..assets import shipped_artefact
    from ..corpus import by_split, load_corpus
    from ..evaluation.prompts import make_prompts
    from ..model.load import load_model
    from .decode import DiffuSpecConfig, diffuspec_decode
    from .evaluate import load_drafter
    from .ngram import ProxyError, load_proxy

    cfg.validate()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tok, _ = load_model(cfg.model)
    model.eval()
    proxy_path = cfg.proxy or shipped_artefact(cfg.model, "proxy")
    if proxy_path is None:
        raise ProxyError(f"no n-gram proxy for {cfg.model}: pass --proxy, or build one with "
                         f"`workbench diffuspec proxy --model {cfg.model} --out_dir <dir>`")
    proxy = load_proxy(proxy_path, tok)
    drafter, kind, sep = load_drafter(cfg.drafter, model, tok)
    prompts = [list(p.prompt) for p in make_prompts(by_split(load_corpus("stdlib"), "validation"), cfg.n_prompts,
                                                    cfg.prompt_len, cfg.gen_len, tok)]

    def objective(trial: optuna.Trial) -> float:
        k_min = trial.suggest_int("k_min", 1, 8)
        k_max = trial.suggest_int("k_max", max(k_min, 2), cfg.k_max_limit)
        delta = trial.suggest_float("delta", 1.0, 10.0)
        s = DiffuSpecConfig(cps=True, adl=True, k_min=k_min, k_max=k_max, delta=delta)
        res = diffuspec_decode(model, drafter, prompts, cfg.gen_len, s, proxy=proxy, eos_id=tok.eos_token_id,
                               drafter_kind=kind, sep_id=sep, precision=cfg.precision)
        share = res.drafter_params / max(1, res.target_params)
        tokens = sum(len(t) for t in res.tokens)
        cost = sum(res.extra_forwards) + share * sum(res.forwards)
        trial.set_user_attr("tokens_per_s", tokens / res.wall_time)
        trial.set_user_attr("mat", sum(sum(a) for a in res.accepted) / max(1, sum(len(a) for a in res.accepted)))
        return tokens / cost

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="adl", direction="maximize", storage=f"sqlite:///{out / 'study.db'}",
                                load_if_exists=True, sampler=optuna.samplers.TPESampler(seed=cfg.seed))
    study.optimize(objective, n_trials=cfg.n_trials)
    write_text(out / "trials.csv", study.trials_dataframe().to_csv(index=False))
    best = {**study.best_params, "tpf_cost": study.best_value, **study.best_trial.user_attrs,
            "trials": len(study.trials), "config": asdict(cfg)}
    write_json(out / "best.json", best, default=str)
    return best


def main(argv: list[str]) -> int:
    """``workbench diffuspec tune --model M [--n_trials N] ...``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench diffuspec tune", TuneConfig, argv)
    best = run(cfg)
    print(json.dumps({k: v for k, v in best.items() if k != "config"}, indent=2, default=str))
    return 0
