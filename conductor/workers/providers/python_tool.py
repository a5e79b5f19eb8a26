"""A tool worker that RUNS Python: ``provider: python``.

WHY: small coder models write a correct program and then invent what it
prints. A worker that really runs the code and returns what it printed makes
a "write code, then run it" workflow possible, and it is free and exact.

What it runs, in order of preference:
1. code in its own subtask (a fenced block, or a subtask that is itself a program);
2. otherwise the last fenced ```python (or unlabeled) block among the earlier
   responses its access list shows, the latest response first; an unlabeled
   block must look like a program (a model's invented "Output:" block does not);
3. otherwise the latest visible response that is itself a bare program.
A final bare expression is printed, as in a notebook (``solve()`` shows its value).

The reply is what the program printed (trimmed, capped) plus a short stderr
tail when it failed, timed out or ran out of memory; usage is 0 tokens, so cost
is 0. Runs go through ``conductor.sandbox`` (no network, private file system,
rlimits) with the manifest's ``sandbox:`` limits; the executor caches replies
like any other call. A sandbox that cannot start is an infrastructure failure
(retryable); everything the program itself does is an answer.

Example manifest entry::

    - name: python
      provider: python
      model: cpython3
      limits: {max_concurrency: 2, timeout_s: 60, max_retries: 1}
      sandbox: {wall_s: 10, memory_mb: 512}
"""

from __future__ import annotations

import ast
import asyncio
import re
import threading
from typing import TYPE_CHECKING

from conductor.workers.providers.base import Completion, Message, ProviderError, register_provider

if TYPE_CHECKING:
    from conductor.sandbox import Limits, Sandbox, SandboxResult
    from conductor.workers.pool import SandboxSpec, Worker

SUBTASK_MARK = "Your assigned subtask:"
_FENCE_RE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_RESPONSE_RE = re.compile(r"<Agent (\d+) response>\n(.*?)\n</Agent \1 response>", re.DOTALL)
_PY_LANGS = ("python", "py", "python3")
_PROGRAM_NODES = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                  ast.Import, ast.ImportFrom, ast.For, ast.While, ast.If, ast.With, ast.Try)
NO_CODE = "No Python code to run: neither the subtask nor the responses shown to this step contain a program."
ERROR_TAIL_LINES = 6


def parses_as_program(text: str) -> bool:
    """True when ``text`` is Python that does something (not a bare number, name or sentence).

    >>> parses_as_program("x = 2\\nprint(x * 3)")
    True
    >>> parses_as_program("18")
    False
    >>> parses_as_program("The answer is 18.")
    False
    """
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, _PROGRAM_NODES):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return True
    return False


def code_in(text: str) -> str | None:
    """The program in one piece of text: the last ```python block, else the last unlabeled block that is a
    program, else the whole text if it is a program.

    >>> code_in("Plan:\\n```python\\nprint(6*7)\\n```\\nOutput:\\n```\\n41\\n```")
    'print(6*7)\\n'
    >>> code_in("x = 3\\nprint(x)")
    'x = 3\\nprint(x)'
    >>> code_in("Just prose.") is None
    True
    """
    blocks = _FENCE_RE.findall(text)
    labelled = [code for lang, code in blocks if lang.lower() in _PY_LANGS and code.strip()]
    if labelled:
        return labelled[-1]
    bare = [code for lang, code in blocks if not lang and parses_as_program(code)]
    if bare:
        return bare[-1]
    stripped = text.strip()
    return stripped if parses_as_program(stripped) else None


def split_worker_message(text: str) -> tuple[str, list[str]]:
    """(subtask, visible responses in order) from a rendered worker message (``prompts.worker_messages``)."""
    body, mark, subtask = text.rpartition(SUBTASK_MARK)
    if not mark:
        return text.strip(), []
    body = body.split("</overall_task>", 1)[-1]      # the question itself may hold code: never run it
    return subtask.strip(), [m.group(2) for m in _RESPONSE_RE.finditer(body)]


def shown_responses(messages: list[Message]) -> list[str]:
    """The earlier responses a tool step is shown, in order (the vote and agree tools read only these)."""
    users = [m.content for m in messages if m.role == "user"]
    return split_worker_message(users[-1])[1] if users else []


