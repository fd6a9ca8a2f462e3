"""``--add_mask_token`` on every command that loads a model for diffusion mode (issue 24 §1): collect, sol and
train lora work on a plain AR checkpoint with no mask token (as SmolLM2 ships), and without the flag say so in
one line."""
import pytest

from workbench.model.io import TokenizerError


def test_collect_with_an_added_mask_token(tmp_path, ar_checkpoint, small_corpus):
    from workbench.trajectories.collect import CollectConfig, run_collect
    from workbench.trajectories.store import verify_store

    kw = dict(model=str(ar_checkpoint), corpus=str(small_corpus), n_prompts=2, blocks_per_prompt=1, block_lengths=[4],
              batch_size=2, context_len=32, feature_dim=24, precision="fp32", accelerator="cpu", progress_bar=False)
    with pytest.raises(TokenizerError, match="--add_mask_token"):
        run_collect(CollectConfig(out=str(tmp_path / "no.zarr"), **kw))
    assert not (tmp_path / "no.zarr").exists()
    run_collect(CollectConfig(out=str(tmp_path / "s.zarr"), add_mask_token=True, **kw))
    s = verify_store(tmp_path / "s.zarr")
    assert s["block_lengths"][4]["rows"] > 0


def test_sol_with_an_added_mask_token(tmp_path, ar_checkpoint, small_corpus):
    from workbench.sol.run import SolConfig, run_sol_eval

    cfg = SolConfig(model=str(ar_checkpoint), corpus=str(small_corpus), n_prompts=2, gen_len=8, block_lengths=[4],
                    budget=50, device="cpu", out_dir=str(tmp_path / "sol"), progress_bar=False, add_mask_token=True)
    r = run_sol_eval(cfg)
    assert r["overall"] is not None


def test_train_lora_with_an_added_mask_token(tmp_path, ar_checkpoint, small_corpus):
    from workbench.cli_args import parse_dataclass
    from workbench.drafter.train import LoraTrainConfig, train_lora

    def cfg(name, *extra):
        return parse_dataclass("t", LoraTrainConfig, [
            "--config", "workbench/configs/lora_micro.yaml", "--init_from", str(ar_checkpoint), "--corpus",
            str(small_corpus), "--out_dir", str(tmp_path / name), "--progress_bar", "false", "--max_steps", "2",
            "--target_modules", "[o_proj]", *extra])

    with pytest.raises(TokenizerError, match="--add_mask_token"):
        train_lora(cfg("no"))
    train_lora(cfg("yes", "--add_mask_token", "true"))
    assert (tmp_path / "yes" / "adapter" / "adapter_config.json").is_file()
