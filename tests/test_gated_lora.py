"""Per-token gated LoRA (I-DLM App. G, Table 6) and the tri-mode conversion of a pretrained AR model."""
import pytest
import torch

from workbench.decoding import get_policy
from workbench.model.gated_lora import lora_positions, save_gated_adapter
from workbench.model.io import CheckpointError
from workbench.model.load import AdapterMismatchError, attach_adapter, load_model
from workbench.model.masks import dual_stream_allowed
from workbench.train.lm import LMTrainConfig, build_gated_model


def _gated(ckpt, rank=4, seed=0, alpha=None):
    """A gated model on ``ckpt`` whose LoRA B matrices (zero at initialisation) and mask row are random, so
    the adapter changes the noisy stream."""
    model, tok = build_gated_model(LMTrainConfig(init_from=str(ckpt), lora_rank=rank, seed=seed, lora_alpha=alpha))
    model.eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model, tok


def _cached_ar_and_block(models, base, ids, width):
    """For each of ``models``: the AR logits of ``ids`` (extending a fresh cache) and the diffusion logits of a
    ``width``-token block ``[ids[:, -1], mask, ...]`` after them; and ``base``'s AR logits of ``ids``."""
    block = torch.full((ids.shape[0], width), models[0].mask_token_id)
    block[:, 0] = ids[:, -1]
    valid = torch.ones(ids.shape[0], ids.shape[1] + width, dtype=torch.bool)
    outs = []
    with torch.no_grad():
        for m in models:
            cache = m.new_cache()
            outs.append((m.extend(ids, cache, valid[:, :ids.shape[1]]), m.diffusion_logits(block, cache, valid)))
        want = base.extend(ids, base.new_cache(), valid[:, :ids.shape[1]])
    return outs, want


def _ids(tok, n=2, length=16):
    text = "def parse(value):\n    return json.loads(value) if value else None\n" * 3
    ids = tok(text, add_special_tokens=False)["input_ids"][:length]
    return torch.tensor([ids] * n)


def test_gate_keeps_clean_positions_the_base(ar_checkpoint):
    model, tok = _gated(ar_checkpoint)
    base, _, _ = load_model(str(ar_checkpoint))
    ids = _ids(tok)
    valid = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        got = model.extend(ids, model.new_cache(), valid)
        want = base.extend(ids, base.new_cache(), valid)
        v = want.shape[-1]
        assert torch.equal(got[..., :v], want)                          # AR mode = the base exactly
        assert torch.isinf(got[..., model.mask_token_id]).all()         # the added token is never picked
        with lora_positions(model, True):                               # the adapter does change the logits
            on = model._cached_forward(ids, model.new_cache(), valid, causal=True)
        assert (on[..., :v] - want).abs().max() > 1e-3
        # the clean half of the one-pass training forward is the base's causal forward
        clean, _ = model.dual_stream_logits(ids, torch.full_like(ids, model.mask_token_id), 4)
        assert torch.allclose(clean[..., :v], base.backbone(ids).logits, atol=1e-5)


@pytest.mark.parametrize("causal_in_block", [False, True])
def test_two_pass_training_forward_equals_one_pass(ar_checkpoint, causal_in_block):
    model, tok = _gated(ar_checkpoint)
    ids = _ids(tok)
    noisy = ids.clone()
    noisy[:, 1::3] = model.mask_token_id
    with torch.no_grad():
        _, one = model.dual_stream_logits(ids, noisy, 4, causal_in_block)
        clean, two = model.noisy_stream_logits(ids, noisy, 4, causal_in_block)
    assert torch.allclose(one, two, atol=1e-5)
    assert not clean.requires_grad


def test_noisy_stream_gets_gradient_only_through_lora(ar_checkpoint):
    model, tok = _gated(ar_checkpoint)
    ids = _ids(tok)
    noisy = torch.full_like(ids, model.mask_token_id)
    _, logits = model.noisy_stream_logits(ids, noisy, 4)
    logits.float().logsumexp(-1).sum().backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all("lora_" in n or "trainable_tokens" in n for n in grads)


