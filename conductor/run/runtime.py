"""The live side of a run: servers started, policy loaded, executor built, and all of it stopped again.

Flows open ``serving(pool, conductor=spec)`` once per run. Embedded workers
(``embedded://`` URLs) get llama.cpp servers on loopback; the embedded conductor
shares the 1.5B server instead of loading the model twice; a ``provider:
conductor`` worker is bound to the live policy (recursion as a worker).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from conductor.execution.executor import Executor
    from conductor.execution.shared_limits import LimitsSpec
    from conductor.generation import PolicyBackend
    from conductor.local.layout import LocalLayout
    from conductor.policy.spec import AutoSpec, ChampionSpec, ConductorSpec, MenuSpec
    from conductor.workers.pool import Pool

EMBEDDED_CONDUCTOR_MODEL = "qwen2.5-coder-1.5b-instruct"
EMBEDDED_CHECKPOINT = f"embedded:{EMBEDDED_CONDUCTOR_MODEL}"   # the checkpoint id of the untrained embedded conductor


@dataclass
class Live:
    pool: Pool                 # embedded URLs resolved to the running servers
    manifest: Pool             # as written (cache keys and fingerprints come from this one)
    policy: PolicyBackend
    checkpoint_id: str
    _executors: dict[tuple[str | None, bool, LimitsSpec | None], Executor] = field(default_factory=dict)

    def executor(self, cache_path: str | None = None, replay: bool = False,
                 limits: LimitsSpec | str | None = None) -> Executor:
        """The executor for this cache (built once): rate limits and an on-disk response cache (replay: never
        call a provider). ``limits``: where the rate limits live when processes share a quota
        (``sqlite:PATH``, ``prefect``; None/``local``: this process; conductor/execution/shared_limits.py)."""
        from conductor.execution.cache import ResponseCache
        from conductor.execution.executor import Executor
        from conductor.execution.ratelimit import RateLimiter
        from conductor.execution.shared_limits import LimitsSpec, open_shared

        limits = LimitsSpec.parse(limits) if limits is not None else None
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


def conductor_policy(spec: ConductorSpec, in_process: bool = False,
                     pool: Pool | None = None, threads: int | None = None) -> tuple[PolicyBackend, str]:
    """(policy, checkpoint id) for a conductor spec.

    ``auto`` is the registry's champion when one has been promoted, else ``embedded`` (the 1.5B model, few-shot
    prompted; with ``in_process``, llama.cpp in this process with saved prompt prefixes, loaded on first use:
    ``embedded_conductor``); ``serving`` resolves ``auto`` to the pool's default menu first (``effective_spec``). ``champion[@URI]``
    requires a champion. The baseline strategies (``fixed:i``, ``sc:i:k``, ``moa:...``, ``random``;
    conductor.policy.strategies) write their workflows without a model and need the ``pool``. ``threads``: a
    menu's in-process model's (the run's layout: conductor/local/layout.py).
    """
    from conductor.policy import make_policy
    from conductor.policy.spec import (
        AutoSpec,
        ChampionSpec,
        EmbeddedSpec,
        MenuSpec,
        PolicySpecError,
        StrategyBase,
        TransformersSpec,
    )

    match spec:
        case MenuSpec():
            if pool is None or not in_process:
                raise PolicySpecError(f"conductor spec {str(spec)!r}: a menu is chosen by the embedded model on "
                                      "llama.cpp (install the 'local' extra) and needs the pool it runs over")
            return menu_conductor(spec, pool, threads), str(spec)
        case StrategyBase():
            from conductor.policy.strategies import StrategyError, make_strategy, strategy_pool

            if pool is None:
                raise StrategyError(f"strategy {str(spec)!r}: needs the pool it runs over")
            return make_strategy(spec, strategy_pool(spec, pool)), str(spec)
        case AutoSpec() | ChampionSpec():
            from conductor.learning.registry import RegistryError

            uri, entry = _champion(spec)
            if entry is not None:
                return make_policy(TransformersSpec(path=entry.uri)), entry.checkpoint_id
            if isinstance(spec, ChampionSpec):
                raise RegistryError(f"registry {uri}: no champion has been promoted yet")
            spec = EmbeddedSpec()
    if spec == EmbeddedSpec() and in_process:   # llama.cpp in this process, loaded on first use
        return LoadOnUse(embedded_conductor), EMBEDDED_CHECKPOINT
    return make_policy(spec), _masked(spec)


def _masked(spec: ConductorSpec) -> str:
    """A checkpoint id never carries a secret of its spec (URL password, query values, known keys)."""
    from conductor.workers.secrets import mask_url

    return mask_url(str(spec))


PREFIX_CACHE_ENV = "CONDUCTOR_PREFIX_CACHE"
# Draft tokens the embedded conductor proposes by prompt lookup per greedy step (policy/llamacpp_backend.py):
# it copies its examples' subtasks nearly word for word: 96 of 105 tokens drafted and accepted, 2x faster
# (docs/benchmarks.md, "Bulk answering throughput"). ``$CONDUCTOR_SPECULATE``: another count, 0 for none.
EMBEDDED_SPECULATE = 16
SPECULATE_ENV = "CONDUCTOR_SPECULATE"


def embedded_speculate() -> int:
    """Draft tokens for the embedded conductor: ``$CONDUCTOR_SPECULATE`` if set, else ``EMBEDDED_SPECULATE``."""
    raw = os.environ.get(SPECULATE_ENV, "").strip()
    if not raw:
        return EMBEDDED_SPECULATE
    if not raw.isdigit():
        raise ValueError(f"${SPECULATE_ENV}={raw!r}: expected a whole number of draft tokens (0 for none)")
    return int(raw)


def embedded_conductor(prefill: str = "", threads: int | None = None) -> PolicyBackend:
    """The embedded conductor model in this process (llama-cpp-python), with saved prompt-prefix states.

    WHY in process and not a server of its own: llama_cpp.server keeps only the previous prompt's KV cache,
    so each switch of question domain (one example order per domain) re-read ~700 prompt tokens and each run
    re-read the whole ~1,000-token prefix; here the prefix states are saved and restored
    (conductor/local/prefix_cache.py), in memory and under $CONDUCTOR_HOME/prefix-cache for the next run. The
    grammar is applied lazily (the sampled token is checked first: policy/llamacpp_backend.py), not to the
    whole vocabulary at every token as the server does. It gets the threads of a worker server (all cores but
    one): it writes the next question's workflow while the workers execute this one (conductor/run/overlap.py),
    and two engines spinning on more threads than cores slow each other down several-fold.
    Greedy generations are speculated by prompt lookup (``embedded_speculate()`` draft tokens, verified in one
    batched evaluation: the greedy tokens up to floating-point noise, in fewer decode steps).
    ``$CONDUCTOR_PREFIX_CACHE``: another directory for the saved prefixes, or ``off`` (memory only).
    ``prefill``: the text its every turn starts with (a menu's: ``menu_conductor``). ``threads``: the run's layout's
    (conductor/local/layout.py; None: all cores but one).
    """
    from conductor.local.embedded import conductor_home, ensure_models, spec_for
    from conductor.local.prefix_cache import PrefixCache
    from conductor.policy.llamacpp_backend import LlamaCppBackend, default_threads

    spec = spec_for(EMBEDDED_CONDUCTOR_MODEL)
    path = ensure_models(which=[spec.name])[spec.name]
    where = os.environ.get(PREFIX_CACHE_ENV, "").strip()
    cache = PrefixCache(None) if where == "off" else PrefixCache.for_model(where or conductor_home() / "prefix-cache", path)
    return LlamaCppBackend(path, n_ctx=spec.n_ctx, n_threads=threads or default_threads(), prefix_cache=cache,
                           speculate=embedded_speculate(), prefill=prefill)


def layout_for(spec: ConductorSpec) -> LocalLayout:
    """How the run's embedded engines share the cores (conductor/local/layout.py): serial for a conductor that
    writes (almost) nothing, a menu or a fixed strategy; parallel for one that writes workflows."""
    from conductor.local.layout import LocalLayout
    from conductor.policy.spec import MenuSpec, StrategyBase

    return LocalLayout.serial_on() if isinstance(spec, MenuSpec | StrategyBase) else LocalLayout.parallel()


def effective_spec(spec: ConductorSpec, pool: Pool | None, in_process: bool) -> ConductorSpec:
    """The conductor a run runs for ``spec``: ``auto`` without a champion is the pool's default menu
    (conductor.policy.menu: ``default_menu``) where the embedded model runs in this process (llama.cpp), else the
    writing conductor (``embedded``); ``auto`` with a champion, and every other spec, is itself."""
    from conductor.policy.menu import default_menu
    from conductor.policy.spec import AutoSpec, EmbeddedSpec

    if not isinstance(spec, AutoSpec) or _champion(spec)[1] is not None:
        return spec
    return (default_menu(pool) if pool is not None and in_process else None) or EmbeddedSpec()


def menu_conductor(spec: MenuSpec, pool: Pool, threads: int | None = None) -> PolicyBackend:
    """The embedded conductor choosing one of ``spec``'s workflows per question (conductor/policy/menu.py): in its
    own format where the entries' ``model_id`` lines differ (``native_choice``: the turn starts with their shared
    part, a grammar lets it finish the line only as one entry does), else by index with the menu described.
    The chosen entry's workflow is what runs. The decision is the question's prefill and a few decoded tokens, in
    place of ~70 tokens of a written workflow (docs/default-conductor.md). ``threads``: the run's layout's (serial:
    every core, as the workers it takes turns with; conductor/local/layout.py)."""
    from conductor.policy.menu import MenuBackend, WorkflowMenu

    menu = WorkflowMenu.of(spec, pool)
    choice = menu.native_choice() or menu.index_choice(described=True)
    inner = LoadOnUse(lambda: embedded_conductor(prefill=choice.prefill, threads=threads), name=str(spec))
    return MenuBackend(inner, menu, choice=choice)


class LoadOnUse:
    """A policy built on its first generation, so a rerun whose conductor generations all come from the cache
    never loads the model; one generation at a time (the executing stage may call it too, for recursion)."""

    # one prompt at a time: a question's workflow executes while the next is written (conductor/run/overlap.py)
    generation_batch: ClassVar[int] = 1

    def __init__(self, factory: Callable[[], PolicyBackend], name: str = EMBEDDED_CHECKPOINT):
        self._factory = factory
        self._loaded: PolicyBackend | None = None
        self._lock = threading.Lock()
        self.name = name

    def generate(self, prompts: list[str], n: int, params: Any) -> Any:
        with self._lock:
            if self._loaded is None:
                self._loaded = self._factory()
            return self._loaded.generate(prompts, n, params)

    def close(self) -> None:
        with self._lock:
            loaded, self._loaded = self._loaded, None
        _close(loaded)


def checkpoint_of(spec: ConductorSpec, pool: Pool | None = None) -> str:
    """The checkpoint a conductor spec stands for right now, without loading anything (run ids use it); with the
    ``pool``, ``auto`` without a champion is what ``serving`` will run over it (``effective_spec``)."""
    from conductor.local.servers import server_kind
    from conductor.policy.spec import AutoSpec, ChampionSpec, EmbeddedSpec

    if pool is not None:
        spec = effective_spec(spec, pool, server_kind() == "llamacpp")
    match spec:
        case AutoSpec() | ChampionSpec():
            _, entry = _champion(spec)
            if entry is not None:
                return str(entry.checkpoint_id)
            return EMBEDDED_CHECKPOINT if isinstance(spec, AutoSpec) else str(spec)
        case EmbeddedSpec(model=None):
            return EMBEDDED_CHECKPOINT
    return _masked(spec)


def registry_of(spec: AutoSpec | ChampionSpec) -> str:
    """The registry a champion spec reads: its own ``@REGISTRY``, else the default (``registry_uri``)."""
    return getattr(spec, "registry", None) or registry_uri()


def _champion(spec: AutoSpec | ChampionSpec) -> tuple[str, Any]:
    """(registry URI, champion entry or None) for ``auto`` / ``champion[@URI]``; a missing registry has none."""
    import fsspec

    from conductor.learning.registry import Registry

    uri = registry_of(spec)
    fs, path = fsspec.core.url_to_fs(uri)
    return uri, (Registry.open(uri).champion if fs.exists(path) else None)


@contextlib.contextmanager
def serving(manifest: Pool, conductor: ConductorSpec | None = None, bind_as_worker: bool = True) -> Iterator[Live]:
    """Start what the run needs (for ``conductor``, default auto); stop all of it on exit, even after an error or
    Ctrl-C."""
    from conductor.local.layout import SERIAL_SLOT
    from conductor.local.servers import EmbeddedServers, embedded_models, resolve_embedded
    from conductor.policy.spec import AutoSpec
    from conductor.policy.strategies import strategy_pool

    conductor = AutoSpec() if conductor is None else conductor
    manifest = strategy_pool(conductor, manifest)   # self-consistency brings its own vote worker
    with contextlib.ExitStack() as stack:
        servers = stack.enter_context(EmbeddedServers())
        conductor = effective_spec(conductor, manifest, servers.kind == "llamacpp")
        layout = layout_for(conductor)              # how the embedded engines share the cores
        servers.threads = layout.threads
        pool = manifest
        if embedded_models(manifest):
            pool, _ = resolve_embedded(manifest, servers, lazy=True, share=SERIAL_SLOT if layout.serial else None)
        # The embedded conductor runs in process: llama.cpp with saved prompt prefixes (embedded_conductor), or
        # else whatever make_policy falls back to (transformers).
        policy, checkpoint_id = conductor_policy(conductor, servers.kind == "llamacpp", pool, layout.threads)
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


_SHARED: dict[tuple[str, ConductorSpec], tuple[contextlib.ExitStack, Live]] = {}


def shared_live(manifest: Pool, conductor: ConductorSpec) -> Live:
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
