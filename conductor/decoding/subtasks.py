"""The subtask vocabulary a small conductor chooses from under a decoding contract (``conductor.decoding.contract``).

The default vocabulary (``DEFAULT_SUBTASKS``) is what the local learning benchmark trains over: the direct
subtask the single-worker baselines use (so those calls are shared through the response cache), a "reason,
then write a program" subtask whose program the python tool worker can run, and a "check the earlier work"
subtask. ``SUBTASK_LABELS`` names them for benches' command lines and printed workflow shapes.
"""

from __future__ import annotations

# The single-worker baselines' subtask (``conductor.policy.fixed``): one shared text, so their calls and the
# vocabulary's "direct" share the response cache.
DIRECT_SUBTASK = "Answer the user question. Follow its instructions on the answer format exactly."

# Reasoning first, then the program: on the local pool a program written without reasoning first was no better
# than the 1.5B answering alone, while the reasoned program run by the python worker was right more often
# (docs/default-conductor.md). "Prints only the final answer" because a two-step workflow ends on what it prints.
CODE_SUBTASK = ("Work out the solution step by step in a few short sentences. Then write a short Python program "
                "that follows your steps and prints only the final answer, in one python code block. "
                "Do not write its output.")
CHECK_SUBTASK = ("Check the earlier work step by step, fix any mistake, and give the final answer "
                 "in the format the question asks for.")
# Plain step-by-step work, then the answer: level with DIRECT_SUBTASK in both domains and below CHECK_SUBTASK on
# GSM8K training questions (docs/experiments/), so not in the default vocabulary.
REASON_SUBTASK = ("Solve the question step by step in a few short sentences, then give the final answer "
                  "in the format the question asks for.")
# The worker picks checked step-by-step work or a direct answer by the question's form, a choice the 135M conductor
# never learned to make per domain; it lifts the 1.5B alone above both "check" and "direct" on training questions
# (docs/experiments/2026-11-25-learning-local-pool.md).
ADAPT_SUBTASK = ("If the answer is a number to be calculated, work it out step by step, check each step and fix "
                 "any mistake. Otherwise answer directly. Either way, give the final answer in the format the "
                 "question asks for.")
# "adapt" for a worker shown earlier steps, told not to copy them: a 1.5B shown a 0.5B's wrong MMLU-STEM letter
# copies it. It did not stop the copying on validation questions, so it is kept for probes and is in no trained
# vocabulary (docs/experiments/2026-11-25-learning-local-pool.md).
OWN_SUBTASK = ("Earlier answers may be wrong: do not copy them, solve the question yourself. If the answer is a "
               "number to be calculated, work it out step by step and check each step. Otherwise answer directly. "
               "Either way, give the final answer in the format the question asks for.")
DEFAULT_SUBTASKS = (DIRECT_SUBTASK, CODE_SUBTASK, CHECK_SUBTASK)
# Short names for the vocabulary's subtasks, as benches print workflow shapes ("qwen2.5-coder-1.5b/check").
SUBTASK_LABELS = {"direct": DIRECT_SUBTASK, "code": CODE_SUBTASK, "check": CHECK_SUBTASK, "reason": REASON_SUBTASK,
                  "adapt": ADAPT_SUBTASK, "own": OWN_SUBTASK}
