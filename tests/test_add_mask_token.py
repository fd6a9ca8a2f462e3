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


def test_lora_target_is_the_family_attention_output_projection(tmp_path, ar_checkpoint, small_corpus):
    """train lora's default o_proj becomes GPT-2's attn.c_proj and GPT-NeoX's attention.dense (issue 24 §1); a name
    that matches nothing is one line naming --target_modules with candidates, and leaves no run folder."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, \
        LlamaForCausalLM

    from workbench.cli_args import parse_dataclass
    from workbench.drafter.lora import resolve_target_modules
    from workbench.drafter.train import LoraTrainConfig, train_lora

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64))
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                            intermediate_size=64, vocab_size=64))
    llama = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                         intermediate_size=64, vocab_size=64))
    assert resolve_target_modules(gpt2, ["o_proj"]) == ["attn.c_proj"]
    assert resolve_target_modules(neox, ["o_proj"]) == ["attention.dense"]
    assert resolve_target_modules(llama, ["o_proj", "v_proj"]) == ["o_proj", "v_proj"]
    with pytest.raises(ValueError, match="--target_modules with names from: .*attn.c_attn"):
        resolve_target_modules(gpt2, ["q_proj"])
    cfg = parse_dataclass("t", LoraTrainConfig, [
        "--config", "workbench/configs/lora_micro.yaml", "--init_from", str(ar_checkpoint), "--add_mask_token", "true",
        "--corpus", str(small_corpus), "--out_dir", str(tmp_path / "run"), "--target_modules", "[nope]"])
    with pytest.raises(ValueError, match="--target_modules"):
        train_lora(cfg)
    assert not (tmp_path / "run").exists()


def test_tokenizer_that_cannot_add_a_mask_token_is_a_one_line_error():
    from workbench.tokenizer import require_mask_token

    class Fixed:                                  # a vocabulary that takes no new tokens
        mask_token_id = None

        def add_special_tokens(self, tokens):
            raise NotImplementedError("vocabulary is fixed")

    class Silent(Fixed):                          # accepts the call but adds nothing
        def add_special_tokens(self, tokens):
            return 0

    with pytest.raises(TokenizerError, match="Fixed tokenizer cannot add a \\[MASK\\] token .*vocabulary is fixed"):
        require_mask_token(Fixed(), add=True)
    with pytest.raises(TokenizerError, match="Silent tokenizer did not add a \\[MASK\\] token") as e:
        require_mask_token(Silent(), add=True)
    assert "\n" not in str(e.value)
