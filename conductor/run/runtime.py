"""The live side of a run: servers started, policy loaded, executor built, and all of it stopped again.

Flows open ``serving(pool, conductor=spec)`` once per run. Embedded workers
(``embedded://`` URLs) get llama.cpp servers on loopback; the embedded conductor
shares the 1.5B server instead of loading the model twice; a ``provider:
conductor`` worker is bound to the live policy (recursion as a worker).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from conductor.execution.executor import Executor
    from conductor.local.servers import EmbeddedServers
    from conductor.policy.base import PolicyBackend
    from conductor.workers.pool import Pool

EMBEDDED_CONDUCTOR_MODEL = "qwen2.5-coder-1.5b-instruct"


@dataclass
class Live:
    pool: Pool                 # embedded URLs resolved to the running servers
    manifest: Pool             # as written (cache keys and fingerprints come from this one)
    policy: PolicyBackend
    checkpoint_id: str
    _executors: dict[tuple[str | None, bool, str | None], Executor] = field(default_factory=dict)

    def executor(self, cache_path: str | None = None, replay: bool = False, limits: str | None = None) -> Executor:
        """The executor for this cache (built once): rate limits and an on-disk response cache (replay: never
        call a provider). ``limits``: where the rate limits live when processes share a quota
        (``sqlite:PATH``, ``prefect``; None/``local``: this process; conductor/execution/shared_limits.py)."""
        from conductor.execution.cache import ResponseCache
        from conductor.execution.executor import Executor
        from conductor.execution.ratelimit import RateLimiter
        from conductor.execution.shared_limits import open_shared

        key = (cache_path, replay, limits)
        if key not in self._executors:
            cache = ResponseCache(cache_path, mode="replay" if replay else "read_write") if cache_path else None
            self._executors[key] = Executor(cache=cache, limiter=RateLimiter(shared=open_shared(limits)))
        return self._executors[key]


    def cached_policy(self, executor: Executor) -> PolicyBackend:
        """The conductor with its reproducible (greedy or seeded) generations cached in the executor's
        response cache, so a deterministic rerun re-reads its workflows (conductor/policy/cached.py)."""
        if executor.cache is None:
            return self.policy
        from conductor.policy.cached import CachedPolicy

        return CachedPolicy(self.policy, executor.cache, self.checkpoint_id)


def registry_uri() -> str:
    """Where the checkpoint registry lives: $CONDUCTOR_REGISTRY, else under $CONDUCTOR_HOME."""
    from conductor.local.embedded import conductor_home

    return os.environ.get("CONDUCTOR_REGISTRY") or str(conductor_home() / "registry")


def conductor_policy(spec: str, embedded_url: Any = None, pool: Pool | None = None) -> tuple[PolicyBackend, str]:
    """(policy, checkpoint id) for a conductor spec.

    ``auto`` is the registry's champion when one has been promoted, else ``embedded`` (the 1.5B model,
    few-shot prompted, talking to the embedded server so the model is loaded once). ``champion[@URI]``
    requires a champion. The baseline strategies (``fixed:i``, ``sc:i:k``, ``moa:...``, ``random``;
    conductor.policy.strategies) write their workflows without a model and need the ``pool``.
    """
    from conductor.policy.strategies import is_strategy

    if is_strategy(spec):
        from conductor.policy.strategies import StrategyError, make_strategy, strategy_pool

        if pool is None:
            raise StrategyError(f"strategy {spec!r}: needs the pool it runs over")
        return make_strategy(spec, strategy_pool(spec, pool)), spec
    from conductor.policy import make_policy

    if spec == "auto" or spec.startswith("champion"):
        from conductor.learning.registry import RegistryError

        uri, entry = _champion(spec)
        if entry is not None:
            return make_policy(f"transformers:{entry.uri}"), entry.checkpoint_id
        if spec != "auto":
            raise RegistryError(f"registry {uri}: no champion has been promoted yet")
        spec = "embedded"
    if spec == "embedded" and embedded_url is not None:   # an embedded llama.cpp server, started on first use
        url = embedded_url(EMBEDDED_CONDUCTOR_MODEL)
        policy = StartOnUse(make_policy(f"openai:{EMBEDDED_CONDUCTOR_MODEL}@{url}"), url)
        return policy, f"embedded:{EMBEDDED_CONDUCTOR_MODEL}"
    return make_policy(spec), spec


def conductor_server_url(servers: EmbeddedServers, model: str) -> str:
    """Start (once) the embedded conductor's own llama.cpp server and return its URL.

    WHY its own: llama.cpp keeps the KV cache of the previous prompt and re-reads only what differs. The
    conductor's prompts share ~900 tokens of instructions and examples (question last), so consecutive
    conductor calls prefill only the question, unless a worker prompt ran on the same server in between,
    which is what sharing the 1.5B worker's server did. It gets the threads of a worker server (all cores but
    one), not every core: it writes shard k+1's workflows while the workers execute shard k
    (conductor/run/overlap.py), and two servers spinning on more threads than cores slow each other down
    several-fold. Costs one more copy of the model in memory (~1.1 GB for the 1.5B).

    The informed prompt puts the question's domain's examples first, so each domain has its own prefix: the
    first question of a shard whose domain differs from the previous shard's re-reads the examples (~700
    tokens). llama-cpp-python's RAM prompt cache (``--cache``) would keep both prefixes, but each saved state
    also copies the 512 x vocabulary logits buffer (~310 MB for Qwen2.5) that its size limit does not count:
    measured here, the server grew to 8.3 GB within 5 questions. So no ``--cache``.
    """
    from conductor.local.embedded import spec_for
    from conductor.local.process import ServerSettings, default_threads

    settings = ServerSettings(n_ctx=spec_for(model).n_ctx, n_threads=default_threads())
    return servers.reserve(model, alias=f"conductor-{model}", settings=settings)


@dataclass
class StartOnUse:
    """A policy whose server is reserved, not started: it starts before the first generation, so a rerun
    whose conductor generations all come from the cache never loads the model."""

    inner: PolicyBackend
    base_url: str
    # llama.cpp's server generates one prompt at a time: a question's workflow can execute while the next is
    # written (conductor/run/overlap.py)
    generation_batch: ClassVar[int] = 1

    @property
    def name(self) -> str:
        return self.inner.name

    def generate(self, prompts: list[str], n: int, params: Any) -> Any:
        from conductor.local.servers import ensure_started

        ensure_started(self.base_url)
        return self.inner.generate(prompts, n, params)

    def close(self) -> None:
        _close(self.inner)


def checkpoint_of(spec: str) -> str:
    """The checkpoint a conductor spec stands for right now, without loading anything (run ids use it)."""
    if spec == "auto" or spec.startswith("champion"):
        _, entry = _champion(spec)
        if entry is not None:
            return entry.checkpoint_id
        return f"embedded:{EMBEDDED_CONDUCTOR_MODEL}" if spec == "auto" else spec
    return f"embedded:{EMBEDDED_CONDUCTOR_MODEL}" if spec == "embedded" else spec


def _champion(spec: str) -> tuple[str, Any]:
    """(registry URI, champion entry or None) for ``auto`` / ``champion[@URI]``; a missing registry has none."""
    import fsspec

    from conductor.learning.registry import Registry

    uri = spec.partition("@")[2] or registry_uri()
    fs, path = fsspec.core.url_to_fs(uri)
    return uri, (Registry.open(uri).champion if fs.exists(path) else None)


@contextlib.contextmanager
def serving(manifest: Pool, conductor: str = "auto", bind_as_worker: bool = True) -> Iterator[Live]:
    """Start what the run needs; stop all of it on exit, even after an error or Ctrl-C."""
    from conductor.local.servers import EmbeddedServers, embedded_models, resolve_embedded
    from conductor.policy.strategies import strategy_pool

    manifest = strategy_pool(conductor, manifest)   # self-consistency brings its own vote worker
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(EmbeddedServers())
        pool = manifest
        if embedded_models(manifest):
            pool, _ = resolve_embedded(manifest, servers, lazy=True)
        # The embedded conductor gets a llama.cpp server of its own (grammar, n, log-probs); the transformers
        # fallback server supports none of those, so then the conductor runs in process (make_policy falls back too).
        policy, checkpoint_id = conductor_policy(
            conductor, functools.partial(conductor_server_url, servers) if servers.kind == "llamacpp" else None, pool)
        stack.callback(_close, policy)
        if bind_as_worker and any(w.provider == "conductor" for w in pool.workers):
            from conductor.workers.providers.conductor import bind_conductor, unbind_conductor

            bind_conductor(policy)
            stack.callback(unbind_conductor)
        live = Live(pool=pool, manifest=manifest, policy=policy, checkpoint_id=checkpoint_id)
        stack.callback(_close_executors, live)
        yield live


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if close is not None:
        close()


def _close_executors(live: Live) -> None:
    for ex in live._executors.values():
        if ex.cache is not None:
            ex.cache.close()


_SHARED: dict[tuple[str, str], tuple[contextlib.ExitStack, Live]] = {}


def shared_live(manifest: Pool, conductor: str) -> Live:
    """A per-process ``serving`` kept open for the life of the process.

    Shard tasks on a Dask/Ray worker build their own runtime from plain specs (a
    loaded model cannot be shipped between processes) and reuse it across shards.
    """
    import atexit

    key = (manifest.fingerprint, conductor)
    if key not in _SHARED:
        stack = contextlib.ExitStack()
        live = stack.enter_context(serving(manifest, conductor))
        if not _SHARED:
            atexit.register(close_shared)
        _SHARED[key] = (stack, live)
    return _SHARED[key][1]


def close_shared() -> None:
    while _SHARED:
        _, (stack, _live) = _SHARED.popitem()
        stack.close()
