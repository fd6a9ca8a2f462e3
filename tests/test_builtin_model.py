"""The shipped tiny model: loads from the package, is a plain HF checkpoint, and is a trained model."""
import json
import warnings

import pytest

from workbench.assets import builtin_model_path
from workbench.corpus import by_split, load_corpus
from workbench.data import encode_documents
from workbench.decoding import get_policy
from workbench.evaluation.harness import warn_untrained_positions
from workbench.model.load import load_model
from workbench.evaluation.heldout import heldout_losses
from workbench.model.io import trained_context


def test_shipped_model_files_and_metadata():
    p = builtin_model_path("tiny")
    meta = json.loads((p / "workbench.json").read_text())
    assert meta["mask_token_id"] == 256 and meta["block_lengths"] == [4, 8, 16, 32]
    assert (p / "model.safetensors").stat().st_size <= 20 * 2**20
    assert (p / "training_log.csv").exists() and (p / "train_config.yaml").exists()


def test_shipped_model_is_trained():
    model, tok, _ = load_model("builtin:tiny", "cpu")
    val = encode_documents(by_split(load_corpus("stdlib"), "validation"))
    h = heldout_losses(model, val, seq_len=256, n_windows=8, block_length=16, batch_size=8, precision="bf16")
    assert h["ar_nats_per_token"] < 1.3          # the unigram baseline is ~3.2 nats/byte
    prompt = list(b"def add(a, b):\n    return ")
    out = get_policy("ar_greedy")(model, [prompt], 8, pad_id=tok.pad_token_id)
    assert len(out.tokens[0]) == 8 and all(0 <= t < 256 for t in out.tokens[0])


def test_trained_context_and_untrained_position_warning():
    """The longest recorded training window is the max over the first run and every leg; evaluating past it
    warns with the prompt length that would fit, and a checkpoint without a record never warns."""
    meta = {"train_config": {"seq_len": 256},
            "legs": [{"train_config": {"seq_len": 256}}, {"train_config": {"seq_len": 320}}]}
    assert trained_context(meta) == 320
    assert trained_context({}) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_untrained_positions(meta, 192, 128) is None              # 320 positions: all trained
        assert warn_untrained_positions({}, 10_000, 128) is None             # plain HF checkpoint
    with pytest.warns(UserWarning, match=r"321 tokens exceeds .* \(320 tokens\).*prompt_len <= 192"):
        assert warn_untrained_positions(meta, 193, 128) is not None
