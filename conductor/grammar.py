"""A GBNF grammar for the conductor's output: constrained decoding for small, untrained conductors.

A 1.5B model prompted with few-shot examples often writes prose instead of the three lists, or lists of
unequal length. Decoding under this grammar makes every completion a well-formed workflow: a one-line plan
(optional), then ``model_id``, ``subtasks`` and ``access_list`` with the same number of entries, model numbers
inside the sub-pool, step 0 seeing nothing and later steps ``[]`` or ``["all"]`` (the paper's binary scheme).
The parser still validates everything.

Every policy backend honours it (``GenerationParams.grammar``): llama.cpp in process (its grammar sampler)
and its server (the request's ``grammar``), transformers (an llguidance logits processor) and vLLM
(structured outputs with ``grammar=``).

``subtasks=[...]`` replaces free-text subtasks by a fixed vocabulary: the conductor then chooses workers,
subtasks from the list, access lists and the workflow's length, and identical (worker, subtask, context)
calls repeat across samples, so a response cache answers them (the CPU learning benchmark).
"""

from __future__ import annotations

from collections.abc import Sequence


def _literal(text: str) -> str:
    """A GBNF string literal for ``text`` (quote, backslash and newline escaped).

    >>> _literal('say "hi"')
    '"say \\\\"hi\\\\""'
    """
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def workflow_grammar(n_workers: int, max_steps: int = 5, plan_chars: int = 240, subtask_chars: int = 400,
                     subtasks: Sequence[str] | None = None, min_steps: int = 1, tools: Sequence[int] = ()) -> str:
    """GBNF text for workflows of ``min_steps``..``max_steps`` steps over ``n_workers`` workers.

    ``plan_chars=0``: no plan line, the completion starts with ``model_id``. A plan may not start with "m": an
    untrained 1.5B otherwise writes ``model_id = [...]`` as its plan and a second, unrelated workflow after it. ``subtasks``: every subtask is
    one of these strings (no ``"``, backslash or newline in them: they are written as Python string literals).
    ``tools``: ordinals of non-LLM workers (the python tool). They are kept out of the first step (it sees
    nothing earlier, so a tool there has nothing to run) and out of the last (its response is the answer, in
    the format the question asks for, which a program's printout is not).

    >>> g = workflow_grammar(3, 2)
    >>> 'id ::= "0" | "1" | "2"' in g and "wf2 ::=" in g and "wf3" not in g
    True
    >>> print(workflow_grammar(2, 1, plan_chars=0, subtasks=["Solve it.", "Check it."]))
    root ::= (wf1)
    id ::= "0" | "1"
    st ::= "\\"Solve it.\\"" | "\\"Check it.\\""
    acc ::= "[]" | "[\\"all\\"]"
    wf1 ::= "model_id = [" id "]\\nsubtasks = [" st "]\\naccess_list = [" "[]" "]"
    <BLANKLINE>
    """
    if n_workers < 1 or max_steps < 1 or not 1 <= min_steps <= max_steps:
        raise ValueError("workflow_grammar: need at least one worker and 1 <= min_steps <= max_steps")
    ids = " | ".join(f'"{i}"' for i in range(n_workers)) if n_workers <= 10 else '[0-9] [0-9]?'
    wfs = "(" + " | ".join(f"wf{n}" for n in range(min_steps, max_steps + 1)) + ")"
    rules = ([f'root ::= plan "\\n" {wfs}', f"plan ::= [^\\nm] [^\\n]{{0,{plan_chars - 1}}}"] if plan_chars > 0 else
             [f"root ::= {wfs}"])
    rules.append(f"id ::= {ids}")
    firsts = [i for i in range(n_workers) if i not in tools]
    tool_rule = bool(tools and firsts and n_workers <= 10)
    if tool_rule:
        rules.append("lm ::= " + " | ".join(f'"{i}"' for i in firsts))
    if subtasks is not None:
        if not subtasks or any(not s or any(c in s for c in '"\\\n') for s in subtasks):
            raise ValueError("workflow_grammar: subtasks must be non-empty strings without '\"', '\\\\' or newlines")
        rules.append("st ::= " + " | ".join(_literal(f'"{s}"') for s in subtasks))
    else:
        rules.append(f"st ::= \"\\\"\" [^\"\\\\\\n]{{1,{subtask_chars}}} \"\\\"\"")
    rules.append('acc ::= "[]" | "[\\"all\\"]"')
    for n in range(min_steps, max_steps + 1):
        ids_n = ' ", " '.join(["lm" if tool_rule and (j == 0 or j == n - 1) else "id" for j in range(n)])
        sts_n = ' ", " '.join(["st"] * n)
        accs_n = ' ", " '.join(['"[]"'] + ["acc"] * (n - 1))
        rules.append(f'wf{n} ::= "model_id = [" {ids_n} "]\\nsubtasks = [" {sts_n} "]\\naccess_list = [" {accs_n} "]"')
    return "\n".join(rules) + "\n"