def test_linear_self_speculation_on_gated_model_is_lossless(ar_checkpoint):
    model, tok = _gated(ar_checkpoint)
    base, _, _ = load_model(str(ar_checkpoint))
    prompts = [list(range(5, 25)), list(range(40, 52))]
    want = get_policy("ar_greedy")(base, prompts, 24).tokens
    for k in (2, 5):
        got = get_policy("ss_linear")(model, prompts, 24, draft_length=k)
        assert got.tokens == want
        # NLD §3.3's draft input (the masks after a clean prefix: x_{n+1} cached with the base weights)
        assert get_policy("ss_linear")(model, prompts, 24, draft_length=k, layout="clean_prefix").tokens == want


def test_quadratic_self_speculation_drafts_with_the_gate_and_is_lossless(ar_checkpoint):
    """One quadratic forward (NLD App. C) on a gated model: the speculative stream's AR logits are the base's
    exactly, the mask groups carry the LoRA residual (their drafts come from the converted diffusion mode, not
    the unconverted base), and the decode equals the base's AR greedy."""
    from workbench.speculative.context import SpecContext
    from workbench.speculative.quadratic import quadratic_forward

    model, tok = _gated(ar_checkpoint)
    base, _, _ = load_model(str(ar_checkpoint))
    ids = _ids(tok, length=12)
    spec = _ids(tok, length=15)[:, 12:]
    valid = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        ar, diff = quadratic_forward(model, SpecContext.prefill(model, ids, valid), spec, 4, keep_spec=False)
        with lora_positions(model, False):
            ar_off, diff_off = quadratic_forward(model, SpecContext.prefill(model, ids, valid), spec, 4,
                                                 keep_spec=False)
    assert torch.equal(ar, ar_off)                                       # the verifier is the base
    words = torch.arange(diff.shape[-1]) != model.mask_token_id          # [MASK] is -inf in both
    assert (diff - diff_off)[..., words].abs().max() > 1e-3              # the drafts use the adapter
    prompts = [list(range(5, 25)), list(range(40, 52))]
    want = get_policy("ar_greedy")(base, prompts, 24).tokens
    for k in (2, 4):
        assert get_policy("ss_quadratic")(model, prompts, 24, draft_length=k).tokens == want


def test_adapter_round_trip_plain_peft_and_fingerprint(ar_checkpoint, tmp_path):
    model, tok = _gated(ar_checkpoint)
    out = save_gated_adapter(model, tmp_path / "adapter", {"base_fingerprint": model.base_fingerprint},
                             dtype=torch.float32)
    base, tok2, _ = load_model(str(ar_checkpoint))
    again, _ = attach_adapter(base, tok2, out)
    ids = _ids(tok)
    noisy = torch.full_like(ids, model.mask_token_id)
    with torch.no_grad():
        assert torch.equal(model.dual_stream_logits(ids, noisy, 4)[1], again.dual_stream_logits(ids, noisy, 4)[1])
    # an inference load bakes the mask row into the base weight (no per-forward peft row swap): the cached
    # diffusion block and AR mode are unchanged, and AR mode is still the base's exactly
    from peft.utils.other import TrainableTokensWrapper

    assert not any(isinstance(m, TrainableTokensWrapper) for m in again.backbone.modules())
    assert any(isinstance(m, TrainableTokensWrapper) for m in model.backbone.modules())
    base_only, _, _ = load_model(str(ar_checkpoint))
    outs, want = _cached_ar_and_block((model, again), base_only, ids, 4)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[1][0][..., :want.shape[-1]], want)
    torch.testing.assert_close(outs[1][1], outs[0][1], atol=1e-6, rtol=1e-6)
    # plain peft reloads the weights on the base with the mask row added
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(ar_checkpoint)
    plain.resize_token_embeddings(len(tok2))
    peft_model = PeftModel.from_pretrained(plain, out)
    ours = dict(again.backbone.named_parameters())
    for name, p in peft_model.named_parameters():
        if "lora_A" in name:
            assert torch.equal(p, ours[name])
    # other base weights: refused, naming both fingerprints
    other, tok3, _ = load_model(str(ar_checkpoint))
    with torch.no_grad():
        next(other.backbone.parameters()).add_(1.0)
    with pytest.raises(AdapterMismatchError, match=model.base_fingerprint):
        attach_adapter(other, tok3, out)
    # a damaged workbench.json: a one-line CheckpointError, not a JSONDecodeError traceback
    (out / "workbench.json").write_text('{"base_fingerprint": ')
    with pytest.raises(CheckpointError, match="not valid JSON"):
        attach_adapter(*load_model(str(ar_checkpoint))[:2], out)


