"""The conductor's own generations through the response cache, so a deterministic rerun re-reads them.

WHY: worker calls are cached by content, but a rerun of the same run (new output directory, a re-score,
a warm start) still paid for every conductor completion, the most expensive call of a question on a small
machine. Only reproducible sampling is cached: greedy decoding or a fixed seed, where the stored sample is
the one the same engine would draw again. Caching therefore means a rerun with the same seed gets the same
workflows, not fresh samples; change ``--seed`` (or use ``--cache`` elsewhere) for new ones. The key is the
checkpoint id, the prompt, every sampling parameter (grammar included) and the sample index; the value
keeps token ids and log-probs, so cached rows are as complete as fresh ones, and the seconds the generation took
(``Generation.seconds`` on a hit: a replayed run's conductor time is the recorded one). With the cache in ``replay``
mode a generation the cache lacks is an error (``ReplayMiss``), never a model call: a replay runs no model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conductor.generation import Generation, GenerationParams, PolicyBackend
from conductor.policy.openai_backend import EndpointError
from conductor.workers.providers.base import Completion

if TYPE_CHECKING:
    from conductor.execution.cache import ResponseCache

PROVIDER = "conductor-policy"   # the provider column of cached conductor generations


class ReplayMiss(EndpointError):
    """A conductor generation that a replay cache does not hold (one line naming the cache): infrastructure, like
    an endpoint that is down, so the shard loop records those questions as infra-failed and goes on."""

    def __init__(self, message: str):
        super().__init__("cache_miss", message)


def generation_key(checkpoint_id: str, prompt: str, params: GenerationParams, sample: int) -> str:
    """Content address of one conductor sample.

    >>> p = GenerationParams(temperature=0.0)
    >>> generation_key("c", "q", p, 0) == generation_key("c", "q", p, 0) != generation_key("c", "q", p, 1)
    True
    """
    settings = {k: v for k, v in dataclasses.asdict(params).items() if k != "n_workers"}   # the prompt says it
    body = {"checkpoint": checkpoint_id, "prompt": prompt, "params": settings, "sample": sample}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def reproducible(params: GenerationParams) -> bool:
    """Greedy or seeded: the only samples worth storing."""
    return params.temperature == 0 or params.seed is not None


@dataclass
class CachedPolicy:
    """Wraps any policy backend; generates only the (prompt, sample) pairs the cache does not hold."""

    inner: PolicyBackend
    cache: ResponseCache
    checkpoint_id: str
    hits: int = 0
    misses: int = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        if not reproducible(params):
            return self.inner.generate(prompts, n, params)
        keys = [[generation_key(self.checkpoint_id, p, params, i) for i in range(n)] for p in prompts]
        found = [[_decode(self.cache.lookup(k)) for k in row] for row in keys]
        todo = [j for j, row in enumerate(found) if any(g is None for g in row)]
        self.hits += sum(g is not None for row in found for g in row)
        if todo and self.cache.mode == "replay" and getattr(self.inner, "runs_a_model", True):
            raise ReplayMiss(f"{self.cache.path.name}: {len(todo)} conductor generation(s) of {self.checkpoint_id} "
                             "not recorded, and the cache is in replay mode (no model runs)")
        if todo:
            start = time.perf_counter()
            fresh = self.inner.generate([prompts[j] for j in todo], n, params)
            share = (time.perf_counter() - start) / max(1, len(todo) * n)
            for j, gens in zip(todo, fresh):
                for i, g in enumerate(gens):
                    if found[j][i] is None:
                        self.misses += 1
                        found[j][i] = g
                        self.cache.store(keys[j][i], PROVIDER, self.checkpoint_id,
                                         _encode(dataclasses.replace(g, seconds=share)))
        return [[g for g in row if g is not None] for row in found]

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def _encode(g: Generation) -> Completion:
    body = json.dumps(dataclasses.asdict(g), separators=(",", ":"))
    return Completion(body, len(g.prompt_token_ids or ()), len(g.token_ids or ()), g.finish_reason)


def _decode(c: Completion | None) -> Generation | None:
    if c is None:
        return None
    try:
        return Generation(**json.loads(c.text))
    except (ValueError, TypeError):   # a row that is not ours: treat as a miss
        return None
