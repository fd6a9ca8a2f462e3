"""Task accuracy next to speed: HumanEval problems, their prompts and the code extracted from a model's answer
(:mod:`.humaneval`), the sandbox that runs model-written programs (:mod:`.execution`), pass@k and AUP
(:mod:`.metrics`), and the runner that decodes a task with any registered decoder (:mod:`.run`).

The package sits between ``evaluation`` and ``decoding`` in the layers: ``evaluate``, ``leaderboard`` and
``sweep`` import it; it imports the decoders and the model layer only.
"""