@pytest.mark.parametrize("alpha", [None, 12.0])
def test_inference_form_equals_peft_layers_keeps_the_fingerprint_and_switches_off(ar_checkpoint, tmp_path, alpha):
    """An inference load replaces peft's LoRA layers by GatedLoRALinear: same parameter names and tensors (so the
    same model fingerprint: stores and samplers still match), bitwise the same logits as peft's layers with the
    gate hook under a per-token gate, all-on and off, and the base's exactly when the adapter is off. Scaling
    α / r = 4 (a power of two, folded into B) and 3 (applied after B, as peft does); and again after a cast to
    bf16 (the folded B is rebuilt)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    from workbench.decoding.base import cast_for_precision
    from workbench.model.fingerprint import model_fingerprint
    from workbench.model.gated_lora import bake_mask_rows
    from workbench.model.lora_linear import GatedLoRALinear, lean_lora_layers

    model, _ = _gated(ar_checkpoint, alpha=alpha)
    out = save_gated_adapter(model, tmp_path / "adapter", {"base_fingerprint": model.base_fingerprint},
                             dtype=torch.float32)
    forms = {}
    for trainable in (False, True):
        base, tok, _ = load_model(str(ar_checkpoint))
        forms[trainable], _ = attach_adapter(base, tok, out, trainable=trainable)
        forms[trainable].eval()
    lean, peft_form = forms[False], forms[True]
    bake_mask_rows(peft_form.backbone)                  # the training form with the row baked: only the layers differ
    n_layers = 2 * 7
    assert sum(isinstance(m, GatedLoRALinear) for m in lean.backbone.modules()) == n_layers
    folds = {m.fold_scaling for m in lean.backbone.modules() if isinstance(m, GatedLoRALinear)}
    assert folds == {alpha is None}
    assert not any(isinstance(m, LoraLinear) for m in lean.backbone.modules())
    assert sum(isinstance(m, LoraLinear) for m in peft_form.backbone.modules()) == n_layers
    want_sd, got_sd = peft_form.backbone.state_dict(), lean.backbone.state_dict()
    assert list(got_sd) == list(want_sd) and all(torch.equal(got_sd[k], want_sd[k]) for k in want_sd)
    assert model_fingerprint(lean) == model_fingerprint(peft_form)
    ids = _ids(tok)
    valid = torch.ones_like(ids, dtype=torch.bool)
    per_token = torch.zeros_like(ids, dtype=torch.bool)
    per_token[:, 5::2] = True
    base_only, _, _ = load_model(str(ar_checkpoint))
    with torch.no_grad():
        want_base = base_only.backbone(ids).logits
        for on in (per_token, True, False):
            outs = []
            for m in (peft_form, lean):
                with lora_positions(m, on):
                    outs.append(m._cached_forward(ids, m.new_cache(), valid, causal=True))
            assert torch.equal(outs[0], outs[1])
            v = want_base.shape[-1]
            if on is False:
                assert torch.equal(outs[1][..., :v], want_base)             # off: the base model exactly
            else:
                assert (outs[1][..., :v] - want_base).abs().max() > 1e-3    # on: the adapter is applied
    for m in (peft_form, lean):
        cast_for_precision(m, "bf16-true")
    outs = []
    for m in (peft_form, lean):
        with torch.no_grad(), lora_positions(m, per_token):
            outs.append(m._cached_forward(ids, m.new_cache(), valid, causal=True))
    assert outs[1].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    # what the inference form does not cover is refused in one line
    from peft import LoraConfig, get_peft_model

    plain, _, _ = load_model(str(ar_checkpoint))
    dropped = get_peft_model(plain.backbone, LoraConfig(r=2, lora_dropout=0.1, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="dropout"):
        lean_lora_layers(dropped, None)


def test_gated_training_run_saves_adapter_only(ar_checkpoint, tmp_path, small_corpus):
    from workbench.train.lm import train_lm

    cfg = LMTrainConfig(init_from=str(ar_checkpoint), lora_rank=4, corpus=str(small_corpus), seq_len=32,
                        batch_size=2, block_lengths=[4, 8], max_steps=4, stage1_steps=0, val_every=4,
                        val_windows=2, val_block_length=8, val_prompts=2, val_gen_len=16, checkpoint_every=2,
                        out_dir=str(tmp_path / "run"), progress_bar=False, precision="32-true", warmup_steps=1)
    out = train_lm(cfg)
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    loaded, _, meta = load_model(str(ar_checkpoint))
    model, _ = attach_adapter(loaded, _, out)
    assert model.gated
    m = __import__("json").loads((out / "workbench.json").read_text())
    assert {"val/tau", "val/tau_tf", "val/diff_ce"} <= set(m["final_metrics"])
    # a later leg continues from the adapter (lora_init): same weights, trainable again
    cont, _ = build_gated_model(LMTrainConfig(init_from=str(ar_checkpoint), lora_rank=4, lora_init=str(out)))
    ids = torch.arange(3, 19)[None]
    noisy = torch.full_like(ids, model.mask_token_id)
    with torch.no_grad():
        assert torch.equal(cont.eval().dual_stream_logits(ids, noisy, 4)[1], model.dual_stream_logits(ids, noisy, 4)[1])
    assert any(p.requires_grad for n, p in cont.named_parameters() if "lora_" in n)
    # the Lightning checkpoint holds only what trains, not the frozen base
    ck = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ck["state_dict"] and all("lora_" in k or "trainable_tokens" in k for k in ck["state_dict"])
    # resuming it with another rank is refused by name before anything is written (run.json, issue 56); a
    # checkpoint whose tensors have other shapes than the run's is refused too (no record to compare)
    from workbench.resume import check_resume_state, trainable_shapes
    from workbench.run_folder import RunFolderError
    from workbench.train.lm import build_model

    run = tmp_path / "run"
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    cfg.lora_rank = 8
    with pytest.raises(RunFolderError, match=r"lora_rank 4 \(now 8\).*--lora_rank 4"):
        train_lm(cfg)
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
    with pytest.raises(ValueError, match=r"holds other trainable tensors than this run \(0 missing, 0 unexpected, "
                                         r"\d+ reshaped; .*is \(4, "):
        check_resume_state(run / "checkpoints" / "last.ckpt", trainable_shapes(build_model(cfg)[0], "model."))


def test_idlm_mask_hand_drawn():
    # I-DLM App. E, Fig. 8a: L = 4, stride 2; index 0-3 noisy, 4-7 clean
    got = dual_stream_allowed(4, 2, causal_in_block=True).int().tolist()
    want = [
        [1, 0, 0, 0, 0, 0, 0, 0],   # noisy 0 (block 0): itself only
        [1, 1, 0, 0, 0, 0, 0, 0],   # noisy 1: causal in its block
        [0, 0, 1, 0, 1, 1, 0, 0],   # noisy 2 (block 1): itself + clean block 0
        [0, 0, 1, 1, 1, 1, 0, 0],   # noisy 3
        [0, 0, 0, 0, 1, 0, 0, 0],   # clean: strictly causal, never noisy
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 1, 1],
    ]
    assert got == want
    # NLD's block is bidirectional instead
    assert dual_stream_allowed(4, 2)[0, 1] and dual_stream_allowed(4, 2)[2, 3]


def test_idlm_loss_hand_value_and_detached_ratio():
    import math

    from workbench.model.losses import idlm_loss

    ids = torch.tensor([[0, 1, 2]])
    mask_logits = torch.zeros(1, 3, 3, requires_grad=True)               # uniform: -log(1/3) per target
    clean_logits = torch.tensor([[[0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]], requires_grad=True)
    loss, l_mask, l_clean = idlm_loss(mask_logits, clean_logits, ids)
    lm = math.log(3)
    lc = -math.log(math.exp(2) / (math.exp(2) + 2))
    assert l_mask.item() == pytest.approx(lm) and l_clean.item() == pytest.approx(lc)
    assert loss.item() == pytest.approx(lm + (lm / lc) * lc)              # = 2 L_mask
    loss.backward()
    # ŝ is a constant: d/dclean = ŝ · dL_clean, d/dmask = dL_mask (no term through ŝ)
    g_clean = torch.autograd.grad(idlm_loss(mask_logits, clean_logits, ids)[2], clean_logits)[0]
    g_mask = torch.autograd.grad(idlm_loss(mask_logits, clean_logits, ids)[1], mask_logits)[0]
    assert torch.allclose(clean_logits.grad, (lm / lc) * g_clean, atol=1e-6)
    assert torch.allclose(mask_logits.grad, g_mask, atol=1e-6)
    # App. H.1's fixed scale: L = L_mask + 0.2 L_clean, gradient 0.2 dL_clean
    clean_logits.grad = None
    fixed, _, _ = idlm_loss(mask_logits, clean_logits, ids, clean_scale=0.2)
    assert fixed.item() == pytest.approx(lm + 0.2 * lc)
    fixed.backward()
    assert torch.allclose(clean_logits.grad, 0.2 * g_clean, atol=1e-6)
    with pytest.raises(ValueError, match="≥ 0"):
        idlm_loss(mask_logits, clean_logits, ids, clean_scale=-1.0)
    from workbench.train.lm import LMTrainConfig

    with pytest.raises(ValueError, match="needs objective idlm"):
        LMTrainConfig(idlm_clean_scale=0.2).validate()


def test_teacher_forced_tau_hand_case():
    from workbench.train.lm import teacher_forced_tau

    def onehot(ids, v=5):
        return torch.nn.functional.one_hot(torch.tensor([ids]), v).float()

    # shifted (I-DLM): blocks of 3 over 9 positions, block 0 skipped; ISD at stride N = 3 proposes N − 1 = 2
    # tokens, so only a block's first 2 predictions are drafts: block 1 agrees on both (its third agreement is
    # not a draft), block 2 on the first only
    draft, ver = onehot([0, 0, 0, 1, 2, 3, 4, 1, 2]), onehot([4, 4, 4, 1, 2, 3, 4, 0, 2])
    assert teacher_forced_tau(draft, ver, 3, shifted=True).item() == pytest.approx(((2 + 1) + (1 + 1)) / 2)
    # full agreement gives ISD's maximum of N tokens per step (I-DLM Eq. 3 at p = 1), not N + 1
    assert teacher_forced_tau(draft, draft, 3, shifted=True).item() == pytest.approx(3.0)
    # unshifted (NLD): the verifier's token for position i is the AR argmax at i - 1
    draft, ver = onehot([0, 0, 3, 4, 1, 1]), onehot([0, 3, 4, 0, 0, 0])
    assert teacher_forced_tau(draft, ver, 2, shifted=False).item() == pytest.approx(((2 + 1) + (0 + 1)) / 2)


def test_diffusion_paths_without_mask_token_name_the_flag(ar_checkpoint):
    from workbench.decoding.base import DecodeError

    model, tok, _ = load_model(str(ar_checkpoint))
    assert not model.has_mask_token
    get_policy("ar_greedy")(model, [[1, 2, 3]], 4)                       # AR needs no mask token
    with pytest.raises(DecodeError, match="no mask token.*--add_mask_token"):
        get_policy("confidence")(model, [[1, 2, 3]], 4, block_length=4)


def test_bf16_true_casts_weights_not_buffers_and_keeps_ar_mode_the_base(ar_checkpoint):
    """'bf16-true' stores the weights (adapter included) in bf16 and leaves RoPE's inv_freq in fp32; AR mode of
    the gated model is still the base's exactly (the base cast the same way), and speculative decoders run."""
    from workbench.decoding.base import PRECISIONS, DecodeError, cast_for_precision
    from workbench.leaderboard.config import LeaderboardConfig

    from workbench.model.fingerprint import model_fingerprint

    model, _ = _gated(ar_checkpoint)
    base, _, _ = load_model(str(ar_checkpoint))
    loaded = model_fingerprint(model)
    for m in (model, base):
        cast_for_precision(m, "bf16-true")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model_fingerprint(model) == loaded                 # its stores and samplers still match it
    assert all(b.dtype == torch.float32 for n, b in model.named_buffers() if n.endswith("inv_freq"))
    prompts = [list(range(5, 25)), list(range(40, 52))]
    want = get_policy("ar_greedy")(base, prompts, 16, precision="bf16-true").tokens
    assert get_policy("ar_greedy")(model, prompts, 16, precision="bf16-true").tokens == want
    for name in ("ss_linear", "ss_quadratic"):
        out = get_policy(name)(model, prompts, 16, draft_length=3, precision="bf16-true")
        assert [len(t) for t in out.tokens] == [16, 16]
    with pytest.raises(DecodeError, match="valid: " + ", ".join(PRECISIONS)):
        cast_for_precision(model, "fp16")
    LeaderboardConfig(precision="bf16-true").validate()
    with pytest.raises(DecodeError, match="bf16-true"):
        LeaderboardConfig(precision="fp16").validate()


