"""A live progress line for long runs: trajectories done, worker calls, cache hits and spend.

Prefect logs say what happened; this says how far along we are. It is fed by the
pipeline's per-trajectory callback, so it costs nothing on the worker-call path.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from conductor.trajectory import Trajectory


class RunProgress:
    def __init__(self, total: int, description: str = "answering", enabled: bool | None = None):
        self.calls = self.cache_hits = 0
        self.dollars = 0.0
        self.failed = 0
        self._lock = threading.Lock()
        enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("calls {task.fields[calls]} · cache hits {task.fields[hits]} · ${task.fields[dollars]:.4f}"
                       " · infra failures {task.fields[failed]}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True), disable=not enabled, transient=False)
        self._task = self._progress.add_task(description, total=total, calls=0, hits=0, dollars=0.0, failed=0)

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def skip(self, n: int) -> None:
        """Trajectories already in the lake from an earlier run."""
        self._progress.advance(self._task, n)

    def advance(self, n: int) -> None:
        """Trajectories done elsewhere (a shard finished on a Dask worker)."""
        self._progress.advance(self._task, n)

    def done(self, t: Trajectory) -> None:
        with self._lock:
            self.calls += sum(1 for c in t.calls if not c.cache_hit)
            self.cache_hits += t.n_cache_hits
            self.dollars += t.cost_usd
            self.failed += int(t.infra_failed)
            self._progress.update(self._task, advance=1, calls=self.calls, hits=self.cache_hits,
                                  dollars=self.dollars, failed=self.failed)
