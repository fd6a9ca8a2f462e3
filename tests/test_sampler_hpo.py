"""Optuna study of sampler training hyper-parameters with the Lightning pruning callback."""
import json

import optuna
import pytest

from test_sampler import make_store
from workbench.tune.sampler_hpo import PruningCallback, SamplerHPOConfig, run_sampler_hpo


def test_sampler_hpo_runs_resumes_and_keeps_best(tmp_path):
    store = make_store(tmp_path / "s.zarr")
    cfg = SamplerHPOConfig(store=str(store), block_length=8, out_dir=str(tmp_path / "hpo"), n_trials=2, widths=[16, 32],
                           depth_high=2, max_epochs=2, val_every=None, batch_size=64)
    r = run_sampler_hpo(cfg)
    assert sum(r["states"].values()) == 2 and 0.0 <= r["best"]["val_auc"] <= 1.0
    cfg.n_trials = 3
    r2 = run_sampler_hpo(cfg)                     # resumes the same study: one more trial only
    assert sum(r2["states"].values()) == 3
    best = json.loads((tmp_path / "hpo" / "best_params.json").read_text())
    assert (tmp_path / "hpo" / f"trial-{best['number']:03d}" / "sampler" / "sampler.json").exists()
    assert len(list((tmp_path / "hpo").glob("trial-*"))) == 1


def test_pruning_callback_raises_when_pruner_says_so():
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.9))
    trial = study.ask()

    class T:
        sanity_checking = False
        global_step = 10
        callback_metrics = {"val/auc": 0.6}

    with pytest.raises(optuna.TrialPruned):
        PruningCallback(trial).on_validation_end(T(), None)
    T.callback_metrics = {"val/auc": 0.95}
    trial2 = study.ask()
    PruningCallback(trial2).on_validation_end(T(), None)  # above the threshold: not pruned


def test_sampler_hpo_two_workers_share_the_study(tmp_path):
    """``n_workers=2`` on the default SQLite storage: both processes train trials of the one study, no trial
    number repeats, and the reported best is the best over every worker's trials."""
    store = make_store(tmp_path / "s.zarr")
    cfg = SamplerHPOConfig(store=str(store), block_length=8, out_dir=str(tmp_path / "hpo"), n_trials=4, widths=[16, 32],
                           depth_high=2, max_epochs=2, val_every=None, batch_size=64, n_workers=2,
                           keep_trial_dirs=True)
    r = run_sampler_hpo(cfg)
    study = optuna.load_study(study_name=cfg.study, storage=f"sqlite:///{tmp_path / 'hpo' / 'optuna.db'}")
    finished = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert 4 <= len(finished) <= 5 and len(finished) == len(study.trials)      # none lost, none left running
    assert len({t.user_attrs["worker"] for t in finished}) == 2
    done = [t for t in finished if t.state == optuna.trial.TrialState.COMPLETE]
    assert r["best"]["val_auc"] == max(t.value for t in done)
