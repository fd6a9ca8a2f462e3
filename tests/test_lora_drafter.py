"""LoRA drafter on the diffusion pathway (NLD §3.3): draft/verify layout, gradient isolation, verifier
invariance, peft save/load, end-to-end `workbench train lora`, resume and config errors."""
import json

import pytest
import torch
from peft import PeftModel

from workbench.cli import main as cli_main
from workbench.cli_args import parse_dataclass
from workbench.drafter.draft import draft_and_verify, left_pad_prefixes, pick_draft
from workbench.drafter.lora import add_lora, load_adapter, save_adapter
from workbench.drafter.losses import active_mask, get_loss
from workbench.drafter.train import LoraTrainConfig, train_lora
from workbench.speculative.adapter import verifier_mode

K = 4


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    from conftest import REPO

    monkeypatch.chdir(REPO)


def _prefixes(n=3, length=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    windows = torch.randint(0, 250, (n, length), generator=g)
    lengths = torch.tensor([length, 7, 5][:n])
    return windows, lengths


def _randomise_lora(model, seed=1):
    """peft initialises B = 0 (adapter = identity); give it a non-zero update."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def test_left_pad_prefixes():
    windows = torch.arange(12).view(2, 6)
    ids, valid = left_pad_prefixes(windows, torch.tensor([4, 2]), pad_id=99)
    assert ids.tolist() == [[0, 1, 2, 3], [99, 99, 6, 7]]
    assert valid.tolist() == [[True] * 4, [False, False, True, True]]


def test_pick_draft_greedy_and_sampled_rows():
    logits = torch.tensor([[[0.0, 5.0, 0.0]], [[0.0, 0.0, 5.0]]]).expand(2, 3, 3)
    g = torch.Generator().manual_seed(0)
    assert pick_draft(logits, torch.tensor([False, False]), 1.0, g).tolist() == [[1, 1, 1], [2, 2, 2]]
    flat = torch.zeros(2, 400, 3)                                   # uniform: sampling must vary
    out = pick_draft(flat, torch.tensor([True, False]), 1.0, g)
    assert len(set(out[0].tolist())) == 3 and set(out[1].tolist()) == {0}


def test_draft_layout_matches_plain_forwards_per_row(micro_model):
    """Batched, left-padded cycle == each row alone; verifier == plain causal forward over prefix + draft;
    draft == diffusion logits of [x_n, masks] over the cache of prefix[:-1]."""
    add_lora(micro_model, 4, 8)
    _randomise_lora(micro_model)
    windows, lengths = _prefixes()
    prefix, valid = left_pad_prefixes(windows, lengths, 0)
    cyc = draft_and_verify(micro_model, prefix, valid, K, grad=False)
    m = micro_model
    for i, n in enumerate(lengths.tolist()):
        row = windows[i, :n][None]
        with torch.no_grad():
            full = torch.cat([row, cyc.draft[i][None]], 1)
            with verifier_mode(m):
                ar = m.causal_logits(full)[:, n - 1:]
            torch.testing.assert_close(cyc.verifier_logits[i], ar[0], atol=1e-4, rtol=1e-4)
            cache = m.new_cache()
            with verifier_mode(m):
                m.extend(row[:, :-1], cache, torch.ones_like(row[:, :-1], dtype=torch.bool))
            block = torch.cat([row[:, -1:], torch.full((1, K), m.mask_token_id)], 1)
            d = m.diffusion_logits(block, cache, torch.ones(1, n + K, dtype=torch.bool))[:, 1:]
            torch.testing.assert_close(cyc.draft_logits[i], d[0], atol=1e-4, rtol=1e-4)


def test_gradients_reach_only_lora_weights(micro_model):
    add_lora(micro_model, 4, 8)
    _randomise_lora(micro_model)
    windows, lengths = _prefixes()
    prefix, valid = left_pad_prefixes(windows, lengths, 0)
    cyc = draft_and_verify(micro_model, prefix, valid, K, torch.tensor([True, False, True]), 1.0,
                           torch.Generator().manual_seed(0))
    active = active_mask(cyc.draft, cyc.verifier_logits)
    get_loss("lk_hybrid_ce")(cyc.draft_logits, cyc.verifier_logits[:, :-1], active, top_k=16).backward()
    lora = {n: p for n, p in micro_model.named_parameters() if "lora_" in n}
    base = {n: p for n, p in micro_model.named_parameters() if "lora_" not in n}
    assert lora and all(".o_proj." in n for n in lora)
    assert all(p.grad is None for p in base.values())
    assert all(p.grad is not None for p in lora.values())
    assert sum(p.grad.abs().sum().item() for p in lora.values()) > 0


def test_verifier_unchanged_by_training_and_drafter_changes(micro_model):
    add_lora(micro_model, 4, 8)
    windows, lengths = _prefixes()
    prefix, valid = left_pad_prefixes(windows, lengths, 0)
    before = draft_and_verify(micro_model, prefix, valid, K, grad=False)
    opt = torch.optim.AdamW([p for p in micro_model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(3):
        cyc = draft_and_verify(micro_model, prefix, valid, K, torch.ones(3, dtype=torch.bool), 1.0,
                               torch.Generator().manual_seed(step))
        loss = get_loss("lk_hybrid_ce")(cyc.draft_logits, cyc.verifier_logits[:, :-1],
                                        active_mask(cyc.draft, cyc.verifier_logits), top_k=16)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad(), verifier_mode(micro_model):
        full = torch.cat([prefix, before.draft], 1)
        cache = micro_model.new_cache()
        ar = micro_model.extend(full, cache, torch.cat([valid, torch.ones(3, K, dtype=torch.bool)], 1))
    torch.testing.assert_close(ar[:, -K - 1:], before.verifier_logits, atol=1e-5, rtol=1e-5)
    after = draft_and_verify(micro_model, prefix, valid, K, grad=False)
    assert (after.draft_logits - before.draft_logits).abs().max() > 1e-3


def test_adapter_save_load_roundtrip(micro_checkpoint, tmp_path):
    from workbench.model.io import load_checkpoint

    model, _, _ = load_checkpoint(micro_checkpoint)
    add_lora(model, 4, 8)
    _randomise_lora(model)
    windows, lengths = _prefixes()
    prefix, valid = left_pad_prefixes(windows, lengths, 0)
    ref = draft_and_verify(model, prefix, valid, K, grad=False)
    out = save_adapter(model, tmp_path / "adapter", {"loss": "kl"})
    assert json.loads((out / "drafter.json").read_text())["loss"] == "kl"
    assert not (tmp_path / "adapter.partial").exists()
    fresh, _, _ = load_checkpoint(micro_checkpoint)
    fresh.backbone = PeftModel.from_pretrained(fresh.backbone, out)
    got = draft_and_verify(fresh, prefix, valid, K, grad=False)
    torch.testing.assert_close(got.draft_logits, ref.draft_logits)
    torch.testing.assert_close(got.verifier_logits, ref.verifier_logits)
    other, _, _ = load_checkpoint(micro_checkpoint)                # the helper does the same
    load_adapter(other, out)
    torch.testing.assert_close(draft_and_verify(other, prefix, valid, K, grad=False).draft_logits, ref.draft_logits)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(other, tmp_path)


def _cfg(tmp_path, ckpt, corpus, name="run", **kw):
    argv = ["--config", "workbench/configs/lora_micro.yaml", "--init_from", str(ckpt), "--corpus", str(corpus),
            "--out_dir", str(tmp_path / name), "--progress_bar", "false"]
    for k, v in kw.items():
        argv += [f"--{k}", str(v)]
    return parse_dataclass("t", LoraTrainConfig, argv)


def test_train_lora_end_to_end(tmp_path, micro_checkpoint, small_corpus, capsys):
    code = cli_main(["train", "lora", "--config", "workbench/configs/lora_micro.yaml", "--init_from",
                     str(micro_checkpoint), "--corpus", str(small_corpus), "--out_dir", str(tmp_path / "run"),
                     "--progress_bar", "false"])
    assert code == 0
    run = tmp_path / "run"
    adapter = run / "adapter"
    assert (adapter / "adapter_config.json").exists() and (adapter / "adapter_model.safetensors").exists()
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 16 and set(cfg["target_modules"]) == {"o_proj"}
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["global_step"] == 6 and metrics["best_checkpoint"].startswith("best-")
    best = metrics["best_validation"]
    # τ counts the verifier's token too: accepted draft tokens + 1, and the kept checkpoint is that validation's
    assert metrics["best_val_tau_greedy"] == pytest.approx(best["val/accepted_greedy"] + 1)
    assert metrics["best_checkpoint"] == f"best-{best['step']}.ckpt"
    base = json.loads((run / "baseline.json").read_text())
    assert {"val/tau_greedy", "val/tau_expected", "val/alpha"} <= set(base)
    assert (run / "config.yaml").exists() and (run / "logs" / "version_0" / "metrics.csv").exists()
    # checkpoints hold the LoRA tensors only
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert state and all("lora_" in k for k in state)
    # a resume with another LoRA setup is refused before anything is written: one line, exit 2
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    for extra, needle in ((["--rank", "8"], "started with rank 4 (now 8)"),
                          (["--target_modules", "[q_proj]"], "started with target_modules ['o_proj'] (now ['q_proj'])")):
        capsys.readouterr()
        code = cli_main(["train", "lora", "--config", "workbench/configs/lora_micro.yaml", "--init_from",
                         str(micro_checkpoint), "--corpus", str(small_corpus), "--out_dir", str(run), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0], err
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before


def test_resume_equals_uninterrupted(tmp_path, micro_checkpoint, small_corpus):
    from conftest import stop_lightning_at

    train_lora(_cfg(tmp_path, micro_checkpoint, small_corpus, "a"))
    cfg_b = _cfg(tmp_path, micro_checkpoint, small_corpus, "b")
    with stop_lightning_at(3):
        train_lora(cfg_b)
    train_lora(cfg_b)
    sa = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt", weights_only=False)
    sb = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=False)
    assert sa["global_step"] == sb["global_step"] == 6
    for k in sa["state_dict"]:
        torch.testing.assert_close(sa["state_dict"][k], sb["state_dict"][k], atol=1e-6, rtol=1e-5, msg=k)
    ma = json.loads((tmp_path / "a" / "metrics.json").read_text())
    mb = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert [v["step"] for v in mb["validations"]] == [3, 6]         # history survives the resume
    for va, vb in zip(ma["validations"], mb["validations"]):
        assert va == pytest.approx(vb, rel=1e-5)
    assert ma["best_checkpoint"] == mb["best_checkpoint"]


def test_self_distill_source(tmp_path, micro_checkpoint, small_corpus, monkeypatch):
    cfg = _cfg(tmp_path, micro_checkpoint, small_corpus, data_source="self_distill", max_steps=2, val_every=2)
    train_lora(cfg)
    saved = torch.load(tmp_path / "run" / "self_distill.pt", weights_only=True)
    assert saved["windows"].shape == (4, 32)
    # a second run with the same settings reuses the cached continuations (no generation)
    import workbench.decoding.ar as ar

    monkeypatch.setattr(ar, "ar_decode", lambda *a, **k: pytest.fail("regenerated the cache"))
    train_lora(_cfg(tmp_path, micro_checkpoint, small_corpus, "run2", data_source="self_distill", max_steps=2,
                    val_every=2, distill_cache=str(tmp_path / "run" / "self_distill.pt")))


@pytest.mark.parametrize("args, needle", [
    (["--loss", "reverse_kl"], "valid: kl, tv, ce, lk_alpha, lk_hybrid, lk_hybrid_ce"),
    (["--rank", "0"], "rank must be positive"),
    (["--rank", "-4"], "rank must be positive"),
    (["--data_source", "web"], "valid: corpus, self_distill"),
])
def test_bad_config_one_line_error(tmp_path, micro_checkpoint, capsys, args, needle):
    out = tmp_path / "run"
    code = cli_main(["train", "lora", "--config", "workbench/configs/lora_micro.yaml", "--init_from",
                     str(micro_checkpoint), "--out_dir", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0] and "error" in err[0]
    assert not out.exists()


def test_missing_init_from_one_line_error(tmp_path, capsys):
    out = tmp_path / "run"
    code = cli_main(["train", "lora", "--config", "workbench/configs/lora_micro.yaml", "--init_from",
                     str(tmp_path / "nope"), "--out_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "does not exist" in err[0]
    assert not out.exists()


def test_training_cycle_matches_first_linear_ss_cycle(micro_model):
    """The training draft layout is the decoder's: greedy accepted + 1 == tokens emitted by the first
    cycle of linear self-speculation on the same prompts (with a non-trivial adapter)."""
    from workbench.speculative.linear import linear_self_speculation

    add_lora(micro_model, 4, 8)
    _randomise_lora(micro_model, seed=3)
    windows, lengths = _prefixes()
    prefix, valid = left_pad_prefixes(windows, lengths, 0)
    cyc = draft_and_verify(micro_model, prefix, valid, K, grad=False)
    from workbench.speculative import greedy_accept

    accepted = greedy_accept(cyc.draft, cyc.verifier_logits).accepted
    prompts = [windows[i, :n].tolist() for i, n in enumerate(lengths.tolist())]
    res = linear_self_speculation(micro_model, prompts, K + 1, draft_length=K)
    assert [row[0] for row in res.committed_per_step] == (accepted + 1).tolist()
    first = [res.step_tokens[i][0] for i in range(3)]
    assert first == [cyc.draft[i, :a].tolist() + [int(cyc.verifier_logits[i, a].argmax())]
                     for i, a in enumerate(accepted.tolist())]


def test_gain_table_relative_to_base():
    import pandas as pd

    from workbench.drafter.evaluate import gain_table

    s = pd.DataFrame([
        dict(drafter="ar", mode="real", method="ar_greedy", category="all", tau=float("nan"), tpf=1.0, tpf_real=1.0),
        dict(drafter="base", mode="real", method="linear_k8", category="all", tau=2.0, tpf=2.0, tpf_real=1.0),
        dict(drafter="lora", mode="real", method="linear_k8", category="all", tau=2.5, tpf=2.5, tpf_real=1.25),
        dict(drafter="lora", mode="free", method="linear_k8", category="all", tau=3.0, tpf=3.0, tpf_real=1.5),
    ])
    g = gain_table(s)
    assert list(g["drafter"]) == ["base", "lora", "lora"]
    assert g["tau_gain"].tolist()[:2] == [0.0, 0.25] and g["tpf_real_gain"].tolist()[1] == 0.25
    assert pd.isna(g["tau_gain"].tolist()[2])                     # no base row in free mode


def _eval_args(small_corpus):
    return ["--corpus", str(small_corpus), "--n_prompts", "3", "--prompt_len", "24", "--gen_len", "16",
            "--block_length", "8", "--draft_lengths", "[4]", "--progress_bar", "false", "--device", "cpu"]


def test_drafter_eval_cli_untrained_adapter_equals_base(tmp_path, micro_checkpoint, small_corpus, capsys):
    """peft's zero-initialised B makes an untrained adapter a no-op: every metric equals the base drafter's;
    greedy SS stays lossless (agreement with AR greedy = 1)."""
    import pandas as pd
    from workbench.model.io import load_checkpoint

    model, _, _ = load_checkpoint(micro_checkpoint)
    add_lora(model, 4, 8)
    save_adapter(model, tmp_path / "zero" / "adapter")
    out = tmp_path / "eval"
    code = cli_main(["drafter", "eval", "--model", str(micro_checkpoint), "--adapters",
                     f"[{tmp_path / 'zero' / 'adapter'}]", "--out_dir", str(out), *_eval_args(small_corpus)])
    assert code == 0, capsys.readouterr().err
    assert {"results.parquet", "summary.parquet", "gains.parquet", "report.md", "config.json"} <= \
        {p.name for p in out.iterdir()}
    g = pd.read_parquet(out / "gains.parquet")
    assert set(g["drafter"]) == {"base", "zero"} and set(g["mode"]) == {"real", "free"}
    allc = g[g["category"] == "all"]
    assert (allc["tau_gain"].abs() < 1e-12).all() and (allc["agree_ar"] == 1.0).all()
    res = pd.read_parquet(out / "results.parquet")
    assert (res.groupby("drafter")["tokens"].sum() > 0).all() and "ar" in set(res["drafter"])


def test_drafter_ablation_cli(tmp_path, micro_checkpoint, small_corpus, capsys):
    import pandas as pd

    out = tmp_path / "abl"
    code = cli_main(["drafter", "ablation", "--train_config", "workbench/configs/lora_micro.yaml", "--init_from",
                     str(micro_checkpoint), "--train_corpus", str(small_corpus), "--losses", "[lk_hybrid_ce, kl]",
                     "--max_steps", "2", "--modes", "[real]", "--out_dir", str(out),
                     *_eval_args(small_corpus)])
    assert code == 0, capsys.readouterr().err
    t = pd.read_parquet(out / "eval" / "ablation.parquet")
    assert t["drafter"].tolist() == ["base", "lk_hybrid_ce", "kl"]
    assert t["train_steps"].tolist()[1:] == [2, 2] and t["tau"].notna().all()
    assert (out / "eval" / "ablation.md").read_text().startswith("# LoRA drafter loss ablation")
    for v in ("lk_hybrid_ce", "kl"):
        assert json.loads((out / v / "adapter" / "drafter.json").read_text())["loss"] == v
    code = cli_main(["drafter", "ablation", "--losses", "[kl, nope]", "--out_dir", str(tmp_path / "x")])
    assert code == 2 and "valid: kl, tv" in capsys.readouterr().err


def test_train_lora_bf16_autocast_on_cpu(tmp_path, micro_checkpoint, small_corpus):
    adapter = train_lora(_cfg(tmp_path, micro_checkpoint, small_corpus, precision="bf16-mixed", max_steps=2,
                              val_every=2))
    metrics = json.loads((adapter.parent / "metrics.json").read_text())
    assert metrics["global_step"] == 2 and all(v == v for v in metrics["final"].values())    # no NaN


def test_validation_history_matches_logs_and_best_checkpoint(tmp_path, micro_checkpoint, small_corpus):
    import pandas as pd

    adapter = train_lora(_cfg(tmp_path, micro_checkpoint, small_corpus))
    metrics = json.loads((adapter.parent / "metrics.json").read_text())
    hist = metrics["validations"]
    assert [v["step"] for v in hist] == [3, 6]                     # fit validations only (no baseline)
    log = pd.read_csv(adapter.parent / "logs" / "version_0" / "metrics.csv").dropna(subset=["val/tau_greedy"])
    fit_log = log.iloc[1:]                                          # first row: the baseline validation
    for v, (_, row) in zip(hist, fit_log.iterrows()):
        for k in ("val/tau_greedy", "val/tau_expected", "val/alpha", "val/loss"):
            assert v[k] == pytest.approx(row[k], rel=1e-5), k
    best = max(hist, key=lambda v: v["val/tau_greedy"])
    assert metrics["best_validation"] == best
    assert metrics["best_val_tau_greedy"] == pytest.approx(best["val/tau_greedy"])
    assert metrics["best_checkpoint"] == f"best-{best['step']}.ckpt"
