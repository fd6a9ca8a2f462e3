"""The real Qwen2.5-Coder-0.5B-Instruct (slow, and only where `workbench models fetch qwen2.5-coder-0.5b-instruct` has
put it in the cache: the tests never fetch its 491 MB). ``make test-all`` runs it on a machine that has it."""
import pytest
import torch

from workbench.model import named

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not named.is_cached("qwen2.5-coder-0.5b-instruct"),
                                 reason="qwen2.5-coder-0.5b-instruct is not in the cache (workbench models fetch ...)")]


@pytest.fixture(scope="module")
def coder():
    from workbench.model.load import load_model

    return load_model("qwen2.5-coder-0.5b-instruct", "cpu")


def test_the_checkpoint_is_the_untied_instruct_model(coder):
    model, tok, meta = coder
    bb = model.backbone
    assert meta["provenance"]["quantisation"] == "Q4_K_M"
    assert sum(p.numel() for p in bb.parameters()) == 630_167_424            # 494 M + its own 136 M output head
    assert not bb.config.tie_word_embeddings and not torch.equal(bb.lm_head.weight, bb.model.embed_tokens.weight)
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in (tok.chat_template or "")


def test_ar_greedy_on_a_humaneval_chat_prompt_equals_generate(coder):
    from workbench.tasks.run import TaskOptions, TaskPrompts, decode_task

    model, tok, _ = coder
    tp = TaskPrompts.build(TaskOptions(problems="HumanEval/2", confirmed=True), tok)
    got = decode_task(model, "ar_greedy", tp, 24, 1, tok.pad_token_id, precision="fp32").tokens[0]
    ref = model.backbone.generate(torch.tensor([tp.ids[0]]), max_new_tokens=24, do_sample=False,
                                  eos_token_id=sorted(tp.stop_ids), pad_token_id=tok.pad_token_id)
    assert got == ref[0, len(tp.ids[0]):].tolist()
