"""Lightning LM training: two-stage schedule, checkpoint directory, resume."""

import pytest
import torch

from conftest import stop_lightning_at
from workbench.cli_args import parse_dataclass
from workbench.model.io import load_checkpoint
from workbench.train.lm import LMTrainConfig, TriModeLMModule, build_model, train_lm


def _cfg(tmp_path, corpus, **kw):
    base = ["--config", "workbench/configs/micro.yaml", "--out_dir", str(tmp_path / "run"), "--corpus", str(corpus),
            "--progress_bar", "false"]
    for k, v in kw.items():
        base += [f"--{k}", str(v)]
    return parse_dataclass("t", LMTrainConfig, base)


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    from conftest import REPO

    monkeypatch.chdir(REPO)


def test_two_stage_schedule_alpha():
    cfg = LMTrainConfig(stage1_steps=10, max_steps=20, alpha=0.3)
    m = TriModeLMModule(None, cfg)
    assert m.alpha_at(0) == 0.0 and m.alpha_at(9) == 0.0 and m.alpha_at(10) == 0.3


def test_config_validation():
    with pytest.raises(ValueError, match="divide seq_len"):
        LMTrainConfig(seq_len=64, block_lengths=[5]).validate()
    with pytest.raises(ValueError, match="valid: micro, tiny, small"):
        LMTrainConfig(preset="huge").validate()


def test_train_saves_loadable_checkpoint(tmp_path, small_corpus):
    out = train_lm(_cfg(tmp_path, small_corpus, max_steps=12, stage1_steps=6, val_every=6, checkpoint_every=6))
    model, tok, meta = load_checkpoint(out)
    assert meta["global_step"] == 12 and meta["mask_token_id"] == tok.mask_token_id
    assert "val/ar_loss" in meta["final_metrics"] and "val/diff_loss" in meta["final_metrics"]
    assert (out / "training_log.csv").exists() and (tmp_path / "run" / "config.yaml").exists()
    # plain transformers can load it too
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(out)
    # a continuation leg starts from it in train mode (load_checkpoint gives an eval-mode model)
    start, _ = build_model(_cfg(tmp_path / "leg2", small_corpus, init_from=out))
    assert not model.backbone.training and all(m.training for m in start.modules())


UL = {"ul_prob": 0.5, "ul_prefix_len": 16, "ul_gen_len": 16, "ul_ngram": 4}


@pytest.mark.parametrize("extra,stop", [({}, 5), (UL, 10)], ids=["joint_stop_at_5", "with_unlikelihood_steps_stop_at_10"])
def test_resume_equals_uninterrupted(tmp_path, small_corpus, extra, stop):
    """Stopping at step ``stop`` and resuming to 20 gives the same weights and the same training log as
    running to 20 directly (also when sequence-level unlikelihood steps, which decode with the model, are
    mixed in). A stop before half-way used to end the resumed epoch early and replay its first windows."""
    a = train_lm(_cfg(tmp_path / "a", small_corpus, max_steps=20, stage1_steps=4, val_every=100,
                      checkpoint_every=stop, precision="32-true", **extra))
    cfg_b = _cfg(tmp_path / "b", small_corpus, max_steps=20, stage1_steps=4, val_every=100, checkpoint_every=stop,
                 precision="32-true", **extra)
    cfg_b.max_time = None
    # first leg: stop after ``stop`` steps by training with max_steps=stop but the same schedule length
    with stop_lightning_at(stop):
        train_lm(cfg_b)
    assert (tmp_path / "b" / "run" / "checkpoints" / "last.ckpt").exists()
    b = train_lm(cfg_b)
    ma, _, meta_a = load_checkpoint(a)
    mb, _, meta_b = load_checkpoint(b)
    assert meta_b["global_step"] == 20
    import pandas as pd

    log_a, log_b = pd.read_csv(a / "training_log.csv"), pd.read_csv(b / "training_log.csv")
    assert log_b["step"].tolist() == log_a["step"].tolist() == [9, 19]   # at stop 10 the interrupted run's row is kept
    pd.testing.assert_series_equal(log_b["train/loss"], log_a["train/loss"], rtol=1e-4)
    for (na, pa), (nb, pb) in zip(ma.state_dict().items(), mb.state_dict().items()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=na)


def test_unlikelihood_steps_are_logged(tmp_path, small_corpus):
    out = train_lm(_cfg(tmp_path, small_corpus, max_steps=10, stage1_steps=0, val_every=100, checkpoint_every=10,
                        **{**UL, "ul_prob": 0.6}))
    import pandas as pd

    log = pd.read_csv(out / "training_log.csv")
    assert "train/ul_ar" in log and log["train/ul_ar"].notna().any()          # unlikelihood steps ran
    assert log["train/diff_loss"].notna().any()                                # joint steps ran


def _hf_checkpoint_without_mask_token(path):
    """A local Hugging Face Llama checkpoint (byte-level BPE, 257 ids, '<eos>') whose tokenizer has no mask."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from workbench.tokenizer import _bytes_to_unicode

    t = Tokenizer(models.BPE(vocab={ch: b for b, ch in _bytes_to_unicode().items()}, merges=[]))
    t.add_special_tokens([AddedToken("<eos>", special=True)])
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    t.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", pad_token="<eos>")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256)
                     ).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_train_from_hf_checkpoint_without_mask_token(tmp_path, small_corpus):
    """``--init_from`` a foreign checkpoint: without ``--add_mask_token`` a one-line error that names the
    flag (the flag did not exist for ``train lm``); with it, training runs and the saved model carries
    [MASK]."""
    from workbench.tokenizer import TokenizerError

    hf = _hf_checkpoint_without_mask_token(tmp_path / "hf")
    with pytest.raises(TokenizerError, match="--add_mask_token true"):
        train_lm(_cfg(tmp_path / "no", small_corpus, init_from=hf, max_steps=2, stage1_steps=1))
    out = train_lm(_cfg(tmp_path / "yes", small_corpus, init_from=hf, add_mask_token=True, max_steps=2,
                        stage1_steps=1, precision="32-true"))
    model, tok, _ = load_checkpoint(out)
    assert tok.mask_token_id == 257 == model.mask_token_id
    assert model.backbone.get_input_embeddings().num_embeddings == 258 == len(tok)


def test_resume_refuses_another_noise_level_draw(tmp_path, small_corpus):
    """A run keeps the noise draw it started with, and the advice names what the folder records: a folder from
    before run records (its config.yaml, no noise_per key) drew per block; a recorded run names its own draw."""
    import yaml

    from workbench.run_folder import RunFolderError, check_run, open_run
    from workbench.train.lm import run_folder_args

    cfg = _cfg(tmp_path, small_corpus, noise_per="sequence")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")              # a resume point: the settings must match
    legacy = {k: v for k, v in vars(cfg).items() if k != "noise_per"}
    (run / "config.yaml").write_text(yaml.safe_dump(legacy))
    with pytest.raises(RunFolderError, match="noise_per 'block'.*--noise_per block"):
        check_run(**run_folder_args(cfg))
    check_run(**run_folder_args(_cfg(tmp_path, small_corpus, noise_per="block")))
    import shutil

    shutil.rmtree(run)
    with open_run(**run_folder_args(cfg)):
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(RunFolderError, match="noise_per 'sequence'.*--noise_per sequence"):
        check_run(**run_folder_args(_cfg(tmp_path, small_corpus, noise_per="block")))
