"""`conductor grade FILE.jsonl`: grade responses line by line, one JSON verdict per input line.

Each input line is ``{"kind": "math"|"mcq"|"code"|"numeric"|"exact", "gold": ..., "response": "...",
"tests": ..., "entry_point": ..., "choices": [...]}``. A malformed line yields an error verdict naming
the line; it never stops the run, and output order follows input order.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from conductor.cli import app, fail, interrupted
from conductor.cli.run_options import build_config, config_options
from conductor.run.command_config import GradeConfig

MAX_TIMEOUT_S = 3600.0   # a bounded wait: one sandboxed run never blocks the command longer
_LINE_SEPARATORS = {c: f"\\u{c:04x}" for c in (0x0B, 0x0C, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}
_KIND_DOMAIN = {"math": "math", "numeric": "math", "mcq": "mcq", "code": "code", "exact": "free"}


def _verdict(correct: bool, extracted: str | None, error: str | None) -> str:
    text = json.dumps({"correct": correct, "extracted": extracted, "error": error}, ensure_ascii=False)
    # one verdict is one line for every reader: the separators str.splitlines() splits on stay escaped
    return text.translate(_LINE_SEPARATORS)


def grade_line(line: str, lineno: int, where: str, code_grader: Any = None) -> str:
    """One input line -> one output JSON line (never raises for bad input)."""
    from conductor.grading import as_question, get_grader

    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        return _verdict(False, None, f"{where}:{lineno}: invalid JSON ({exc.msg})")
    if not isinstance(obj, dict):
        return _verdict(False, None, f"{where}:{lineno}: expected a JSON object")
    kind = obj.get("kind")
    if kind not in _KIND_DOMAIN:
        return _verdict(False, None, f"{where}:{lineno}: field 'kind' must be one of {sorted(_KIND_DOMAIN)}, got {kind!r}")
    response = obj.get("response")
    if not isinstance(response, str):
        return _verdict(False, None, f"{where}:{lineno}: field 'response' must be a string")
    if kind == "code":
        if obj.get("tests") in (None, "", []):
            return _verdict(False, None, f"{where}:{lineno}: field 'tests' is required for kind 'code'")
    elif obj.get("gold") in (None, ""):
        return _verdict(False, None, f"{where}:{lineno}: field 'gold' is required for kind {kind!r}")
    try:
        question = as_question(obj, _KIND_DOMAIN[kind])
        grader = code_grader if kind == "code" and code_grader is not None else get_grader(kind)
        result = grader.grade(question, response)
    except Exception as exc:  # a grader bug must not lose the other lines
        return _verdict(False, None, f"{where}:{lineno}: {type(exc).__name__}: {exc}")
    error = f"{where}:{lineno}: {result.error}" if result.error else None
    return _verdict(result.correct, result.extracted, error)


@app.command("grade")
@config_options(GradeConfig)
def grade_cmd(
    ctx: typer.Context,
    file: str = typer.Argument(..., help="JSONL file of {kind, gold, response, tests, entry_point}; '-' for stdin"),
    **options: Any,
) -> None:
    """Grade model responses; print one {"correct", "extracted", "error"} JSON line per input line."""
    import math
    import os
    from concurrent.futures import ThreadPoolExecutor

    from conductor.grading.code import CodeGrader
    from conductor.sandbox import Limits

    c = build_config(GradeConfig, ctx, None, options)
    workers, timeout = c.workers, c.timeout
    if workers < 0:
        fail(f"--workers must be 0 (one per core) or more, got {workers}")
    if not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT_S:
        fail(f"--timeout must be a number of seconds > 0 and <= {MAX_TIMEOUT_S:.0f}, got {timeout}")
    from conductor.data.datasets import DatasetError, iter_lines
    from conductor.sandbox import kill_running

    code_grader = CodeGrader(limits=Limits(wall_s=timeout))
    where = "<stdin>" if file == "-" else file
    if file != "-" and not os.path.exists(file):
        fail(f"{file}: No such file or directory")
    try:   # split on \n only (U+2028 inside a JSON string is not a line end), streamed with the input caps
        numbered = [(i, ln) for i, ln in iter_lines(file) if ln.strip()]
    except DatasetError as exc:
        fail(str(exc))
    ex = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
    try:
        for out in ex.map(lambda p: grade_line(p[1], p[0], where, code_grader), numbered):
            typer.echo(out)
    except KeyboardInterrupt as e:   # Ctrl-C (or SIGTERM): stop now, killing the sandboxed programs in flight
        ex.shutdown(wait=False, cancel_futures=True)
        kill_running()
        interrupted(e)
    ex.shutdown(wait=True)
