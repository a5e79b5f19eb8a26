"""Greedy workers and the executor that lets one reply serve every sample of a greedy call.

WHY: GRPO samples a group of G workflows per question, and the executor keys each call by its sample index so
that sampled workers give each sample its own reply. A worker decoding at temperature 0 (or a program, such as
the ``python`` tool) gives the same reply whatever the index, so paying for it G times buys nothing: with
``ReuseExecutor`` a repeated (worker, messages) call at temperature 0 is one cache entry for the whole group,
for later iterations and for resumes. ``greedy_pool`` sets a manifest's language-model workers to
temperature 0, under a pool id of its own (their answers differ from the manifest's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conductor.execution.executor import Executor, QuestionState

if TYPE_CHECKING:
    from conductor.trajectory import CallRecord
    from conductor.workers.pool import Pool, Worker
    from conductor.workers.providers.base import Completion, Message


def is_greedy(worker: Worker) -> bool:
    """A worker whose reply does not depend on the sample index: a program, or a model at temperature 0.

    >>> from conductor.workers.pool import Worker
    >>> is_greedy(Worker(name="py", provider="python", model="python")), is_greedy(Worker(name="m", provider="openai", model="m"))
    (True, False)
    """
    return worker.provider == "python" or worker.sampling.temperature == 0


class ReuseExecutor(Executor):
    """The project's executor, with the sample index dropped from greedy calls (``is_greedy``): every sample of
    such a call gets the same reply, so one cache entry serves a whole GRPO group, later iterations and resumes."""

    async def call(self, worker: Worker, messages: list[Message], rec: CallRecord, *, sample_index: int = 0,
                   state: QuestionState | None = None) -> Completion:
        return await super().call(worker, messages, rec, sample_index=0 if is_greedy(worker) else sample_index,
                                  state=state)


def greedy_pool(pool: Pool) -> Pool:
    """``pool`` with every language-model worker at temperature 0 (programs as written), as pool ``<id>-t0``.

    >>> from conductor.workers.pool import Pool, Worker
    >>> p = greedy_pool(Pool(pool_id="p", workers=[Worker(name="m", provider="openai", model="m")]))
    >>> p.pool_id, p.workers[0].sampling.temperature
    ('p-t0', 0.0)
    """
    workers = tuple(w if w.provider == "python" else w.model_copy(update={"sampling": w.sampling.model_copy(
        update={"temperature": 0.0})}) for w in pool.workers)
    return pool.model_copy(update={"workers": workers, "pool_id": f"{pool.pool_id}-t0"})
