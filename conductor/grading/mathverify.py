"""math-verify behind a hard per-item deadline, safe to call from any thread.

math-verify's own timeouts use ``signal.alarm``, which only works on the main
thread, and sympy can hang on adversarial input. So every check runs in a small
pool of worker processes with math-verify's timeouts switched off
(``parsing_timeout=None``, ``timeout_seconds=None``); the parent enforces the
deadline and kills and replaces a worker that overruns it.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from functools import lru_cache
from multiprocessing.connection import Connection, wait
from typing import Any

Verdict = tuple[bool | None, str | None]   # (equal, error)


# --------------------------------------------------------------------------- worker side


def _wrap(s: str) -> str:
    s = s.strip()
    return s if s.startswith("$") or "\\boxed" in s or s.startswith("\\[") else f"${s}$"


@lru_cache(maxsize=4096)
def _parse(text: str) -> Any:
    from math_verify import parse

    parsed = parse(_wrap(text), parsing_timeout=None)
    if not parsed:
        parsed = parse(text, parsing_timeout=None)
    return parsed


def equal_in_process(gold: str, pred: str) -> bool:
    """math-verify equivalence without any timeout: call only where a hang is acceptable
    (or inside a worker of this module)."""
    from math_verify import verify

    g, p = _parse(gold), _parse(pred)
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=None))


def _worker(conn: Connection) -> None:
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    for name in ("math_verify.grader", "math_verify.parser", "math_verify.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        gold, pred = job
        try:
            conn.send((equal_in_process(gold, pred), None))
        except Exception as exc:  # a parse failure is an answer, not a crash
            conn.send((False, f"math-verify: {type(exc).__name__}: {exc}"[:300]))


# --------------------------------------------------------------------------- parent side


class _Proc:
    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.job: int | None = None
        self.started = 0.0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class MathVerifyPool:
    """Worker processes running math-verify; ``check_many`` enforces ``timeout`` per item."""

    def __init__(self, workers: int | None = None, timeout: float = 5.0) -> None:
        self.workers = workers or max(1, os.cpu_count() or 1)
        self.timeout = timeout
        self._ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
        self._procs: list[_Proc] = []
        self._lock = threading.Lock()

    def check(self, gold: str, pred: str, timeout: float | None = None) -> Verdict:
        return self.check_many([(gold, pred)], timeout)[0]

    def check_many(self, pairs: Sequence[tuple[str, str]], timeout: float | None = None) -> list[Verdict]:
        limit = self.timeout if timeout is None else timeout
        results: list[Verdict | None] = [None] * len(pairs)
        with self._lock:
            want = min(self.workers, len(pairs))
            while len(self._procs) < want:
                self._procs.append(_Proc(self._ctx))
            todo = deque(range(len(pairs)))
            busy: dict[Connection, _Proc] = {}
            idle = list(self._procs)
            while todo or busy:
                while todo and idle:
                    w = idle.pop()
                    i = todo.popleft()
                    try:
                        w.conn.send(pairs[i])
                    except OSError:          # worker died between jobs: replace it, retry the item
                        self._replace(w)
                        todo.appendleft(i)
                        idle.append(self._procs[-1])
                        continue
                    w.job, w.started = i, time.monotonic()
                    busy[w.conn] = w
                now = time.monotonic()
                next_deadline = min(w.started + limit for w in busy.values())
                ready = wait(list(busy), timeout=max(0.0, next_deadline - now))
                for conn in ready:
                    w = busy.pop(conn)  # type: ignore[arg-type]
                    try:
                        results[w.job] = conn.recv()  # type: ignore[index, union-attr]
                        idle.append(w)
                    except (EOFError, OSError):
                        results[w.job] = (None, "math-verify worker died")  # type: ignore[index]
                        idle.append(self._replace(w))
                now = time.monotonic()
                for conn, w in list(busy.items()):
                    if now - w.started >= limit:
                        busy.pop(conn)
                        results[w.job] = (None, f"math-verify timed out after {limit:g}s")  # type: ignore[index]
                        idle.append(self._replace(w))
        return [r if r is not None else (None, "not graded") for r in results]

    def _replace(self, w: _Proc) -> _Proc:
        w.kill()
        fresh = _Proc(self._ctx)
        self._procs[self._procs.index(w)] = fresh
        return fresh

    def close(self) -> None:
        with self._lock:
            for w in self._procs:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
                w.proc.join(1)
                if w.proc.is_alive():
                    w.kill()
            self._procs.clear()


_POOL: MathVerifyPool | None = None
_POOL_LOCK = threading.Lock()


def default_pool() -> MathVerifyPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = MathVerifyPool()
            atexit.register(_POOL.close)
        return _POOL
