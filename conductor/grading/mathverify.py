"""math-verify behind a hard per-item deadline, safe to call from any thread.

math-verify's own timeouts use ``signal.alarm``, which only works on the main
thread, and sympy can hang on adversarial input. So every check runs in a small
pool of worker processes with math-verify's timeouts switched off
(``parsing_timeout=None``, ``timeout_seconds=None``); the parent enforces the
deadline and kills and replaces a worker that overruns it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from functools import lru_cache
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


def serve() -> None:
    """Worker loop: one JSON ``[gold, pred]`` per stdin line, one ``[equal, error]`` per stdout line."""
    import json
    import sys

    logging.disable(logging.WARNING)   # math-verify warns on every call with timeouts off
    out = sys.stdout
    equal_in_process("1", "1")         # import sympy/math-verify before the first deadline starts
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            gold, pred = json.loads(line)
            verdict: Verdict = (equal_in_process(gold, pred), None)
        except Exception as exc:  # a parse failure is an answer, not a crash
            verdict = (False, f"math-verify: {type(exc).__name__}: {exc}"[:300])
        out.write(json.dumps(verdict) + "\n")
        out.flush()


class _Proc:
    """One worker: a plain subprocess (not multiprocessing, so callers' scripts are never
    re-imported and need no ``if __name__ == "__main__"`` guard)."""

    def __init__(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = f"import sys; sys.path.insert(0, {root!r}); from conductor.grading.mathverify import serve; serve()"
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, bufsize=1)
        if proc.stdin is None or proc.stdout is None:      # never with PIPE; says so to the type checker
            raise RuntimeError("math-verify worker: no pipes")
        self.proc, self.stdin, self.stdout = proc, proc.stdin, proc.stdout
        self.job = -1                     # the index of the pair it grades (set whenever it is busy)
        self.started = 0.0
        self.ready = False

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the worker has imported math-verify (its start-up is not charged to a job)."""
        if self.ready:
            return
        r, _, _ = select.select([self.fileno()], [], [], timeout)
        line = self.stdout.readline() if r else ""
        if line.strip() != "ready":
            self.kill()
            raise RuntimeError("math-verify worker failed to start (is math-verify installed?)")
        self.ready = True

    def fileno(self) -> int:
        return self.stdout.fileno()

    def send(self, pair: tuple[str, str]) -> None:
        self.stdin.write(json.dumps(list(pair)) + "\n")
        self.stdin.flush()

    def recv(self) -> Verdict:
        line = self.stdout.readline()
        if not line:
            raise EOFError("math-verify worker exited")
        equal, err = json.loads(line)
        return equal, err

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for f in (self.stdin, self.stdout):
            try:
                f.close()
            except OSError:
                pass


class MathVerifyPool:
    """Worker processes running math-verify; ``check_many`` enforces ``timeout`` per item."""

    def __init__(self, workers: int | None = None, timeout: float = 5.0) -> None:
        self.workers = workers or max(1, os.cpu_count() or 1)
        self.timeout = timeout
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
                self._procs.append(_Proc())
            for w in self._procs:
                w.wait_ready()
            todo = deque(range(len(pairs)))
            busy: dict[int, _Proc] = {}
            idle = list(self._procs)
            while todo or busy:
                while todo and idle:
                    w = idle.pop()
                    i = todo.popleft()
                    try:
                        w.send(pairs[i])
                    except (OSError, ValueError):          # worker died between jobs: replace it, retry the item
                        self._replace(w)
                        todo.appendleft(i)
                        idle.append(self._procs[-1])
                        continue
                    w.job, w.started = i, time.monotonic()
                    busy[w.fileno()] = w
                now = time.monotonic()
                next_deadline = min(w.started + limit for w in busy.values())
                ready, _, _ = select.select(list(busy), [], [], max(0.0, next_deadline - now))
                for fd in ready:
                    w = busy.pop(fd)
                    try:
                        results[w.job] = w.recv()
                        idle.append(w)
                    except (EOFError, OSError):
                        results[w.job] = (None, "math-verify worker died")
                        idle.append(self._replace(w))
                now = time.monotonic()
                for fd, w in list(busy.items()):
                    if now - w.started >= limit:
                        busy.pop(fd)
                        results[w.job] = (None, f"math-verify timed out after {limit:g}s")
                        idle.append(self._replace(w))
        return [r if r is not None else (None, "not graded") for r in results]

    def _replace(self, w: _Proc) -> _Proc:
        w.kill()
        fresh = _Proc()
        fresh.wait_ready()
        self._procs[self._procs.index(w)] = fresh
        return fresh

    def close(self) -> None:
        with self._lock:
            for w in self._procs:
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