def find_code(messages: list[Message]) -> str | None:
    """The program this step should run (see the module docstring for the order)."""
    users = [m.content for m in messages if m.role == "user"]
    if not users:
        return None
    subtask, responses = split_worker_message(users[-1])
    code = code_in(subtask)
    if code is not None:
        return code
    for response in reversed(responses):
        blocks = _FENCE_RE.findall(response)
        if any(lang.lower() in _PY_LANGS or not lang for lang, _ in blocks):
            code = code_in(response)
            if code is not None:
                return code
    for response in reversed(responses):
        if parses_as_program(response.strip()):
            return response.strip()
    return None


def print_last_expression(code: str) -> str:
    """Print the value of a final bare expression (``solve()`` -> ``print(solve())``), as a notebook would.

    >>> print_last_expression("x = 2\\nx * 21")
    'x = 2\\nprint(x * 21)'
    >>> print_last_expression("print(1)")
    'print(1)'
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code      # let the interpreter report the syntax error itself
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    value = last.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        return code
    if isinstance(value, ast.Constant) and isinstance(value.value, str):   # a trailing docstring-like string
        return code
    lines = code.splitlines()
    start, end = last.lineno - 1, (last.end_lineno or last.lineno) - 1
    if last.col_offset != 0 or start != end:
        return code     # a one-line trailing expression only: rewriting anything else risks the program
    lines[start] = f"print({lines[start].rstrip().rstrip(';')})"
    return "\n".join(lines)


_WORKDIR_RE = re.compile(r'File "[^"]*/main\.py"')


def _tail(text: str, lines: int, chars: int) -> str:
    """The last lines of stderr, with the run's random work-dir path removed (replies must be reproducible)."""
    kept = "\n".join(_WORKDIR_RE.sub('File "main.py"', text).rstrip().splitlines()[-lines:])
    return kept[-chars:]


def _cap(text: str, chars: int) -> str:
    text = text.strip()
    if len(text) <= chars:
        return text
    half = chars // 2
    return f"{text[:half]}\n... [{len(text) - chars} characters cut] ...\n{text[-half:]}"


def format_result(r: SandboxResult, spec: SandboxSpec) -> str:
    """What the next step (or the grader) reads: printed output, then a short reason when the run failed."""
    out = _cap(r.stdout, spec.output_chars)
    parts = [out] if out else []
    if r.status == "ok":
        return out if out else "(the program ran and printed nothing)"
    if r.status == "timeout":
        parts.append(f"Error: the program was stopped after {spec.wall_s:g} s ({r.detail or 'time limit'}).")
    elif r.status == "memory":
        parts.append(f"Error: the program ran out of memory (limit {spec.memory_mb} MB).")
    elif r.status == "output_limit":
        parts.append("Error: the program wrote too much output and was stopped.")
    else:
        tail = _tail(r.stderr, ERROR_TAIL_LINES, 600)
        parts.append(f"Error (exit code {r.returncode}):\n{tail}" if tail else f"Error (exit code {r.returncode}).")
    return "\n".join(parts)


_SANDBOXES: dict[bool, Sandbox] = {}
_LOCK = threading.Lock()


def _sandbox(site_packages: bool) -> Sandbox:
    """The process-wide sandbox (one semaphore shared with the graders), or one that sees site-packages."""
    from conductor.sandbox import Sandbox, default_sandbox

    with _LOCK:
        if site_packages not in _SANDBOXES:
            _SANDBOXES[site_packages] = Sandbox(allow_site_packages=True) if site_packages else default_sandbox()
        return _SANDBOXES[site_packages]


class PythonTool:
    """Runs the step's program in the sandbox; deterministic given the messages (the executor caches it)."""

    def __init__(self, worker: Worker):
        from conductor.workers.pool import SandboxSpec

        self.worker = worker
        self.spec = worker.sandbox or SandboxSpec()

    def limits(self) -> Limits:
        from conductor.sandbox import Limits

        s = self.spec
        return Limits(wall_s=s.wall_s, cpu_s=s.cpu_s, memory_mb=s.memory_mb, output_chars=max(s.output_chars * 4, 4096))

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        code = find_code(messages)
        if code is None:
            return Completion(NO_CODE, 0, 0, "stop")
        program = print_last_expression(code)
        sandbox = _sandbox(self.spec.site_packages)
        result = await asyncio.to_thread(sandbox.run, program, limits=self.limits())
        if result.status == "infra":
            raise ProviderError("server", f"worker {self.worker.name}: the sandbox could not run the code: {result.detail}")
        return Completion(format_result(result, self.spec), 0, 0, "stop")

    async def aclose(self) -> None:
        return None


@register_provider("python")
def _factory(worker: Worker) -> PythonTool:
    return PythonTool(worker)
