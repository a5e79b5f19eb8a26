"""Record a menu of workflows once over a live pool, so that every call of every entry replays without a model.

WHY: on two CPU cores a workflow of the embedded pool takes tens of seconds; GRPO needs thousands of rollouts.
Every call is content-addressed in the response cache (``conductor.execution.cache``: worker settings, rendered
messages, sample index) with its measured seconds, so running each menu entry's workflow over a question set
ONCE fills a cache from which the same workflows replay in milliseconds (``--cache-mode replay``: a call that
was not recorded is an infrastructure failure, never a silent model call). A call that several entries share
(the direct answer inside a vote, a cascade and a review) renders the same messages, so it is recorded once.

The recording is resumable by construction: a question whose calls are all in the cache costs nothing, so a
restart walks the finished questions in milliseconds and goes on where it stopped. Questions are recorded one
after another, every entry for a question before the next question, so a partial recording is a complete
recording of a smaller question set. ``on_question`` gets a ``RecordProgress`` after each question (count,
new calls, seconds, ETA from the questions that needed new calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.execution.cache import ResponseCache
    from conductor.policy.menu import WorkflowMenu
    from conductor.workers.pool import Pool


@dataclass(frozen=True)
class RecordProgress:
    """Where a recording stands after one question."""

    done: int                   # questions finished (every entry ran, or failed)
    total: int
    question_id: str
    new_calls: int              # calls this question paid for (0: everything was already recorded)
    failures: int               # entries whose workflow failed on this question (retried by the next run)
    seconds: float              # wall time of this question
    elapsed_s: float
    paid_questions: int         # questions so far that needed new calls
    paid_seconds: float         # their wall time

    @property
    def eta_s(self) -> float:
        """Seconds left at the mean pace of the questions that needed new calls.

        >>> RecordProgress(2, 10, "q", 3, 0, 40.0, 80.0, 2, 80.0, ).eta_s
        320.0
        """
        if not self.paid_questions:
            return 0.0
        return (self.total - self.done) * self.paid_seconds / self.paid_questions

    def line(self) -> str:
        """One progress line.

        >>> RecordProgress(2, 10, "gsm8k-7", 3, 1, 40.0, 80.0, 2, 80.0).line()
        '[2/10] gsm8k-7: 3 new calls, 1 failed entry, 40.0 s; elapsed 1m20s, ETA 5m20s'
        """
        failed = f", {self.failures} failed entr{'y' if self.failures == 1 else 'ies'}" if self.failures else ""
        return (f"[{self.done}/{self.total}] {self.question_id}: {self.new_calls} new calls{failed}, "
                f"{self.seconds:.1f} s; elapsed {_hms(self.elapsed_s)}, ETA {_hms(self.eta_s)}")


def _hms(seconds: float) -> str:
    """``1h02m``, ``5m20s`` or ``7s``.

    >>> _hms(3725), _hms(320), _hms(7.4)
    ('1h02m', '5m20s', '7s')
    """
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


@dataclass
class RecordSummary:
    """What a recording run did."""

    questions: int = 0
    new_calls: int = 0
    cached_calls: int = 0
    failures: int = 0
    wall_s: float = 0.0
    failed: list[tuple[str, str, str]] = field(default_factory=list)   # (question id, entry spec, cause)

    def add(self, other: RecordSummary) -> None:
        """Count ``other`` (a later chunk of the same recording) in; the wall time is the caller's to set."""
        self.questions += other.questions
        self.new_calls += other.new_calls
        self.cached_calls += other.cached_calls
        self.failures += other.failures
        self.failed.extend(other.failed)

    def line(self) -> str:
        """The ``key=value`` line.

        >>> RecordSummary(2, 5, 1, 0, 3.14159).line()
        'questions=2 new_calls=5 cached_calls=1 failures=0 wall_s=3.1'
        """
        return (f"questions={self.questions} new_calls={self.new_calls} cached_calls={self.cached_calls} "
                f"failures={self.failures} wall_s={self.wall_s:.1f}")


def record_menu(questions: Sequence[Question], menu: WorkflowMenu, pool: Pool, cache: ResponseCache, *,
                on_question: Callable[[RecordProgress], None] | None = None) -> RecordSummary:
    """Run every entry of ``menu`` on every question over ``pool`` (the menu's pool with embedded URLs resolved),
    storing each call in ``cache`` (mode ``read_write``). Entries run one after another per question, so a call
    shared by two entries is paid by the first and read from the cache by the second."""
    from conductor.execution.executor import Executor
    from conductor.execution.loop import shared_loop
    from conductor.workers.providers.simulated import know_questions

    if cache.mode != "read_write":
        raise ValueError(f"recording needs a read_write response cache, not {cache.mode!r}")
    executor = Executor(cache=cache)
    summary = RecordSummary()
    start = time.perf_counter()
    paid_n, paid_s = 0, 0.0
    subpool = pool.full()
    know_questions(pool, questions)      # workers that answer from the gold (the simulated pool) are told it
    with shared_loop() as loop:
        try:
            for k, q in enumerate(questions, 1):
                t0 = time.perf_counter()
                calls_before = executor.stats["calls"]
                hits_before = executor.stats["cache_hits"]
                failures = 0
                for entry in menu.entries:
                    res = loop.run(executor.run_workflow(q.prompt, entry.workflow, subpool))
                    if res.failure is not None:
                        failures += 1
                        summary.failed.append((q.id, entry.spec, res.infra_cause or str(res.failure)))
                new = executor.stats["calls"] - calls_before
                seconds = time.perf_counter() - t0
                if new:
                    paid_n, paid_s = paid_n + 1, paid_s + seconds
                summary.questions += 1
                summary.new_calls += new
                summary.cached_calls += executor.stats["cache_hits"] - hits_before
                summary.failures += failures
                if on_question is not None:
                    on_question(RecordProgress(k, len(questions), q.id, new, failures, seconds,
                                               time.perf_counter() - start, paid_n, paid_s))
        finally:
            loop.run(executor.aclose())
    summary.wall_s = time.perf_counter() - start
    return summary
