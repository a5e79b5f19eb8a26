"""A GBNF grammar for the conductor's output: constrained decoding for small, untrained conductors.

A 1.5B model prompted with few-shot examples often writes prose instead of the three lists, or lists of
unequal length. Decoding under this grammar makes every completion a well-formed workflow: a one-line plan
(optional), then ``model_id``, ``subtasks`` and ``access_list`` with the same number of entries, model numbers
inside the sub-pool, step 0 seeing nothing and later steps ``[]`` or ``["all"]`` (the paper's binary scheme).

The contract with the parser (``conductor.parser``) is exact: every text the grammar accepts parses to the
workflow it spells, subtasks character for character (``tests/test_grammar_contract.py`` checks it as a
property, with llguidance deciding acceptance). So a free-text subtask is held to what a Python string
literal between double quotes carries unchanged through the parser (``writable_subtask``): no ``"`` or
backslash, no control character but tab (a 1.5B on an H200 wrote NUL into a subtask, which no parser reads back
as a list), and no whitespace at either end (the parser strips it). The plan line likewise holds no control
character.

Every policy backend honours it (``GenerationParams.grammar``): llama.cpp in process (its grammar sampler)
and its server (the request's ``grammar``), transformers (llguidance masks, ``conductor.decoding.mask``) and
vLLM (structured outputs with ``grammar=``).

``subtasks=(...)`` replaces free-text subtasks by a fixed vocabulary: the conductor then chooses workers,
subtasks from the list, access lists and the workflow's length, and identical (worker, subtask, context)
calls repeat across samples, so a response cache answers them (the CPU learning benchmark).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conductor.workflow import DEFAULT_MAX_STEPS

# Control characters (Unicode category Cc) but tab, as GBNF class ranges (\n among them: the lists are lines).
_CONTROL = r"\x00-\x08\x0a-\x1f\x7f-\x9f"
# Whitespace (str.isspace) outside _CONTROL: never at either end of a subtask, which the parser strips.
_EDGE_SPACE = r"\x09\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def _literal(text: str) -> str:
    """A GBNF string literal for ``text`` (quote, backslash and newline escaped).

    >>> _literal('say "hi"')
    '"say \\\\"hi\\\\""'
    """
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _control(c: str) -> bool:
    """A control character (Unicode category Cc) other than tab."""
    return c != "\t" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)


def writable_plan(text: str, max_chars: int = 240) -> bool:
    """Whether the grammar lets a conductor write ``text`` as its plan line: 1..``max_chars`` characters, not
    starting with "m", no control character but tab.

    >>> [writable_plan(s) for s in ("Use two models.", "model_id = [0]", "a\\x00", 'say "x" \\\\ [')]
    [True, False, False, True]
    """
    return 0 < len(text) <= max_chars and text[0] != "m" and not any(_control(c) for c in text)


def writable_subtask(text: str, max_chars: int = 400) -> bool:
    """Whether the grammar lets a conductor write ``text`` as a free-text subtask (and so the parser reads it
    back unchanged): 1..``max_chars`` characters, no ``"`` or backslash, no control character but tab, no
    whitespace at either end.

    >>> [writable_subtask(s) for s in ("Check it.", "a\\tb", " a", "a\\x00b", 'say "x"', "a\\u2028b", "\\u2028")]
    [True, True, False, False, False, True, False]
    """
    return (0 < len(text) <= max_chars and text.strip() == text and '"' not in text and "\\" not in text
            and not any(_control(c) for c in text))


@dataclass(frozen=True)
class WorkflowGrammar:
    """Workflows of ``min_steps``..``max_steps`` steps over ``n_workers`` workers (the sub-pool the prompt lists).

    ``plan_chars=0``: no plan line, the completion starts with ``model_id``. A plan may not start with "m": an
    untrained 1.5B otherwise writes ``model_id = [...]`` as its plan and a second, unrelated workflow after it.
    ``subtasks``: every subtask is one of these strings (each ``writable_subtask``: they are written as Python
    string literals); None: free text of up to ``subtask_chars`` characters. ``tools``: ordinals of non-LLM
    workers (the python tool). They are kept out of the first step (it sees nothing earlier, so a tool there has
    nothing to run) and out of the last (its response is the answer, in the format the question asks for, which
    a program's printout is not).

    >>> g = WorkflowGrammar(3, 2).gbnf()
    >>> 'id ::= "0" | "1" | "2"' in g and "wf2 ::=" in g and "wf3" not in g
    True
    >>> print(WorkflowGrammar(2, 1, plan_chars=0, subtasks=("Solve it.", "Check it.")).gbnf())
    root ::= (wf1)
    id ::= "0" | "1"
    st ::= "\\"Solve it.\\"" | "\\"Check it.\\""
    acc ::= "[]" | "[\\"all\\"]"
    wf1 ::= "model_id = [" id "]\\nsubtasks = [" st "]\\naccess_list = [" "[]" "]"
    <BLANKLINE>
    """

    n_workers: int
    max_steps: int = DEFAULT_MAX_STEPS
    plan_chars: int = 240
    subtask_chars: int = 400
    subtasks: tuple[str, ...] | None = None
    min_steps: int = 1
    tools: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.n_workers < 1 or self.max_steps < 1 or not 1 <= self.min_steps <= self.max_steps:
            raise ValueError("workflow grammar: need at least one worker and 1 <= min_steps <= max_steps")
        if self.subtask_chars < 1 or self.plan_chars < 0:
            raise ValueError("workflow grammar: subtask_chars must be >= 1 and plan_chars >= 0")
        if self.subtasks is not None and (not self.subtasks or not all(
                writable_subtask(s, max_chars=10**6) for s in self.subtasks)):
            raise ValueError("workflow grammar: subtasks must be non-empty strings without '\"', '\\\\', "
                             "control characters or whitespace at either end")

    def gbnf(self) -> str:
        """The grammar's GBNF text (llama.cpp's dialect, which llguidance and vLLM read too)."""
        tool_rule = bool(self.tools and set(range(self.n_workers)) - set(self.tools))
        steps = range(self.min_steps, self.max_steps + 1)
        wfs = "(" + " | ".join(f"wf{n}" for n in steps) + ")"
        rules = [f'root ::= plan "\\n" {wfs}', self._plan_rule()] if self.plan_chars > 0 else [f"root ::= {wfs}"]
        # Every number spelled out: a digit pattern would admit workers outside the sub-pool and "05", which
        # is no Python literal.
        rules.append("id ::= " + " | ".join(f'"{i}"' for i in range(self.n_workers)))
        if tool_rule:
            rules.append("lm ::= " + " | ".join(f'"{i}"' for i in range(self.n_workers) if i not in self.tools))
        rules += self._subtask_rules()
        rules.append('acc ::= "[]" | "[\\"all\\"]"')
        for n in steps:
            ids_n = ' ", " '.join(["lm" if tool_rule and j in (0, n - 1) else "id" for j in range(n)])
            sts_n = ' ", " '.join(["st"] * n)
            accs_n = ' ", " '.join(['"[]"'] + ["acc"] * (n - 1))
            rules.append(f'wf{n} ::= "model_id = [" {ids_n} "]\\nsubtasks = [" {sts_n} "]\\naccess_list = [" {accs_n} "]"')
        return "\n".join(rules) + "\n"

    def _plan_rule(self) -> str:
        return f"plan ::= [^m{_CONTROL}] [^{_CONTROL}]{{0,{self.plan_chars - 1}}}"

    def _subtask_rules(self) -> list[str]:
        """``st``: a vocabulary entry, or free text between double quotes (``writable_subtask``)."""
        if self.subtasks is not None:
            return ["st ::= " + " | ".join(_literal(f'"{s}"') for s in self.subtasks)]
        edge, inner = f'[^"\\\\{_CONTROL}{_EDGE_SPACE}]', f'[^"\\\\{_CONTROL}]'
        body = "sc" if self.subtask_chars == 1 else f"sc (sm{{0,{self.subtask_chars - 2}}} sc)?"
        return [f'st ::= "\\"" {body} "\\""', f"sc ::= {edge}", f"sm ::= {inner}"]


def workflow_grammar(n_workers: int, max_steps: int = DEFAULT_MAX_STEPS, plan_chars: int = 240, subtask_chars: int = 400,
                     subtasks: Sequence[str] | None = None, min_steps: int = 1, tools: Sequence[int] = ()) -> str:
    """GBNF text of ``WorkflowGrammar`` (the form ``GenerationParams.grammar`` carries).

    >>> workflow_grammar(2, 1, plan_chars=0, subtasks=["Go."]).splitlines()[2]
    'st ::= "\\\\"Go.\\\\""'
    """
    return WorkflowGrammar(n_workers, max_steps, plan_chars, subtask_chars,
                           tuple(subtasks) if subtasks is not None else None, min_steps, tuple(tools)).gbnf()
