"""A policy backend built only when a generation is asked of it (a trained conductor behind ``CachedPolicy``).

WHY: behind ``CachedPolicy`` the workflows a trained conductor writes for held-out questions land in the response
cache, which is carried between machines; a checkpoint (0.5-1.6 GB) is not. Wrapped in ``LazyPolicy`` the
expensive build (training, or replaying training from the lake, 1.5-2 h on 2 cores) runs only when some prompt
is missing from the cache, so a fresh machine with the carried cache evaluates the trained arm without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from conductor.generation import Generation, GenerationParams, PolicyBackend


class LazyPolicy:
    """``build()`` on the first ``generate``; ``build_s`` is the seconds it took (0.0 while never built)."""

    def __init__(self, build: Callable[[], PolicyBackend], name: str = "transformers"):
        self._build = build
        self._policy: PolicyBackend | None = None
        self._name = name
        self.build_s = 0.0

    @property
    def name(self) -> str:
        return self._name

    @property
    def built(self) -> bool:
        return self._policy is not None

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        if self._policy is None:
            t0 = time.perf_counter()
            self._policy = self._build()
            self.build_s = time.perf_counter() - t0
        return self._policy.generate(prompts, n, params)

    def close(self) -> None:
        if self._policy is not None:
            self._policy.close()
