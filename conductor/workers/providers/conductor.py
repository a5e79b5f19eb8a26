"""The conductor itself as a worker: a manifest worker ``provider: conductor``.

WHY a process-level registry: the live policy (vLLM engine, transformers model,
llama.cpp server) is created by the run, not by the manifest, so the manifest
can only name it. ``bind_conductor(backend)`` makes a ``PolicyBackend`` callable
as a worker; ``options: {binding: NAME}`` selects a binding other than
"default". The backend is synchronous, so calls run in a thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from conductor.workers.providers.base import Completion, Message, ProviderError, register_provider

if TYPE_CHECKING:
    from conductor.generation import GenerationParams, PolicyBackend
    from conductor.workers.pool import Worker

_lock = threading.Lock()
_BOUND: dict[str, tuple[PolicyBackend, GenerationParams | None]] = {}


def bind_conductor(backend: PolicyBackend, params: GenerationParams | None = None, name: str = "default") -> None:
    """Make ``backend`` the policy behind every ``provider: conductor`` worker with this binding."""
    with _lock:
        _BOUND[name] = (backend, params)


def unbind_conductor(name: str = "default") -> None:
    with _lock:
        _BOUND.pop(name, None)


def bound_conductor(name: str = "default") -> tuple[PolicyBackend, GenerationParams | None] | None:
    with _lock:
        return _BOUND.get(name)


def render_prompt(messages: list[Message]) -> str:
    """One user prompt from chat messages (backends apply their own chat template).

    >>> render_prompt([Message("user", "solve x")])
    'solve x'
    """
    if len(messages) == 1 and messages[0].role == "user":
        return messages[0].content
    return "\n\n".join(m.content if m.role == "user" else f"[{m.role}]\n{m.content}" for m in messages)


class ConductorWorker:
    def __init__(self, worker: Worker):
        self.worker = worker
        self.binding = str(worker.options.get("binding", "default"))

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        from conductor.generation import GenerationParams

        bound = bound_conductor(self.binding)
        if bound is None:
            raise ProviderError("permanent", f"worker {self.worker.name}: no live conductor bound as "
                                f"{self.binding!r} (call conductor.workers.providers.conductor.bind_conductor)")
        backend, params = bound
        s = self.worker.sampling
        params = params or GenerationParams(temperature=s.temperature, max_tokens=s.max_tokens,
                                            top_p=s.top_p or 1.0, logprobs=False)
        try:
            out = await asyncio.to_thread(backend.generate, [render_prompt(messages)], 1, params)
            g = out[0][0]
        except (IndexError, TypeError) as e:
            raise ProviderError("malformed", f"worker {self.worker.name}: policy returned no generation ({e})") from None
        except Exception as e:  # noqa: BLE001 - a backend crash is an infrastructure failure
            raise ProviderError("server", f"worker {self.worker.name}: policy backend failed: {type(e).__name__}: {e}") from None
        return Completion(g.text or "", len(g.prompt_token_ids or []), len(g.token_ids or []), g.finish_reason)

    async def aclose(self) -> None:
        return None


@register_provider("conductor")
def _conductor(worker: Worker) -> ConductorWorker:
    return ConductorWorker(worker)
