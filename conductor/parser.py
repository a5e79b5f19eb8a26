"""Parse a conductor completion into a ``Workflow`` or a precise ``ParseError``.

Real model output is sloppy: reasoning before the lists, ``<think>`` blocks,
code fences, ``:`` instead of ``=``, label variants, smart quotes, raw newlines
inside strings, ``"all"`` versus ``["all"]``, JSON instead of Python. The parser
accepts all of that, but never guesses: anything ambiguous is a ``ParseError``
naming the list and the reason, and no exception escapes to the caller.

>>> wf = parse_workflow('Plan first.\\nmodel_id = [1, 0]\\nsubtasks = ["Solve.", "Check."]\\naccess_list = [[], ["all"]]')
>>> wf.workers, wf.steps[1].access
((1, 0), 'all')
>>> parse_workflow("model_id = [0]\\nsubtasks = []\\naccess_list = [[]]").message
'workflow: lists have different lengths: model_id=1, subtasks=0, access_list=1'
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from conductor.workflow import ALL, DEFAULT_MAX_STEPS, Access, Workflow, WorkflowError

ListName = Literal["model_id", "subtasks", "access_list"]
LISTS: tuple[ListName, ...] = ("model_id", "subtasks", "access_list")


@dataclass(frozen=True)
class ParseError:
    """Why a completion is not a usable workflow (reward 0 in training)."""

    field: str      # model_id | subtasks | access_list | workflow | input
    reason: str
    status: Literal["parse_error", "invalid"] = "invalid"   # unreadable lists vs lists that break a rule

    @property
    def message(self) -> str:
        return f"{self.field}: {self.reason}"

    def __str__(self) -> str:
        return self.message

    def __bool__(self) -> bool:  # lets callers write `if not (wf := parse(...))`
        return False


# A label, optionally quoted/backticked/bolded, then '=' or ':' (or ':='), then '['.
_LABELS = {
    "model_id": r"model[ _\-]?ids?",
    "subtasks": r"sub[ _\-]?tasks?",
    "access_list": r"access(?:[ _\-]?lists?)?",
}
_LABEL_RE = re.compile(
    r"(?<![A-Za-z0-9_])[\"'`*]*(?P<label>" + "|".join(f"(?P<{k}>{v})" for k, v in _LABELS.items())
    + r")[\"'`*]*\s*(?::=|=|:)\s*(?=\[)",
    re.IGNORECASE,
)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_OPEN_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}
_MODEL_REF = re.compile(r"^\s*(?:model|agent|worker)?\s*#?\s*(\d+)\s*$", re.IGNORECASE)
_GRAMMAR_START = "model_id = ["      # how every workflow written under the grammar starts its lists


def parse_workflow(text: Any, n_workers: int | None = None, max_steps: int = DEFAULT_MAX_STEPS,
                   allow_empty: bool = False, access_mode: Literal["any", "binary"] = "any") -> Workflow | ParseError:
    """Parse and validate; returns a Workflow or a ParseError, never raises."""
    try:
        return _parse(text, n_workers, max_steps, allow_empty, access_mode)
    except WorkflowError as e:
        return ParseError(e.field, e.reason)
    except Exception as e:  # a parser bug must still not crash a training run
        return ParseError("input", f"unparseable ({type(e).__name__})", "parse_error")


def _parse(text: Any, n_workers: int | None, max_steps: int, allow_empty: bool, access_mode: str) -> Workflow | ParseError:
    if not isinstance(text, str):
        return ParseError("input", f"expected text, got {type(text).__name__}", "parse_error")
    best: tuple[int, ParseError] | None = None
    for candidate in _candidates(text):
        spans = find_lists(candidate)
        try:
            result = _from_spans(spans, n_workers, max_steps, allow_empty, access_mode)
        except WorkflowError as e:
            result = ParseError(e.field, e.reason)
        if isinstance(result, Workflow):
            return result
        if best is None or len(spans) > best[0]:
            best = (len(spans), result)
    assert best is not None
    return best[1]


def _from_spans(spans: dict[str, str], n_workers: int | None, max_steps: int, allow_empty: bool,
                access_mode: str) -> Workflow | ParseError:
    raw: dict[str, Any] = {}
    for name in LISTS:
        if name not in spans:
            return ParseError(name, f"no `{name} = [...]` list found", "parse_error")
        value = literal(spans[name])
        if isinstance(value, ParseError):
            return ParseError(name, value.reason, "parse_error")
        raw[name] = value
    ids = [_model_ref(i, v) for i, v in enumerate(raw["model_id"])]
    for r in ids:
        if isinstance(r, ParseError):
            return r
    subtasks = raw["subtasks"]
    for i, s in enumerate(subtasks):
        if not isinstance(s, str):
            return ParseError("subtasks", f"entry {i} is not a string: {_short(s)}")
    access_raw = raw["access_list"]
    if access_raw in ("all", ["all"]) and len(ids) != 1:
        return ParseError("access_list", "a single 'all' for several steps; give one entry per step")
    access = [_access(i, a, access_mode) for i, a in enumerate(access_raw)]
    for a in access:
        if isinstance(a, ParseError):
            return a
    wf = Workflow.from_lists(ids, [s.strip() for s in subtasks], access)  # type: ignore[arg-type]
    return wf.validate(n_workers=n_workers, max_steps=max_steps, allow_empty=allow_empty)


def _candidates(text: str) -> list[str]:
    """Where the lists may be, most likely first: the grammar's form, after the reasoning, without <think>
    blocks, the raw text.

    The grammar's form (``conductor.decoding.grammar``) ends a completion with the line ``model_id = [``...
    and the two lists after it, subtasks holding no newline: reading from the last such line keeps a plan
    line that quotes labels, brackets or ``</think>`` from being taken for lists. A subtask may itself
    mention ``<think>`` or ``</think>``, so stripping is only kept when what remains parses; otherwise the
    error of the candidate that held the most lists is reported.
    """
    out = []
    tail = text.rfind("\n" + _GRAMMAR_START)
    if tail >= 0 or text.startswith(_GRAMMAR_START):
        out.append(text[tail + 1:])
    low = text.lower()
    if "</think>" in low:
        out.append(text[low.rindex("</think>") + len("</think>"):])
        out.append(_THINK_RE.sub(" ", text))
    out.append(text)
    return out


def find_lists(text: str) -> dict[str, str]:
    """The last bracket-balanced ``[...]`` after each label, skipping labels quoted inside an earlier list."""
    found: dict[str, str] = {}
    pos = 0
    while (m := _LABEL_RE.search(text, pos)) is not None:
        name = next(k for k in _LABELS if m.group(k))
        start = m.end()
        end = _balanced_end(text, start)
        if end is None:
            pos = start + 1
            continue
        found[name] = text[start:end]
        pos = end
    return found


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the ']' closing text[start] == '[', honouring quotes and escapes."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c in _OPEN_QUOTES:
            close = _OPEN_QUOTES[c]
            triple = text.startswith(c * 3, i) and close == c
            end = _string_end(text, i + (3 if triple else 1), close * 3 if triple else close)
            if end is None:
                return None
            i = end
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _string_end(text: str, i: int, close: str) -> int | None:
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(close, i):
            return i + len(close)
        i += 1
    return None


def literal(span: str) -> Any:
    """Evaluate a list literal: Python, then JSON, then with smart quotes and raw newlines repaired."""
    attempts = [span]
    fixed = _escape_raw_controls(span)
    if "\u201c" in span or "\u2018" in span or "\u201d" in span:
        # smart quotes used as delimiters; an apostrophe (’) inside a '...' string cannot be told apart
        attempts += [_escape_raw_controls(_smart_delimiters(span))]
    attempts.insert(1, fixed)
    for candidate in attempts:
        for load in (ast.literal_eval, json.loads):
            try:
                value = load(candidate)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, json.JSONDecodeError):
                continue
            if isinstance(value, (list, tuple)):
                return list(value)
            return ParseError("", f"not a list: {_short(value)}")
    bare = _bare_tokens(span)
    if bare is not None:
        return bare
    return ParseError("", f"not a valid list literal: {_short(span)}")


def _smart_delimiters(span: str) -> str:
    """Turn “…” and ‘…’ used as string delimiters into plain quotes, escaping what they enclose."""
    out, i = [], 0
    while i < len(span):
        c = span[i]
        if c in ("\u201c", "\u2018", '"', "'"):
            close = _OPEN_QUOTES[c]
            alt = "\u201d" if c == '"' else ("\u2019" if c == "'" else close)
            j = i + 1
            while j < len(span) and span[j] not in (close, alt):
                j += 2 if span[j] == "\\" else 1
            inner = span[i + 1:j]
            out.append('"' + re.sub(r'(?<!\\)"', '\\\\"', inner) + '"')
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _escape_raw_controls(span: str) -> str:
    """Inside quoted strings, turn raw newlines, tabs and other control characters into escapes (models write
    multi-line subtasks; a Python literal holds no raw newline or NUL). A raw ``\\r`` is dropped (CRLF lines).

    >>> _escape_raw_controls('["a\\nb", "c\\x00d\\r"]')
    '["a\\\\nb", "c\\\\x00d"]'
    """
    out, i, quote = [], 0, None
    while i < len(span):
        c = span[i]
        if quote:
            if c == "\\" and i + 1 < len(span):
                out.append(span[i:i + 2])
                i += 2
                continue
            if c == quote:
                quote = None
            elif c in _CONTROL_ESCAPES:
                c = _CONTROL_ESCAPES[c]
            elif c < " " or c == "\x7f":
                c = f"\\x{ord(c):02x}"
        elif c in ('"', "'"):
            quote = c
        out.append(c)
        i += 1
    return "".join(out)


_CONTROL_ESCAPES = {"\n": "\\n", "\r": "", "\t": "\\t"}
_BARE_TOKEN = re.compile(r"^[\s\[\],]*$|^[\s\[\],0-9A-Za-z_]*$")


def _bare_tokens(span: str) -> list[Any] | None:
    """Unquoted lists such as ``[0, 2]`` or ``[[], [all]]``: only ints, 'all' and 'none' are accepted."""
    if not _BARE_TOKEN.match(span):
        return None
    quoted = re.sub(r"\b(all|none)\b", lambda m: f'"{m.group(1).lower()}"', span, flags=re.IGNORECASE)
    try:
        value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError):
        return None
    return list(value) if isinstance(value, (list, tuple)) else None


def _model_ref(i: int, v: Any) -> int | ParseError:
    if isinstance(v, bool):
        return ParseError("model_id", f"entry {i} is not an integer: {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return ParseError("model_id", f"entry {i} is a float ({v!r}), expected an integer")
    if isinstance(v, str) and (m := _MODEL_REF.match(v)):
        return int(m.group(1))
    return ParseError("model_id", f"entry {i} is not a model number: {_short(v)}")


def _access(i: int, a: Any, mode: str) -> Access | ParseError:
    if isinstance(a, str):
        token = a.strip().lower()
        if token == "all":
            return ALL
        if token in ("none", ""):
            return ()
        return ParseError("access_list", f"entry {i} is {a!r}; expected \"all\", [] or earlier step indices")
    if a is None:
        return ()
    if isinstance(a, (list, tuple)):
        items = list(a)
        if len(items) == 1 and isinstance(items[0], str) and items[0].strip().lower() == "all":
            return ALL
        if not items:
            return ()
        refs = []
        for ref in items:
            if isinstance(ref, bool) or not isinstance(ref, (int, str)):
                return ParseError("access_list", f"entry {i} contains {_short(ref)}; expected step indices")
            if isinstance(ref, str):
                if not ref.strip().isdigit():
                    return ParseError("access_list", f"entry {i} contains {ref!r}; \"all\" must stand alone")
                ref = int(ref.strip())
            refs.append(ref)
        if mode == "binary":
            return ParseError("access_list", f"entry {i} lists step indices; binary mode allows only \"all\" or []")
        return tuple(refs)
    return ParseError("access_list", f"entry {i} is {_short(a)}; expected \"all\", [] or earlier step indices")


def _short(v: Any, n: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def render(workflow: Workflow) -> str:
    """Canonical text form; ``parse_workflow(render(wf)) == wf`` for every valid workflow."""
    return workflow.render()


def render_json(workflow: Workflow) -> str:
    return json.dumps(workflow.to_json(), ensure_ascii=False)
