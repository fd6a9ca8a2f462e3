"""Trajectory collection: labels, final ids and policies on a hand-built model; live features."""
import numpy as np
import torch

from fake_model import FakeTriMode
from workbench.trajectories.collect import TrajectorySpec, collect_item
from workbench.trajectories.features import block_features, feature_spec, step_record
from workbench.trajectories.schema import row_array_specs


def _specs(n, b, truth=None):
    return [TrajectorySpec(i, 0, 0, (1, 2, 3), tuple(truth[i] if truth else [0] * b)) for i in range(n)]


def test_serial_labels_and_final_ids_hand_computed():
    # conf order: position 2 (0.9) > 0 (0.8) > 3 (0.7) > 1 (0.6): committed at steps 0, 1, 2, 3 resp.
    m = FakeTriMode([0.8, 0.6, 0.9, 0.7])
    rows, trajs = collect_item(m, _specs(1, 4), "serial", 0.9, 0, "fp32")
    # top-1 at position j and step s (s commits so far) is (j + s) % 7
    commit_step = {2: 0, 0: 1, 3: 2, 1: 3}
    final = [(j + commit_step[j]) % 7 for j in range(4)]
    assert trajs["final_ids"].tolist() == [final]
    assert rows["step"].tolist() == [0, 1, 2, 3]
    for s in range(4):
        top1 = [(j + s) % 7 for j in range(4)]
        assert rows["top_ids"][s, :, 0].tolist() == top1
        assert rows["label"][s].tolist() == [t == f for t, f in zip(top1, final)]
        assert rows["masked"][s].tolist() == [commit_step[j] >= s for j in range(4)]
    # at its commit step a position's label is always 1
    for j, s in commit_step.items():
        assert rows["label"][s, j]


def test_hybrid_commits_ground_truth_matches_first():
    m = FakeTriMode([0.5, 0.6, 0.9, 0.7])
    # at step 0 top-1 = [0, 1, 2, 3]; truth matches positions 0 and 1 (not the most confident, 2)
    rows, trajs = collect_item(m, _specs(1, 4, truth=[[0, 1, 5, 5]]), "hybrid", 0.9, 0, "fp32")
    assert rows["masked"][1].tolist() == [False, False, True, True]       # both matches committed at step 0
    assert trajs["final_ids"][0, :2].tolist() == [0, 1]
    # step 1: 2 committed → top-1 = [2, 3, 4, 5]; position 3 matches truth 5 → committed alone
    assert rows["masked"][2].tolist() == [False, False, True, False]
    assert trajs["final_ids"][0, 3] == 5
    # step 2: 3 committed → top-1 at position 2 is (2 + 3) % 7 = 5 == truth → committed as a match
    assert trajs["final_ids"][0, 2] == 5 and len(rows["step"]) == 3


def test_confidence_policy_rows_per_step():
    m = FakeTriMode([0.95, 0.6, 0.92, 0.3])
    rows, trajs = collect_item(m, _specs(2, 4), "confidence", 0.9, 0, "fp32")
    # step 0 commits 0 and 2 (≥ 0.9); then one per step (fallback) → 3 steps per trajectory
    assert rows["step"].tolist() == [0, 1, 2, 0, 1, 2]
    assert rows["traj"].tolist() == [0, 0, 0, 1, 1, 1]
    assert (rows["label"] == (rows["top_ids"][..., 0] == trajs["final_ids"][rows["traj"]])).all()


