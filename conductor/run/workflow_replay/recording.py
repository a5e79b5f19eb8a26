"""The ``record`` stage: every menu entry over the live embedded pool, then the untrained default conductor through
``conductor answer`` into the same cache, ``chunk`` questions at a time (each chunk starts and stops the servers).

Resumable by construction (``conductor.run.record``): a question whose calls are all in the cache costs nothing.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from conductor.run.record import RecordProgress, RecordSummary
from conductor.run.workflow_replay.questions import (
    DEFAULT_CONDUCTOR,
    LOCAL_POOL,
    MENU,
    default_cache,
    question_set,
    slice_spec,
)

if TYPE_CHECKING:
    from conductor.data.questions import Question

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class RecordSettings:
    """What a recording covers and where it goes (``bench/workflow_replay.py record``'s options)."""

    gsm8k: int = 300                       # GSM8K test questions (RouteLLM-recorded)
    mmlu: int = 100                        # MMLU-STEM questions
    limit: int = 0                         # > 0: only the first N questions of the merged order
    menu: tuple[str, ...] = MENU           # strategy specs
    pool: Path = LOCAL_POOL
    cache: Path = dataclasses.field(default_factory=default_cache)
    chunk: int = 10                        # questions per chunk (menu, then the default conductor)
    runs: Path = Path("runs/workflow-replay")   # where the default conductor's answer runs go
    shard: tuple[int, int] = (0, 1)        # (K, N): every N-th question from the K-th; N recorders share one cache
    reverse: bool = False                  # the shard from its last question: a second recorder meets the first


def shard_order(questions: Sequence[_T], shard: tuple[int, int], reverse: bool = False) -> list[_T]:
    """The questions one recorder takes, in its order: every N-th from the K-th (interleaved, so shards recording
    side by side keep the union near a prefix), from the last when ``reverse``.

    WHY reverse: when one shard finishes early, a second recorder on the slower shard, taken from its end, meets
    the first one in the middle; each skips what the other recorded (the cache is content-keyed), and the cache
    keeps the first reply written for a call (INSERT OR IGNORE), so a question both reached at once still replays
    as one consistent workflow.

    >>> shard_order(list(range(10)), (1, 2)), shard_order(list(range(10)), (1, 2), reverse=True)
    ([1, 3, 5, 7, 9], [9, 7, 5, 3, 1])
    """
    k, n = shard
    mine = list(questions[k::n])
    return mine[::-1] if reverse else mine


def record_default(questions: Sequence[Question], cache: Path, out: Path) -> int:
    """The untrained default conductor over ``questions`` through ``conductor answer`` (exactly as a user runs it),
    into the same cache: its generations and any call no menu entry made are recorded; the rest are hits."""
    cmd = [sys.executable, "-m", "conductor", "answer", slice_spec(questions), "--conductor", DEFAULT_CONDUCTOR,
           "--cache", str(cache), "--out", str(out), "--replace"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode not in (0, 4):
        print(f"  default conductor: exit {done.returncode}: {done.stdout.strip().splitlines()[-1:]}", flush=True)
    return done.returncode


def record(s: RecordSettings) -> RecordSummary:
    """Record the menu and the default over the question set, printing a progress line per question."""
    from conductor.execution.cache import ResponseCache
    from conductor.local.servers import EmbeddedServers, resolve_embedded
    from conductor.local.watchdog import watch_children
    from conductor.policy.menu import WorkflowMenu
    from conductor.run.record import record_menu
    from conductor.workers.pool import load_pool

    watch_children()    # a killed recording must not leave its model servers running
    questions = question_set(s.gsm8k, s.mmlu)
    if s.limit:
        questions = questions[:s.limit]
    questions = shard_order(questions, s.shard, s.reverse)
    menu = WorkflowMenu.parse(list(s.menu), load_pool(s.pool))
    cache_path = Path(s.cache)
    print(f"recording {len(menu)} menu entries and the default conductor over {len(questions)} questions "
          f"({sum(q.domain == 'math' for q in questions)} GSM8K, {sum(q.domain != 'math' for q in questions)} "
          f"MMLU-STEM) into {cache_path}, {s.chunk} questions at a time", flush=True)
    t0, total = time.perf_counter(), RecordSummary()
    for start in range(0, len(questions), s.chunk):
        chunk = questions[start:start + s.chunk]
        cache = ResponseCache(cache_path)
        try:
            with EmbeddedServers() as servers:
                live, _ = resolve_embedded(menu.pool, servers, lazy=True)

                def progress(p: RecordProgress, base: int = start) -> None:
                    print(dataclasses.replace(p, done=base + p.done, total=len(questions),
                                              elapsed_s=time.perf_counter() - t0).line(), flush=True)

                summary = record_menu(chunk, menu, live, cache, on_question=progress)
        finally:
            cache.close()
        for qid, spec, cause in summary.failed:
            print(f"  failed: {qid} {spec}: {cause}", flush=True)
        t1 = time.perf_counter()
        code = record_default(chunk, cache_path, Path(s.runs) / "default")
        print(f"  default conductor on questions {start + 1}-{start + len(chunk)}: {time.perf_counter() - t1:.0f} s "
              f"(exit {code})", flush=True)
        total.add(summary)
    total.questions, total.wall_s = len(questions), time.perf_counter() - t0
    return total
