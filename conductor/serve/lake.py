"""Served traffic into the lake: every request's trajectories (kind ``served``), in batches, off the request path.

``add`` only appends to a queue; a background thread writes a shard when ``batch`` rows are waiting or
``flush_s`` has passed, with the same ``write_shard`` every run uses (one Parquet file pair per shard, atomic),
so ``conductor query`` and the nightly flow read served rows like any others. Shard ids are unique per
process and flush, so replicas writing the same lake never replace each other's files.

A shard that fails to write is not dropped: its rows go back to the queue and the next flush tries again
(up to ``MAX_PENDING_SHARDS`` shards' worth; past that the oldest are counted as lost). ``failing`` is true
while the last write failed, and ``/health`` answers 503 with the error then (conductor/serve/app.py).

Privacy: unless the server runs with ``store_text``, the user's text is replaced by ``[REDACTED:<sha256 prefix>]``
in the question and in every conductor prompt (the hash still groups identical questions); subtasks, worker
replies and answers are kept (they may quote parts of it). API keys are scrubbed from everything (``conductor.workers.secrets.redact``) either way.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING

from conductor.data.served import redaction_mark
from conductor.records import replaced
from conductor.workers.secrets import redact

if TYPE_CHECKING:
    from conductor.trajectory import Trajectory

log = logging.getLogger("conductor.serve.lake")
MAX_PENDING_SHARDS = 8      # rows kept for a retry while the lake cannot be written, in shards of ``batch``


def scrub(t: Trajectory, store_text: bool) -> Trajectory:
    """The row as stored (a copy; the record served is untouched): keys redacted (worker replies already are,
    by the executor), the user's text replaced unless ``store_text``."""
    question = t.question
    if not store_text and question:
        mark = redaction_mark(question)
        rounds = [replaced(r, prompt=r.prompt.replace(question.strip(), mark).replace(question, mark)) for r in t.rounds]
    else:
        mark = redact(question)
        rounds = [replaced(r, prompt=redact(r.prompt)) for r in t.rounds]
    calls = [c if (sub := redact(c.subtask)) == c.subtask else replaced(c, subtask=sub) for c in t.calls]
    return replaced(t, question=mark, rounds=rounds, calls=calls)   # unchanged calls are shared, never mutated


class ServedWriter:
    """Queue of served trajectories and the thread that writes them. ``add`` is a list append under an
    uncontended lock (no thread wake-up per row): the thread sleeps until ``batch`` rows wait or ``flush_s``
    has passed."""

    def __init__(self, lake: str, *, batch: int, flush_s: float, store_text: bool = False):
        self.lake = lake
        self.batch = max(1, batch)
        self.flush_s = flush_s
        self.store_text = store_text
        self._pending: list[Trajectory] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._final = True              # close(): rows still failing are lost; flush(): they stay queued
        self._seq = 0
        self._prefix = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.rows_written = 0
        self.shards_written = 0
        self.errors = 0                 # shard writes that failed
        self.rows_lost = 0              # rows dropped after failed writes (the retry queue was full)
        self.last_error: str | None = None   # None while the last write succeeded
        import conductor.lake.writer  # noqa: F401 - imported at start-up, not during the first flush under load

        self._thread = threading.Thread(target=self._run, name="served-lake-writer", daemon=True)
        self._thread.start()

    def add(self, trajs: list[Trajectory]) -> None:
        with self._lock:
            self._pending.extend(trajs)
            full = len(self._pending) >= self.batch
        if full and not self.failing:       # while the lake fails, retries wait for the flush interval
            self._wake.set()

    def _take(self) -> list[Trajectory]:
        with self._lock:
            taken, self._pending = self._pending, []
        return taken

    @property
    def failing(self) -> bool:
        return self.last_error is not None

    @property
    def rows_pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _requeue(self, trajs: list[Trajectory]) -> None:
        """Failed rows go back in front of the queue, the newest ``MAX_PENDING_SHARDS * batch`` kept."""
        with self._lock:
            self._pending[:0] = trajs
            over = len(self._pending) - MAX_PENDING_SHARDS * self.batch
            if over > 0:
                del self._pending[:over]
                self.rows_lost += over

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            closing = self._closing
            rows = self._take()
            for i in range(0, len(rows), self.batch):
                self._write(rows[i:i + self.batch])
            if closing:
                left = self._take() if self._final else []
                if left:
                    self.rows_lost += len(left)
                    log.error("served traffic: %d rows could not be written to %s before shutdown: %s",
                              len(left), self.lake, self.last_error)
                return

    def _write(self, trajs: list[Trajectory]) -> None:
        from conductor.lake.writer import write_shard

        self._seq += 1
        shard = f"{self._prefix}-{self._seq:06d}"
        try:
            write_shard(self.lake, [scrub(t, self.store_text) for t in trajs], shard)
            self.rows_written += len(trajs)
            self.shards_written += 1
            self.last_error = None
        except Exception as e:  # noqa: BLE001 - a lake failing must never stop serving; it is retried and shown
            self.errors += 1
            self.last_error = redact(f"{type(e).__name__}: {e}")
            self._requeue(trajs)
            log.error("served traffic: shard %s (%d rows) not written, kept for a retry: %s", shard, len(trajs),
                      self.last_error)

    def flush(self, timeout: float = 30.0) -> None:
        """Write what is queued now and wait for it (tests; shutdown uses ``close``)."""
        self._final = False
        self.close(timeout)
        self._closing, self._final = False, True
        self._thread = threading.Thread(target=self._run, name="served-lake-writer", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        self._closing = True   # the thread writes what is queued, then ends
        self._wake.set()
        self._thread.join(timeout)
