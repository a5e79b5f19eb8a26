"""Which workers go through batch APIs, and how the wave scheduler waits, retries and falls back.

WHY a separate record: the same knobs come from the CLI (``--batch``, ``--batch-poll``), a flow parameter
and tests, and a worker's manifest flag (``batch: true|false``) overrides the run's choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

# Providers batched by ``--batch``; openai_compatible servers batch only with an explicit ``batch: true``
# (vLLM and llama.cpp have no Batch API endpoint).
DEFAULT_BATCH_PROVIDERS = ("openai", "anthropic", "google")


@dataclass(frozen=True)
class BatchSettings:
    enabled: bool = True          # batch every worker of DEFAULT_BATCH_PROVIDERS not marked ``batch: false``
    poll_s: float = 60.0          # seconds between polls of one batch (providers answer within 24 h)
    resubmits: int = 1            # times a failed, expired or cancelled request goes into a later batch
    sync_stragglers: bool = True  # after that, call it synchronously at list price (False: the call fails)
    sync_below: int = 0           # a wave with fewer batchable requests than this is called synchronously
    max_requests: int = 10_000    # per batch (OpenAI allows 50k, Anthropic 100k; Gemini inline ~20 MB)
    submit_attempts: int = 5      # tries to create one batch before its requests take the straggler lane
    settle_ticks: int = 16        # event-loop turns the wave must stay unchanged before it is submitted

    def __post_init__(self) -> None:
        if self.poll_s <= 0:
            raise ValueError(f"batch poll interval must be > 0 seconds, got {self.poll_s}")
        if self.resubmits < 0 or self.sync_below < 0 or self.max_requests < 1 or self.submit_attempts < 1:
            raise ValueError("batch settings: resubmits and sync_below >= 0, max_requests and submit_attempts >= 1")

    def batches(self, worker: Worker) -> bool:
        """Does this worker's call go through a batch API in this run?

        >>> from conductor.workers.pool import Worker
        >>> s = BatchSettings()
        >>> s.batches(Worker(name="a", provider="anthropic", model="m")), s.batches(Worker(name="l", provider="local", model="m", base_url="http://x"))
        (True, False)
        >>> BatchSettings(enabled=False).batches(Worker(name="o", provider="openai", model="m", batch=True))
        True
        """
        flag = getattr(worker, "batch", None)
        if flag is not None:
            return bool(flag)
        return self.enabled and worker.provider in DEFAULT_BATCH_PROVIDERS
