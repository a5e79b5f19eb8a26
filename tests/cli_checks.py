"""Shared checks of the command line's bad-input contract: one `error:` line, the exit code, no traceback."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from conductor.cli import app


def run(*args: str) -> Any:
    """The command in-process (it must stop at its checks: nothing here starts a flow)."""
    return CliRunner().invoke(app, list(args))


def one_error(r: Any, *needles: str, code: int = 2) -> str:
    """Exactly one line, an `error:` line naming ``needles``, with exit ``code``, no traceback (``r``: a
    CliRunner result or a finished subprocess)."""
    out = r.stderr if hasattr(r, "returncode") else r.output
    rc = r.returncode if hasattr(r, "returncode") else r.exit_code
    lines = out.strip().splitlines()
    assert rc == code, (rc, out[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), out[-2000:]
    assert "Traceback" not in out
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
