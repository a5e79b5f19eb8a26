"""The `conductor` command line. Each command group lives in its own module and
registers itself on ``app``; heavy libraries are imported inside the commands."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import NoReturn


def _stop(signum: int) -> tuple[str, int]:
    """The one line and the exit status of a command stopped by ``signum`` (Ctrl-C or SIGTERM)."""
    return ("error: terminated (SIGTERM)", 143) if signum == signal.SIGTERM else ("error: interrupted", 130)


def _leave_during_startup(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM while the CLI's modules import (seconds; on a loaded machine much longer): nothing has
    started yet, so leave at once with the command's one line instead of a traceback from inside an import."""
    line, code = _stop(signum)
    os.write(2, line.encode() + b"\n")
    os._exit(code)


_STARTUP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_startup_handlers = ({s: signal.signal(s, _leave_during_startup) for s in _STARTUP_SIGNALS}
                     if threading.current_thread() is threading.main_thread() else {})

import typer  # noqa: E402

from conductor.resources import use_project  # noqa: E402

use_project()   # the commands run the Prefect project's flows (flows/, tasks/): importable from here on

app = typer.Typer(
    name="conductor",
    help="Train and run a conductor model that orchestrates a pool of LLM workers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is (like Ctrl-C) so it stops its work and prints one ``error:`` line."""


_signalled: list[int] = []     # the signals that stopped the command (Ctrl-C, SIGTERM), in order
_reported: list[str] = []      # the error lines printed; an interrupt that printed none gets one in ``main``


def stopped_by_signal() -> bool:
    """True once Ctrl-C or SIGTERM has reached the command (its consoles then stay quiet but for its line)."""
    return bool(_signalled)


def _on_signal(signum: int, frame: object) -> None:
    _signalled.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def interrupted(e: BaseException) -> NoReturn:
    """Ctrl-C (exit 130) or SIGTERM (exit 143) as one ``error:`` line."""
    if isinstance(e, Terminated):
        fail("terminated (SIGTERM); rerun the same command to resume", 143)
    fail("interrupted; rerun the same command to resume", 130)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one line starting 'error:' to stderr and exit non-zero."""
    typer.echo(f"error: {message}", err=True)
    _reported.append(message)
    raise typer.Exit(code)


# Command modules: one line each; the import registers the commands.
try:
    from conductor.cli import answer_cmd as _answer_cmd  # noqa: E402,F401
    from conductor.cli import compare_cmd as _compare_cmd  # noqa: E402,F401
    from conductor.cli import deploy_cmd as _deploy_cmd  # noqa: E402,F401
    from conductor.cli import exec_cmd as _exec_cmd  # noqa: E402,F401
    from conductor.cli import grade_cmd as _grade_cmd  # noqa: E402,F401
    from conductor.cli import headroom_cmd as _headroom_cmd  # noqa: E402,F401
    from conductor.cli import lake_cmd as _lake_cmd  # noqa: E402,F401
    from conductor.cli import learn_cmd as _learn_cmd  # noqa: E402,F401
    from conductor.cli import models_cmd as _models_cmd  # noqa: E402,F401
    from conductor.cli import parse_cmd as _parse_cmd  # noqa: E402,F401
    from conductor.cli import pool_cmd as _pool_cmd  # noqa: E402,F401
    from conductor.cli import prompt_cmd as _prompt_cmd  # noqa: E402,F401
    from conductor.cli import query_cmd as _query_cmd  # noqa: E402,F401
    from conductor.cli import record_cmd as _record_cmd  # noqa: E402,F401
    from conductor.cli import serve_cmd as _serve_cmd  # noqa: E402,F401
    from conductor.cli import train_cmd as _train_cmd  # noqa: E402,F401
finally:
    for _s, _h in _startup_handlers.items():    # imported (or failed to): signals are the caller's again
        signal.signal(_s, _h)


def main() -> None:
    # Prefect runs in ephemeral mode unless PREFECT_API_URL points at a server; on a busy 2-core machine its
    # temporary server needs longer than the default 20 s to come up. No analytics leave the machine.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # The temporary server is stopped (SIGTERM) when the command ends; a task-run event batch it was still
    # writing then fails and it logged "Error flushing N events" with a traceback after a successful run. What
    # matters to a run reaches it as a failed API call; the server's own log stays quiet.
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    from typer.exceptions import TyperException

    _signalled.clear()    # one command per process, except where tests call main() again
    _reported.clear()
    for s in _STARTUP_SIGNALS:
        signal.signal(s, _on_signal)
    try:   # usage mistakes (a missing argument, --shard-size 0, a typo'd option) are one line too, exit 2
        code = app(prog_name="conductor", standalone_mode=False)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        _reported.append("aborted")
        code = 130
    except Terminated:
        line, code = _stop(signal.SIGTERM)
        typer.echo(line, err=True)
        _reported.append(line)
    except TyperException as e:   # typer's own click: UsageError, BadParameter, NoArgsIsHelpError, ...
        if type(e).__name__ == "NoArgsIsHelpError":
            e.show()  # type: ignore[attr-defined]
        else:
            ctx = getattr(e, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            typer.echo(f"error: {e.format_message()}{hint}", err=True)
        code = getattr(e, "exit_code", 2)
    sys.exit(_after_signal(code if isinstance(code, int) else 0))


def _after_signal(code: int) -> int:
    """The exit status, and the one line, of a command a signal stopped outside the flow boundary (while it
    prepared its inputs, say): typer turns Ctrl-C and SIGTERM alike into a silent exit 130 there."""
    if not _signalled or _reported or code != 130:
        return code
    line, stopped = _stop(_signalled[0])
    typer.echo(line, err=True)
    return stopped


if __name__ == "__main__":  # pragma: no cover
    main()                  # exits with the command's status
