"""Hugging Face model families (issue 24 §1): a random two-layer checkpoint of each family, saved with
``save_pretrained`` beside a small BPE tokenizer without a mask token, goes through the workbench as a user's
checkpoint would. The sliding-window families get a window of 8 tokens, shorter than the prompts.

Default suite, per family: loading with ``--add_mask_token``, cached AR greedy equal to greedy decoding with the
model's own uncached forward (left-padded batch), a cached diffusion block equal to the training dual stream,
and confidence decoding. ``-m slow``, per family: ``train lm``, reload with plain transformers, collect and
``store verify``, SOL, ``train lora`` and reload with peft, linear self-speculation (lossless), ``train sampler``,
the evaluation harness, the leaderboard, and DEER's teacher, Stage I (shared-layer drafter) and evaluation."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import bpe_tokenizer

WINDOW = 8
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256)
#: model_type → config fields (besides vocabulary and special tokens); docs/models.md's family table lists them.
FAMILIES = {
    "llama": SMALL,
    "qwen2": SMALL,
    "qwen3": {**SMALL, "head_dim": 8},
    "phi3": SMALL,
    "olmo2": SMALL,
    "smollm3": SMALL,
    "granite": SMALL,
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=256),
    "gpt_neox": {k: v for k, v in SMALL.items() if k != "num_key_value_heads"},
    "mistral": {**SMALL, "head_dim": 8, "sliding_window": WINDOW},
    "ministral3": {**SMALL, "head_dim": 8, "sliding_window": WINDOW},
    "gemma2": {**SMALL, "head_dim": 8, "sliding_window": WINDOW},
    "gemma3_text": {**SMALL, "head_dim": 8, "sliding_window": WINDOW,
                    "layer_types": ["sliding_attention", "full_attention"]},
}
SLIDING = {"mistral", "ministral3", "gemma2", "gemma3_text"}


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer()


def family_checkpoint(root, family: str, tok):
    """Save a random two-layer ``family`` checkpoint with ``tok`` under ``root/family``; returns the path."""
    ids = dict(vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    cfg = AutoConfig.for_model(family, **FAMILIES[family], **ids)
    torch.manual_seed(0)
    out = root / family
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _prompts(tok) -> list[list[int]]:
    text = "def encode(self, o):\n    chunks = self.iterencode(o, _one_shot=True)\n    return ''.join(chunks)\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return [ids[:20], ids[3:17]]                      # both longer than the window, different lengths


def _reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with the backbone's own forward over the whole sequence (no cache, no workbench mask),
    the added mask token excluded as the base model never had it."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model.backbone(input_ids=torch.tensor([seq])).logits[0, -1]
            logits[model.mask_token_id] = float("-inf")
            seq.append(int(logits.argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_loads_and_decodes_like_its_own_forward(tmp_path, tokenizer, family):
    from workbench.decoding.registry import get_policy
    from workbench.model.load import load_model
    from workbench.model.noise import mask_blocks

    path = family_checkpoint(tmp_path, family, tokenizer)
    model, tok, _ = load_model(str(path), add_mask_token=True)
    assert model.layout.window == (WINDOW if family in SLIDING else None)
    prompts = _prompts(tok)
    res = get_policy("ar_greedy")(model, prompts, 12, pad_id=tok.pad_token_id)
    assert res.tokens == [_reference_greedy(model, p, 12) for p in prompts]
    # a diffusion block after a 20-token cached prefix = the same block in the training dual stream
    x = torch.tensor([prompts[0] + prompts[1][:4]])
    noisy, _, _ = mask_blocks(x, 4, model.mask_token_id, 0.5, torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, diff = model.dual_stream_logits(x, noisy, 4)
        cache = model.new_cache()
        model.extend(x[:, :20], cache, torch.ones(1, 20, dtype=torch.bool))
        block = model.diffusion_logits(noisy[:, 20:], cache, torch.ones(1, 24, dtype=torch.bool))
    torch.testing.assert_close(block, diff[:, 20:], atol=3e-5, rtol=1e-4)
    conf = get_policy("confidence")(model, prompts, 8, block_length=4, threshold=0.9, pad_id=tok.pad_token_id)
    assert [len(t) for t in conf.tokens] == [8, 8]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_pipeline(tmp_path, tokenizer, small_corpus, family):
    """The training, store, SOL, drafter and speculation commands on the family's checkpoint, and what they
    write reloads with plain transformers and peft."""
    from peft import PeftModel

    from workbench.cli_args import parse_dataclass
    from workbench.drafter.train import LoraTrainConfig, train_lora
    from workbench.model.load import load_model
    from workbench.sol.run import SolConfig, run_sol_eval
    from workbench.speculative.linear import linear_self_speculation
    from workbench.train.lm import LMTrainConfig, train_lm
    from workbench.trajectories.collect import CollectConfig, run_collect
    from workbench.trajectories.store import verify_store

    path = family_checkpoint(tmp_path, family, tokenizer)
    lm = train_lm(parse_dataclass("t", LMTrainConfig, [
        "--init_from", str(path), "--add_mask_token", "true", "--corpus", str(small_corpus), "--out_dir",
        str(tmp_path / "lm"), "--seq_len", "32", "--batch_size", "2", "--block_lengths", "[4, 8]",
        "--val_block_length", "4", "--max_steps", "3", "--stage1_steps", "1", "--val_every", "3", "--val_windows", "2",
        "--checkpoint_every", "3", "--precision", "32-true", "--progress_bar", "false", "--accelerator", "cpu"]))
    plain = AutoModelForCausalLM.from_pretrained(lm)
    assert plain.config.model_type == AutoConfig.from_pretrained(path).model_type
    model, tok, _ = load_model(str(lm))
    assert model.has_mask_token
    prompts = _prompts(tok)
    spec = linear_self_speculation(model, prompts, 12, 4)
    greedy = [_reference_greedy(model, p, 12) for p in prompts]
    assert [t[:12] for t in spec.tokens] == greedy                   # lossless against AR greedy
    store = tmp_path / "s.zarr"
    run_collect(CollectConfig(model=str(lm), corpus=str(small_corpus), out=str(store), n_prompts=4,
                              blocks_per_prompt=2, block_lengths=[4], batch_size=2, context_len=32, feature_dim=24,
                              precision="fp32", accelerator="cpu", progress_bar=False))
    assert verify_store(store)["block_lengths"][4]["rows"] > 0
    sol = run_sol_eval(SolConfig(model=str(lm), corpus=str(small_corpus), n_prompts=2, gen_len=8, block_lengths=[4],
                                 budget=50, device="cpu", out_dir=str(tmp_path / "sol"), progress_bar=False))
    assert sol["overall"] is not None
    adapter = train_lora(parse_dataclass("t", LoraTrainConfig, [
        "--config", "workbench/configs/lora_micro.yaml", "--init_from", str(lm), "--corpus", str(small_corpus),
        "--out_dir", str(tmp_path / "lora"), "--progress_bar", "false", "--max_steps", "2", "--accelerator", "cpu"]))
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lm), adapter)
    # the confidence sampler on the family's store
    from workbench.sampler.train import SamplerTrainConfig, train_sampler

    train_sampler(SamplerTrainConfig(store=str(store), block_length=4, out_dir=str(tmp_path / "sampler"),
                                     preset="micro", feature_dim=24, batch_size=8, max_epochs=1, val_fraction=0.5,
                                     split_by="traj",
                                     progress_bar=False, accelerator="cpu"))
    # evaluation harness and leaderboard
    from workbench.corpus import by_split, load_corpus
    from workbench.evaluation.harness import EvalConfig, evaluate_model
    from workbench.evaluation.prompts import make_prompts
    from workbench.leaderboard.config import LeaderboardConfig
    from workbench.leaderboard.run import run_leaderboard

    held_out = make_prompts(by_split(load_corpus(str(small_corpus)), "test"), 2, 32, 8, tok)
    df = evaluate_model(model, tok, held_out, EvalConfig(n_prompts=2, gen_len=8, block_lengths=[4], thresholds=[0.9],
                                                        sample_temperatures=[0.8], precision="fp32",
                                                        progress_bar=False))
    assert len(df) and df["tpf"].notna().all()
    board, _ = run_leaderboard(LeaderboardConfig(model=str(lm), corpus=str(small_corpus), n_prompts=2, prompt_len=32,
                                                 gen_len=8, block_lengths=[4], thresholds=[0.9], precision="fp32",
                                                 batch_size=2, out_dir=str(tmp_path / "board"), progress_bar=False,
                                                 skip_missing=True, sol_budget=50,
                                                 decoders=["ar_greedy", "confidence", "ss_linear"]))
    assert board.loc[board["decoder"].str.startswith("ss_linear"), "lossless"].all()
    # DEER: teacher answers, Stage I on the target's first layer (shared embedding and head), evaluation
    from workbench.deer.evaluate import DeerEvalConfig, run_deer_eval
    from workbench.deer.teacher import TeacherConfig, generate_teacher
    from workbench.deer.train import DeerTrainConfig, train_deer

    generate_teacher(TeacherConfig(target=str(lm), corpus=str(small_corpus), n_answers=8, prompt_len=24, gen_len=8,
                                   batch_size=4, chunk_size=8, out_dir=str(tmp_path / "teacher")), model, tok)
    drafter = train_deer(DeerTrainConfig(stage=1, teacher=str(tmp_path / "teacher"), shared_layers=1, batch_size=4,
                                         sep_token="<|endoftext|>",
                                         max_steps=2, val_every=2, val_percent=30, warmup_steps=1, checkpoint_every=2,
                                         out_dir=str(tmp_path / "deer"), progress_bar=False, accelerator="cpu"))
    ev = run_deer_eval(DeerEvalConfig(target=str(lm), drafter=str(drafter), corpus=str(small_corpus), n_prompts=2,
                                      prompt_len=24, gen_len=8, draft_length=4, batch_size=2, device="cpu",
                                      out_dir=str(tmp_path / "deer_eval"), progress_bar=False))
    import pandas as pd

    table = pd.read_parquet(ev / "by_category.parquet")
    assert (table["agree_ar"] == 1.0).all()                              # greedy DEER is AR greedy
