"""A GBNF grammar for the conductor's output: constrained decoding for small, untrained conductors.

A 1.5B model prompted with few-shot examples often writes prose instead of the three lists, or lists of
unequal length. Decoding under this grammar (llama.cpp's ``grammar``; vLLM's guided decoding accepts GBNF
too) makes every completion a well-formed workflow: a one-line plan, then ``model_id``, ``subtasks`` and
``access_list`` with the same number of entries, model numbers inside the sub-pool, step 0 seeing nothing
and later steps ``[]`` or ``["all"]`` (the paper's binary scheme). The parser still validates everything.
"""

from __future__ import annotations


def workflow_grammar(n_workers: int, max_steps: int = 5, plan_chars: int = 240, subtask_chars: int = 400) -> str:
    """GBNF text for workflows of 1..max_steps steps over ``n_workers`` workers.

    >>> g = workflow_grammar(3, 2)
    >>> 'id ::= "0" | "1" | "2"' in g and "wf2 ::=" in g and "wf3" not in g
    True
    """
    if n_workers < 1 or max_steps < 1:
        raise ValueError("workflow_grammar: need at least one worker and one step")
    ids = " | ".join(f'"{i}"' for i in range(n_workers)) if n_workers <= 10 else '[0-9] [0-9]?'
    rules = [
        "root ::= plan \"\\n\" (" + " | ".join(f"wf{n}" for n in range(1, max_steps + 1)) + ")",
        f"plan ::= [^\\n]{{1,{plan_chars}}}",
        f"id ::= {ids}",
        f"st ::= \"\\\"\" [^\"\\\\\\n]{{1,{subtask_chars}}} \"\\\"\"",
        'acc ::= "[]" | "[\\"all\\"]"',
    ]
    for n in range(1, max_steps + 1):
        ids_n = ' ", " '.join(["id"] * n)
        sts_n = ' ", " '.join(["st"] * n)
        accs_n = ' ", " '.join(['"[]"'] + ["acc"] * (n - 1))
        rules.append(f'wf{n} ::= "model_id = [" {ids_n} "]\\nsubtasks = [" {sts_n} "]\\naccess_list = [" {accs_n} "]"')
    return "\n".join(rules) + "\n"
