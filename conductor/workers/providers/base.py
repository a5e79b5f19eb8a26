"""The provider extension point: one async method, typed errors.

A provider turns rendered messages plus a worker's sampling settings into text
and token usage, or raises ``ProviderError`` classified so the executor knows
whether to wait and retry (rate limits, 5xx, timeouts) or give up (auth, bad
request). Provider failures are infrastructure failures, never the conductor's.

Optionally a provider also streams: ``complete_stream(messages, sink)`` passes the reply's text to a
``TextSink`` as it is produced and returns the same Completion (``StreamingProvider``; the OpenAI-compatible,
Anthropic and Gemini providers have it). ``stream_completion`` is how callers ask for it: providers without it
(simulated, replay, tools) hand over their whole reply at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from conductor.trajectory import ErrorKind

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

RETRYABLE: frozenset[str] = frozenset({"rate_limited", "timeout", "server", "malformed"})


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class Completion:
    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None   # "stop", "length", ... (``SETTLED``: a gate accepted the answers it saw)
    # Seconds the real call took, when known: the response cache stores it and hands it back on a hit, so a
    # replayed call costs what the recorded one did (docs/workflow-replay.md).
    latency_s: float | None = None


# The finish reason of a gate step (``provider: agree``) that accepted the answers it was shown: the executor
# leaves out every later step that sees it, and its reply is the round's answer (conductor/execution/executor.py).
SETTLED = "settled"


class ProviderError(Exception):
    """A classified failure; ``str()`` never contains a secret."""

    def __init__(self, kind: ErrorKind, message: str, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


class Provider(Protocol):
    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        """One call with the worker's own sampling settings."""
        ...

    async def aclose(self) -> None:  # pragma: no cover - optional
        ...


class TextSink(Protocol):
    """Where a streamed reply's text goes as it is produced (the served answer, conductor/serve/stream.py).

    ``start`` opens an attempt: a retried call starts its reply over, so the sink forgets the failed
    attempt's text (what it already passed on is its own business). ``delta`` is a piece of text, in order."""

    def start(self) -> None: ...

    def delta(self, text: str) -> None: ...


class StreamingProvider(Provider, Protocol):
    async def complete_stream(self, messages: list[Message], sink: TextSink, *, sample_index: int = 0) -> Completion:
        """``complete``, with the reply's text passed to ``sink`` as it arrives; returns the same Completion
        (text, tokens, finish) the non-streamed call would."""
        ...


async def stream_completion(provider: Provider, messages: list[Message], sink: TextSink, *,
                            sample_index: int = 0) -> Completion:
    """One call whose text goes to ``sink`` as it is produced: through the provider's ``complete_stream``
    where it has one (SDKs that stream), else (the default) the whole reply at once when it arrives."""
    stream = getattr(provider, "complete_stream", None)
    if stream is not None:
        streamed: Completion = await stream(messages, sink, sample_index=sample_index)
        return streamed
    c = await provider.complete(messages, sample_index=sample_index)
    if c.text:
        sink.delta(c.text)
    return c


ProviderFactory = Callable[["Worker"], Provider]
_REGISTRY: dict[str, ProviderFactory] = {}


def register_provider(name: str) -> Callable[[ProviderFactory], ProviderFactory]:
    """Register a factory for a manifest ``provider:`` value."""
    def deco(factory: ProviderFactory) -> ProviderFactory:
        _REGISTRY[name] = factory
        return factory
    return deco


def provider_names() -> list[str]:
    return sorted(_REGISTRY)


def make_provider(worker: Worker) -> Provider:
    """Build the provider for a worker (importing its SDK only now)."""
    import importlib

    if worker.provider not in _REGISTRY:
        aliases = {"openai_compatible": "openai", "local": "openai", "python": "python_tool"}
        module = aliases.get(worker.provider, worker.provider)
        try:
            importlib.import_module(f"conductor.workers.providers.{module}")
        except ModuleNotFoundError as e:
            raise ProviderError("permanent", f"worker {worker.name}: provider {worker.provider!r} unavailable ({e.name} not installed)") from None
    if worker.provider not in _REGISTRY:
        raise ProviderError("permanent", f"worker {worker.name}: unknown provider {worker.provider!r}")
    return _REGISTRY[worker.provider](worker)
