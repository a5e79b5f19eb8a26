"""The batch adapter extension point: one class per provider API, registered by provider name.

An adapter turns calls into one provider batch and reads it back: ``submit`` returns the batch id,
``poll`` says whether it has ended and, once it has, each request's ``Outcome`` by custom id, ``cancel``
asks the provider to stop it. Request bodies are built from the same provider object the synchronous
path uses (its SDK client and its sampling parameters), so a batched call sends what a direct call sends.
A new provider is one module with ``@register_batch_adapter("name")`` on its class.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from conductor.workers.providers.base import Completion, Message

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

# Failure kinds of one request inside a batch; RETRY_KINDS go into a later batch (or the straggler lane).
RETRY_KINDS = frozenset({"expired", "cancelled", "missing", "server", "rate_limited", "timeout", "malformed"})


@dataclass(frozen=True)
class BatchCompletion(Completion):
    """A reply that came back in a batch: billed at batch prices, prompt-cache reads counted apart."""

    cached_input_tokens: int = 0


@dataclass(frozen=True)
class BatchRequest:
    custom_id: str            # the call's response-cache key: the same call has the same id in every run
    worker: Worker
    messages: list[Message]
    provider: Any             # the synchronous provider object of this worker (SDK client, parameters)


@dataclass(frozen=True)
class Outcome:
    """One request's result: a completion, or a failure ``kind`` (see RETRY_KINDS) with a message."""

    completion: BatchCompletion | None = None
    kind: str | None = None
    message: str = ""

    @property
    def retryable(self) -> bool:
        return self.kind in RETRY_KINDS

    @classmethod
    def failed(cls, kind: str, message: str) -> Outcome:
        return cls(None, kind, message)


@dataclass(frozen=True)
class Poll:
    ended: bool
    status: str                                            # the provider's own word for the batch state
    outcomes: dict[str, Outcome] = field(default_factory=dict)   # filled once ended


class BatchAdapter(Protocol):
    name: ClassVar[str]
    per_model: ClassVar[bool]     # the API takes one model per batch (OpenAI, Gemini) or many (Anthropic)

    def __init__(self, provider: Any) -> None: ...   # the worker's synchronous provider object (its SDK client)

    async def submit(self, requests: Sequence[BatchRequest]) -> str: ...

    async def poll(self, batch_id: str, custom_ids: Sequence[str]) -> Poll: ...

    async def cancel(self, batch_id: str) -> None: ...


AdapterFactory = Callable[[Any], BatchAdapter]     # built from a provider object (its SDK client)
_REGISTRY: dict[str, type[BatchAdapter]] = {}
_A = TypeVar("_A", bound="type[BatchAdapter]")
_MODULES = {"openai": "openai", "openai_compatible": "openai", "anthropic": "anthropic", "google": "google"}


def register_batch_adapter(*providers: str) -> Callable[[_A], _A]:
    """Class decorator: this adapter serves these manifest ``provider:`` values."""
    def deco(cls: _A) -> _A:
        for p in providers:
            _REGISTRY[p] = cls
        return cls
    return deco


def adapter_class(provider: str) -> type[BatchAdapter]:
    if provider not in _REGISTRY and provider in _MODULES:
        importlib.import_module(f"conductor.execution.batch.adapters.{_MODULES[provider]}")
    if provider not in _REGISTRY:
        raise KeyError(f"no batch adapter for provider {provider!r}")
    return _REGISTRY[provider]


def group_key(worker: Worker) -> str:
    """Calls that may share one batch: same API, endpoint and key variable (and model, where the API needs it).

    >>> from conductor.workers.pool import Worker
    >>> a = Worker(name="a", provider="anthropic", model="m1"); b = Worker(name="b", provider="anthropic", model="m2")
    >>> group_key(a) == group_key(b)
    True
    >>> group_key(Worker(name="o", provider="openai", model="m1")) == group_key(Worker(name="p", provider="openai", model="m2"))
    False
    """
    cls = adapter_class(worker.provider)
    parts: list[str] = [cls.name, worker.provider, worker.base_url or "", worker.api_key_env or ""]
    if cls.per_model:
        parts.append(worker.model)
    return json.dumps(parts)
