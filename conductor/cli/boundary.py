"""The CLI boundary around a flow: whatever a flow raises reaches the terminal as one ``error:`` line.

Inputs are checked before Prefect starts (conductor/run/preflight.py), but a flow can still meet a mistake
only it can see, or a failing endpoint. Exit codes (docs/operations.md): 2 bad input, 3 infrastructure,
1 anything else, 130 interrupted. ``CONDUCTOR_DEBUG=1`` lets the traceback through. A watcher process
(conductor/local/watchdog.py) stops the servers the flow started if the command is killed outright.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import typer

from conductor.cli import fail, interrupted, stopped_by_signal


class _OneLineConsole(logging.Filter):
    """Prefect logs a failed run's traceback on the console; the terminal gets its first line only (the full
    traceback still goes to Prefect's own log store, scrubbed of keys). After Ctrl-C or SIGTERM, Prefect's
    console lines stop altogether (each cancelled task's "Failed", the flow's "Crashed"): the command's own
    ``error: interrupted`` line says what happened; the run's states are still in Prefect's store."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("prefect") and stopped_by_signal():
            return False
        failed = (record.exc_info and record.exc_info[0] is not None) or record.exc_text
        if failed and record.name.startswith("prefect"):
            record.exc_info, record.exc_text = None, None
        return True


def _console_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
            or type(h).__name__ == "PrefectConsoleHandler"]


@contextlib.contextmanager
def flow_errors() -> Iterator[None]:
    """Run a flow call; turn the project's errors into one line with the documented exit code."""
    from conductor.local.watchdog import watch_children
    from conductor.policy.openai_backend import EndpointError
    from conductor.run.preflight import first_line
    from conductor.workers.secrets import redact_prefect_logs

    watch_children()   # a `kill -9` of this command must not leave Prefect's server (or model servers) running
    debug = os.environ.get("CONDUCTOR_DEBUG") == "1"
    redact_prefect_logs()
    quiet = _OneLineConsole()
    handlers = [] if debug else _console_handlers()
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt as e:   # Ctrl-C: 130; SIGTERM: 143; one line either way
        interrupted(e)
    except Exception as e:  # noqa: BLE001 - the boundary: one line, never a traceback
        if debug:
            raise
        if isinstance(e, EndpointError):
            fail(first_line(e), 3)
        if isinstance(e, ValueError):   # the project's input errors (DatasetError, PoolError, ...) are ValueErrors
            fail(first_line(e), 2)
        if isinstance(e, OSError):
            fail(first_line(e), 1)
        fail(f"internal error: {type(e).__name__}: {first_line(e)} (CONDUCTOR_DEBUG=1 shows the traceback)", 1)
    finally:
        for h in handlers:
            h.removeFilter(quiet)
