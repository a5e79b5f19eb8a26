"""Served traffic into the lake: every request's trajectories (kind ``served``), in batches, off the request path.

``add`` only appends to a queue; a background thread writes a shard when ``batch`` rows are waiting or
``flush_s`` has passed, with the same ``write_shard`` every run uses (one Parquet file pair per shard, atomic),
so ``conductor query`` and the nightly flow read served rows like any others. Shard ids are unique per
process and flush, so replicas writing the same lake never replace each other's files.

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
from dataclasses import replace
from typing import TYPE_CHECKING

from conductor.data.served import redaction_mark
from conductor.workers.secrets import redact

if TYPE_CHECKING:
    from conductor.trajectory import Trajectory

log = logging.getLogger("conductor.serve.lake")


def scrub(t: Trajectory, store_text: bool) -> Trajectory:
    """The row as stored (a copy; the record served is untouched): keys redacted (worker replies already are,
    by the executor), the user's text replaced unless ``store_text``."""
    question = t.question
    if not store_text and question:
        mark = redaction_mark(question)
        rounds = [replace(r, prompt=r.prompt.replace(question.strip(), mark).replace(question, mark))
                  for r in t.rounds]
    else:
        mark = redact(question)
        rounds = [replace(r, prompt=redact(r.prompt)) for r in t.rounds]
    calls = [c if (sub := redact(c.subtask)) == c.subtask else replace(c, subtask=sub) for c in t.calls]
    return replace(t, question=mark, rounds=rounds, calls=calls)   # unchanged calls are shared, never mutated


class ServedWriter:
    """Queue of served trajectories and the thread that writes them. ``add`` is a list append under an
    uncontended lock (no thread wake-up per row): the thread sleeps until ``batch`` rows wait or ``flush_s``
    has passed."""

    def __init__(self, lake: str, *, batch: int = 256, flush_s: float = 5.0, store_text: bool = False):
        self.lake = lake
        self.batch = max(1, batch)
        self.flush_s = flush_s
        self.store_text = store_text
        self._pending: list[Trajectory] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._seq = 0
        self._prefix = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.rows_written = 0
        self.shards_written = 0
        self.errors = 0
        import conductor.lake.writer  # noqa: F401 - imported at start-up, not during the first flush under load

        self._thread = threading.Thread(target=self._run, name="served-lake-writer", daemon=True)
        self._thread.start()

    def add(self, trajs: list[Trajectory]) -> None:
        with self._lock:
            self._pending.extend(trajs)
            full = len(self._pending) >= self.batch
        if full:
            self._wake.set()

    def _take(self) -> list[Trajectory]:
        with self._lock:
            taken, self._pending = self._pending, []
        return taken

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            closing = self._closing
            rows = self._take()
            for i in range(0, len(rows), self.batch):
                self._write(rows[i:i + self.batch])
            if closing:
                return

    def _write(self, trajs: list[Trajectory]) -> None:
        from conductor.lake.writer import write_shard

        self._seq += 1
        shard = f"{self._prefix}-{self._seq:06d}"
        try:
            write_shard(self.lake, [scrub(t, self.store_text) for t in trajs], shard)
            self.rows_written += len(trajs)
            self.shards_written += 1
        except Exception as e:  # noqa: BLE001 - losing a batch of logs must never stop serving
            self.errors += 1
            log.error("served traffic: shard %s (%d rows) not written: %s", shard, len(trajs), redact(str(e)))

    def flush(self, timeout: float = 30.0) -> None:
        """Write what is queued now and wait for it (tests; shutdown uses ``close``)."""
        self.close(timeout)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="served-lake-writer", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