def test_live_features_equal_store_features():
    """Features from live probabilities equal features from the stored compact record."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(5, 8, 40) * 3, dim=-1)
    masked = torch.rand(5, 8) < 0.6
    step = torch.tensor([0, 1, 2, 3, 4])
    pca = np.random.default_rng(0).standard_normal((40, 44)).astype(np.float16)
    rec = step_record(probs, masked)
    live = block_features(rec["top_ids"], rec["top_probs"], rec["entropy"], rec["masked"], step, pca)
    # round trip through numpy with the store dtypes
    spec = row_array_specs(8)
    stored = {k: v.numpy().astype(spec[k][1]) for k, v in rec.items()}
    off = block_features(stored["top_ids"], stored["top_probs"], stored["entropy"], stored["masked"], step.numpy(), pca)
    assert live.shape == (5, 8, 144)
    assert torch.equal(live, off)
    # spot-check a few entries against their definition
    assert torch.equal(live[..., :44], torch.as_tensor(pca[rec["top_ids"][..., 0].long()]).float())
    assert torch.allclose(live[..., 135], (rec["top_probs"][..., 0].float() - rec["top_probs"][..., 1].float()))
    assert torch.equal(live[..., 143], masked.float())
    assert feature_spec(96)["pca_dim"] == 28


def test_stored_top1_keeps_every_threshold_decision():
    """The stored top-1 probability gives the decoder's own commit decision p ≥ τ for every τ, even within a
    float16 ulp of τ (issue 21 §5: the float16 of schema 1 flipped these)."""
    taus = torch.tensor([0.5, 0.7, 0.9, 0.95])
    eps = torch.tensor([-2e-4, -3e-5, 0.0, 3e-5, 2e-4])
    p1 = (taus[:, None] + eps[None, :]).reshape(-1)                        # top-1 probabilities around each τ
    probs = torch.stack([p1, (1 - p1) / 2, (1 - p1) / 2], dim=-1)[None]   # (1, 20, 3)
    rec = step_record(probs, torch.ones(1, p1.numel(), dtype=torch.bool))
    stored = rec["top_probs"].numpy().astype(row_array_specs(p1.numel())["top_probs"][1])[0, :, 0]
    live_top1 = probs[0, :, 0].float()
    for tau in taus.tolist():
        assert ((stored >= tau) == (live_top1 >= tau).numpy()).all(), tau
    # the control: float16 changes some of these decisions
    half = live_top1.half().float()
    assert any(((half >= t) != (live_top1 >= t)).any() for t in taus.tolist())


def test_prompt_chains_follow_contexts_and_the_model_context():
    from workbench.trajectories.collect import prompt_chains

    def spec(pid, k, ctx, truth):
        return TrajectorySpec(pid, 0, k, tuple(ctx), tuple(truth))

    specs = [spec(0, 2, [1, 2], [3, 4]), spec(0, 3, [1, 2, 3, 4], [5, 6]),        # an item starting mid-prompt
             spec(1, 0, [7], [8, 9]), spec(1, 1, [7, 8, 9], [1, 1]),
             spec(1, 2, [8, 9, 1, 1], [2, 2]),                                       # a slid window: no chain
             spec(2, 0, [5], [6, 6]), spec(3, 1, [5, 6, 6], [1, 2])]                 # another prompt: no chain
    assert prompt_chains(specs) == [[0, 1], [2, 3], [4], [5], [6]]


def test_shared_prefix_collection_equals_per_block_prefill(small_corpus):
    """Chained blocks decoded with one prefill and real blocks appended to the KV cache record the same
    trajectories as each block decoded from its own prefilled context (fp32, the shipped tiny model), on an item
    whose chains have different lengths (it starts and ends inside a prompt)."""
    from workbench.corpus import by_split, load_corpus
    from workbench.evaluation.prompts import make_prompts
    from workbench.model.load import load_model
    from workbench.trajectories.collect import build_specs, prompt_chains

    model, tok, _ = load_model("builtin:tiny", "cpu")
    b = 4
    prompts = make_prompts(by_split(load_corpus(str(small_corpus)), "train"), 4, 40, 3 * b)
    specs = build_specs(prompts, sorted({p.category for p in prompts}), b, 3, 40)[2:11]
    assert sorted(len(c) for c in prompt_chains(specs)) == [1, 2, 3, 3]
    for policy in ("serial", "confidence", "hybrid"):
        shared, s_trajs = collect_item(model, specs, policy, 0.5, tok.pad_token_id, "fp32")
        alone, a_trajs = collect_item(model, specs, policy, 0.5, tok.pad_token_id, "fp32", share_prefix=False)
        for k in ("traj", "step", "top_ids", "masked", "label"):
            assert np.array_equal(shared[k], alone[k]), (policy, k)
        np.testing.assert_allclose(shared["top_probs"], alone["top_probs"], atol=1e-4)
        for k, v in a_trajs.items():
            assert np.array_equal(s_trajs[k], v), (policy, k)