def test_train_lora_aligns_the_gated_adapter_and_keeps_ar_mode_the_base(ar_checkpoint, tmp_path, small_corpus,
                                                                         capsys):
    """NLD §3.3's LK-hybrid + CE alignment on a converted model trains its own gated adapter (the draft
    pathway); the result loads as ``--model <run>/adapter``, AR mode stays the base's and self-speculation
    stays lossless."""
    import json

    from workbench.cli import main as cli_main
    from workbench.drafter.train import LoraTrainConfig, train_lora

    model, tok = _gated(ar_checkpoint)
    # bf16, as shipped adapters are: the aligned adapter is saved in its source's precision, so an unchanged
    # adapter would come back bit for bit
    src = save_gated_adapter(model, tmp_path / "src", {"init_from": str(ar_checkpoint),
                                                       "base_fingerprint": model.base_fingerprint})
    cfg = LoraTrainConfig(init_from=str(src), corpus=str(small_corpus), out_dir=str(tmp_path / "run"), max_steps=3,
                          batch_size=4, val_every=3, val_windows=4, min_prefix=8, max_prefix=32, draft_length=4,
                          lr=1e-2, warmup_steps=1, progress_bar=False)
    out = train_lora(cfg)
    aligned, _, meta = load_model(str(out))
    info = meta["adapter_meta"]["drafter_alignment"]
    assert info["drafter_adapter"] == "gated" and info["global_step"] == 3 and "rank" not in info
    assert meta["adapter_meta"]["base_fingerprint"] == model.base_fingerprint
    # the checkpoint holds the gated adapter's tensors only
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["state_dict"] and all("lora_" in k or "trainable_tokens" in k for k in state["state_dict"])
    assert any("trainable_tokens" in k for k in state["state_dict"])           # the mask row trains too
    assert "rank" not in info["train_config"]                                 # the source adapter's rank applies
    source, _, _ = load_model(str(src))
    base, _, _ = load_model(str(ar_checkpoint))
    ids = _ids(tok)
    outs, want = _cached_ar_and_block((source, aligned), base, ids, 5)
    assert not torch.allclose(outs[0][1], outs[1][1], atol=1e-3)            # the draft pathway trained
    assert torch.equal(outs[1][0][..., :want.shape[-1]], want)               # AR mode is the base's exactly
    prompts = [list(range(5, 25)), list(range(40, 52))]
    assert get_policy("ss_linear")(aligned, prompts, 24, draft_length=4).tokens == \
        get_policy("ar_greedy")(base, prompts, 24).tokens
    # the wrong kind of adapter for the model: one line, exit 2, nothing written
    capsys.readouterr()
    for init, choice, needle in ((str(ar_checkpoint), "gated", "carries no gated LoRA"),
                                 (str(src), "new", "is a gated-LoRA model")):
        run = tmp_path / f"bad_{choice}"
        code = cli_main(["train", "lora", "--init_from", init, "--drafter_adapter", choice, "--corpus",
                         str(small_corpus), "--out_dir", str(run)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0] and not run.exists()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4      # the source adapter's rank
    # resuming the gated run on the plain model (a new LoRA) is refused: one line, exit 2, the run untouched
    run, last = tmp_path / "run", tmp_path / "run" / "checkpoints" / "last.ckpt"
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    code = cli_main(["train", "lora", "--init_from", str(ar_checkpoint), "--corpus", str(small_corpus), "--out_dir",
                     str(run), "--max_steps", "3", "--val_every", "3", "--batch_size", "4", "--val_windows", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"init_from {str(src)!r} (now {str(ar_checkpoint)!r})" in err[0], err
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
    # a folder without a run record (an older workbench's): the checkpoint's recorded adapter kind refuses it too,
    # before anything is written (the loader's non-strict tensor-name check is the last backstop)
    from workbench.drafter.train import check_resume_adapter

    with pytest.raises(ValueError, match="trained a 'gated' drafter adapter"):
        check_resume_adapter(last, "new", LoraTrainConfig(init_from=str(ar_checkpoint)), None)


def test_a_gated_lm_run_refuses_a_checkpoint_of_another_setup(ar_checkpoint):
    """A gated `train lm` run checkpoints and reloads only its trainable tensors, non-strictly; a checkpoint
    whose tensor names are not exactly those is refused instead of loading nothing."""
    from workbench.resume import check_trainable_state
    from workbench.train.lm import TriModeLMModule

    model, _ = _gated(ar_checkpoint)
    module = TriModeLMModule(model, LMTrainConfig(init_from=str(ar_checkpoint), lora_rank=4))
    ck = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(ck)
    assert ck["state_dict"] and all("lora_" in k or "trainable_tokens" in k for k in ck["state_dict"])
    module.on_load_checkpoint(ck)                                        # its own checkpoint loads
    module.on_load_checkpoint({})                                        # no state_dict (DeepSpeed): not checked
    first = sorted(ck["state_dict"])[0]
    for state, counts in (({k: v for k, v in ck["state_dict"].items() if k != first}, "1 missing, 0 unexpected"),
                          ({**ck["state_dict"], "model.extra": torch.zeros(1)}, "0 missing, 1 unexpected"),
                          ({**ck["state_dict"], first: torch.zeros(3)}, "0 missing, 0 unexpected, 1 reshaped"),
                          (module.state_dict(), "0 missing, ")):                        # a full-model checkpoint
        with pytest.raises(ValueError, match=counts):
            module.on_load_checkpoint({"state_dict": state})
    one = torch.zeros(1)
    with pytest.raises(ValueError, match=r"^x.ckpt holds .* \(0 missing, 1 unexpected, 0 reshaped; unexpected 'b'\)"):
        check_trainable_state({"a": one, "b": one}, {"a": (1,)}, "x.ckpt")


def test_merged_adapter_matches_the_unmerged_one_and_keeps_speculation_lossless(ar_checkpoint, tmp_path, capsys):
    """``merged_adapter``: all-adapter forwards (diffusion blocks, linear SS drafts) use ``W + (α/r)·BA`` in one
    product; AR mode and per-token-gated forwards are untouched, and linear self-speculation stays lossless."""
    from workbench.cli import main as cli_main
    from workbench.model.gated_lora import merged_adapter
    from workbench.model.lora_linear import GatedLoRALinear

    trained, tok = _gated(ar_checkpoint)
    src = save_gated_adapter(trained, tmp_path / "src", {"init_from": str(ar_checkpoint),
                                                         "base_fingerprint": trained.base_fingerprint},
                             dtype=torch.float32)
    model, _, _ = load_model(str(src))
    base, _, _ = load_model(str(ar_checkpoint))
    ids = _ids(tok)
    chunk, block = ids[:, -3:], torch.full((ids.shape[0], 4), model.mask_token_id)
    valid = torch.ones(ids.shape[0], ids.shape[1] + 4, dtype=torch.bool)

    def mixed():                           # one forward: clean chunk on the base, block with the adapter
        cache = model.new_cache()
        with torch.no_grad():
            model.extend(ids[:, :-3], cache, valid[:, :ids.shape[1] - 3])
            return model.extend_and_diffuse(chunk, block, cache, valid)

    (plain,), _ = _cached_ar_and_block((model,), base, ids, 5)
    plain_mixed = mixed()
    merged_adapter(model)
    (merged,), want = _cached_ar_and_block((model,), base, ids, 5)
    layer = next(m for m in model.modules() if isinstance(m, GatedLoRALinear))
    assert layer._merged is not None                                      # built when switched on
    assert torch.equal(merged[0], plain[0]) and torch.equal(merged[0][..., :want.shape[-1]], want)   # AR mode
    assert torch.allclose(merged[1], plain[1], atol=1e-4, rtol=1e-4)     # the block, up to rounding
    assert all(torch.equal(a, b) for a, b in zip(mixed(), plain_mixed))  # a per-token gate is never merged
    w = layer.base_layer.weight
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert torch.allclose(layer.merged_weight(), w + layer.scaling * b @ a, atol=1e-6)
    with torch.no_grad():
        b.mul_(2)                                                         # the cache follows the weights
    assert torch.allclose(layer.merged_weight(), w + 2 * layer.scaling * b.div(2) @ a, atol=1e-6)
    with torch.no_grad():
        b.div_(2)
    # rebuilt inside a decoder's bf16 autocast region, the sum is still taken in fp32
    want_w = w + (b @ a) * layer.scaling
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(layer.merged_weight(), want_w)
    merged_adapter(model, False)
    assert layer._merged is None                                          # switched off: freed
    (off,), _ = _cached_ar_and_block((model,), base, ids, 5)
    assert torch.equal(off[1], plain[1])                                 # and the gated computation is back
    merged_adapter(model)
    prompts = [list(range(5, 25)), list(range(40, 52))]
    assert get_policy("ss_linear")(model, prompts, 24, draft_length=4).tokens == \
        get_policy("ar_greedy")(base, prompts, 24).tokens
    for other in (base, trained):                                        # no gated LoRA / its training form
        with pytest.raises(ValueError, match="gated LoRA loaded for inference"):
            merged_adapter(other)
    capsys.readouterr()
    code = cli_main(["decode", "--model", str(ar_checkpoint), "--merge_adapter", "true", "--gen_len", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "gated LoRA loaded for inference" in err[0]
