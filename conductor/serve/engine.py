"""The serving core, free of any web framework: models by id, the champion watch, batched conductor
generations, and one request run through the project's own plan -> generate -> execute code.

WHY this shape: a request is a one-question run (``RunSpec`` of kind ``served``). ``conductor.run.pipeline.plan``
writes its prompt and sub-pool, ``pipeline.generate`` samples the conductor (for many concurrent requests at
once, see ``GenerationBatcher``), and ``conductor.execution.recursion.execute_batch`` runs the workflows under
the one shared ``Executor`` (its rate limits, cache, retries and the per-question dollar budget that enforces
``max_cost``). Nothing here decides how a workflow runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from conductor.execution.upstream import awaiting_upstream
from conductor.policy.spec import is_embedded_checkpoint
from conductor.records import replaced
from conductor.serve.errors import APIError, bad_controls, unknown_model, upstream
from conductor.workers.secrets import redact

if TYPE_CHECKING:
    from conductor.execution.executor import AnswerSinks, Executor
    from conductor.generation import PolicyBackend
    from conductor.learning.registry import CheckpointEntry
    from conductor.policy.spec import ConductorSpec
    from conductor.run.pipeline import RunSpec
    from conductor.run.runtime import Live
    from conductor.serve.config import ServeConfig
    from conductor.serve.lake import ServedWriter
    from conductor.serve.requests import ServeRequest
    from conductor.trajectory import Trajectory
    from conductor.workers.pool import Pool

log = logging.getLogger("conductor.serve")
MODEL = "conductor"
PINNED_MAX = 2            # conductor@<checkpoint> models kept loaded besides the champion and the default
SPEC_CACHE_MAX = 256      # request shapes (controls) whose base RunSpec a model keeps



@dataclass
class Model:
    """One loaded conductor: its policy, the pool it runs over, and how many requests use it right now."""

    checkpoint_id: str
    spec: ConductorSpec
    policy: PolicyBackend
    pool: Pool
    strategy: bool                     # writes workflows without a model: generated inline, no batching
    in_flight: int = 0
    retired: bool = False
    checked: dict[tuple[tuple[str, ...], int], str] = field(default_factory=dict)   # strategy check per (workers, steps)
    specs: dict[Hashable, RunSpec] = field(default_factory=dict, repr=False)   # spec_for's per-request-shape part
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def model_id(self) -> str:
        return f"{MODEL}@{self.checkpoint_id}"

    def acquire(self) -> Model:
        with self._lock:
            self.in_flight += 1
        return self

    def release(self) -> None:
        with self._lock:
            self.in_flight -= 1
            done = self.retired and self.in_flight == 0
        if done:
            self._close()

    def retire(self) -> None:
        """No new request gets this model; it closes once the requests using it are answered."""
        with self._lock:
            self.retired = True
            done = self.in_flight == 0
        if done:
            self._close()

    def _close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - closing a retired model must not hurt serving
                log.warning("closing retired model %s failed", self.checkpoint_id)


# one request's generation waiting in its model's queue: its trajectories, settings and completion signal
_Pending = tuple["list[Trajectory]", "RunSpec", "asyncio.Future[None]"]


@dataclass
class Outcome:
    """A request's trajectories (one per choice) and what it took."""

    request_id: str
    model: Model
    spec: RunSpec
    trajectories: list[Trajectory]
    started: float
    seconds: float = 0.0


class GenerationBatcher:
    """Conductor generations of concurrent requests in one ``policy.generate`` call per model and settings.

    Requests queue per model; the model's loop takes whatever has arrived (waiting ``window_s`` for more) and
    runs ``pipeline.generate`` once per settings group on a thread, one batch at a time per model (backends
    are not thread-safe; vLLM and llama.cpp server slots batch the prompts themselves). While a batch
    generates, the next one accumulates: under load batches grow instead of requests serializing.
    """

    def __init__(self, window_s: float = 0.002, max_batch: int = 64):
        self.window_s = window_s
        self.max_batch = max_batch
        self._queues: dict[int, asyncio.Queue[_Pending]] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.batches = 0
        self.prompts = 0

    async def generate(self, model: Model, trajs: list[Trajectory], spec: RunSpec) -> None:
        from conductor.run.pipeline import generate

        if model.strategy:               # no model to run: the fixed workflow is written inline
            generate(trajs, model.policy, spec)
            return
        q = self._queues.get(id(model))
        if q is None:
            q = self._queues[id(model)] = asyncio.Queue()
            self._tasks[id(model)] = asyncio.create_task(self._loop(model, q))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await q.put((trajs, spec, fut))
        with awaiting_upstream():        # the conductor model's time, not the server's (execution/upstream.py)
            await fut

    async def _loop(self, model: Model, q: asyncio.Queue[_Pending]) -> None:
        from conductor.run.overlap import generation_batch
        from conductor.run.pipeline import generate

        cap = min(self.max_batch, generation_batch(model.policy) or self.max_batch)
        while True:
            items = [await q.get()]
            if self.window_s > 0:
                await asyncio.sleep(self.window_s)
            while not q.empty() and sum(len(t) for t, _, _ in items) < cap:
                items.append(q.get_nowait())
            groups: dict[tuple[Hashable, ...], list[_Pending]] = {}
            for item in items:
                groups.setdefault(_settings_key(item[1]), []).append(item)
            for group in groups.values():
                trajs = [t for ts, _, _ in group for t in ts]
                try:
                    await asyncio.to_thread(generate, trajs, model.policy, group[0][1])
                    self.batches += 1
                    self.prompts += len(trajs)
                except Exception as e:  # noqa: BLE001 - the backend failing fails these requests only
                    for _, _, fut in group:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for _, _, fut in group:
                    if not fut.done():
                        fut.set_result(None)

    async def aclose(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        for t in self._tasks.values():
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self._tasks.clear()
        self._queues.clear()


def _settings_key(spec: RunSpec) -> tuple[Hashable, ...]:
    """What must agree for two requests' prompts to share one generate call."""
    return (tuple(w.name for w in spec.pool.workers), spec.temperature, spec.max_tokens, spec.seed,
            spec.max_steps, spec.constrained, spec.fewshot)


def policy_spec_of(entry: CheckpointEntry) -> ConductorSpec:
    """The policy spec a registry checkpoint is served with: its lineage's ``policy_spec`` when it names one
    (a strategy, an endpoint, a GGUF file; parsed here, where it is read), else the trained checkpoint directory
    through transformers."""
    from conductor.policy.spec import TransformersSpec, parse_conductor_spec

    spec = (entry.lineage or {}).get("policy_spec") if hasattr(entry, "lineage") else None
    return parse_conductor_spec(spec) if isinstance(spec, str) and spec else TransformersSpec(path=entry.uri)


class ServeEngine:
    """Everything a served request needs, built once per process."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self._stack: contextlib.ExitStack | None = None
        self.live: Live | None = None
        self.executor: Executor | None = None
        self.default: Model | None = None
        self.champion: Model | None = None
        self.pinned: OrderedDict[str, Model] = OrderedDict()
        self.batcher = GenerationBatcher(config.batch_window_ms / 1000.0, config.max_batch)
        self.registry_uri = config.registry or ""   # resolved in start()
        self.writer: ServedWriter | None = None
        self.on_outcome: list[Callable[[Outcome], None]] = []   # callbacks (metrics) for each finished request
        self._watch: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self.instance = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.reloads = 0
        self.registry_error: str | None = None   # why the registry could not be read, until it can

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Load the pool, start what it needs (embedded servers), the default conductor and the executor."""
        from conductor.policy.spec import AutoSpec, EmbeddedSpec
        from conductor.run.runtime import registry_uri, serving
        from conductor.workers.pool import load_pool

        cfg = self.config
        manifest = load_pool(cfg.pool)
        self.registry_uri = cfg.registry or registry_uri()
        default_spec = EmbeddedSpec() if isinstance(cfg.conductor, AutoSpec) else cfg.conductor
        stack = contextlib.ExitStack()
        try:
            self.live = live = stack.enter_context(serving(manifest, conductor=default_spec))
            self.executor = live.executor(cfg.cache, limits=cfg.limits)
            self.default = self._model(live.policy, live.checkpoint_id, default_spec)
            _, entry = self._champion_entry()
            if entry is not None:
                self.champion = self._load_entry(entry)
            if cfg.lake:
                from conductor.serve.lake import ServedWriter

                self.writer = ServedWriter(cfg.lake, batch=cfg.lake_batch, flush_s=cfg.lake_flush_s,
                                           store_text=cfg.store_text)
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    async def astart(self) -> None:
        """The parts that live in the server's event loop: the champion watch."""
        if self.config.reload_s > 0:
            self._watch = asyncio.create_task(self._watch_champion())

    async def aclose(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            try:
                await self._watch
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        await self.batcher.aclose()
        if self.executor is not None:
            await self.executor.aclose()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        for m in [self.champion, *self.pinned.values()]:
            if m is not None:
                m.retire()
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    # ------------------------------------------------------------------ models
    def _model(self, policy: PolicyBackend, checkpoint_id: str, spec: ConductorSpec) -> Model:
        from conductor.policy.strategies import is_strategy, strategy_pool

        strategy = is_strategy(spec)
        pool = strategy_pool(spec, self._pool()) if strategy else self._pool()
        return Model(checkpoint_id, spec, policy, pool, strategy)

    def _pool(self) -> Pool:
        """The running pool (embedded URLs resolved); ``start`` first."""
        if self.live is None:
            raise RuntimeError("ServeEngine: start() has not run")
        return self.live.pool

    def _champion_entry(self) -> tuple[bool, CheckpointEntry | None]:
        """(readable, the registry's champion or None). An unreadable registry is not "no champion": the
        caller keeps what it serves, and ``registry_error`` says why until a read succeeds (``/health``)."""
        from conductor.policy.spec import ChampionSpec
        from conductor.run.runtime import _champion

        try:
            entry = _champion(ChampionSpec(registry=self.registry_uri))[1]
        except Exception as e:  # noqa: BLE001 - an unreadable registry keeps the current model serving
            self.registry_error = redact(f"{type(e).__name__}: {e}")
            log.warning("registry %s: cannot read the champion, still serving %s: %s", self.registry_uri,
                        self.champion.checkpoint_id if self.champion else "the default", self.registry_error)
            return False, None
        self.registry_error = None
        return True, entry

    def _load_entry(self, entry: CheckpointEntry) -> Model:
        from conductor.run.runtime import conductor_policy

        spec = policy_spec_of(entry)
        policy, _ = conductor_policy(spec, pool=self._pool())
        return self._model(policy, entry.checkpoint_id, spec)

    async def _watch_champion(self) -> None:
        """Re-read the champion alias; a promotion is loaded off the loop, then swapped in atomically.
        Requests already running keep the model they started with (it closes after the last one)."""
        while True:
            await asyncio.sleep(self.config.reload_s)
            try:
                await self.reload_champion()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - keep serving the current champion
                log.warning("champion reload failed, still serving %s: %s",
                            self.champion.checkpoint_id if self.champion else "the default", redact(str(e)))

    async def reload_champion(self) -> bool:
        """Pick up a promotion (or a rollback) now; True when the champion changed."""
        readable, entry = await asyncio.to_thread(self._champion_entry)
        if not readable:
            return False
        current = self.champion.checkpoint_id if self.champion else None
        new_id = entry.checkpoint_id if entry is not None else None
        if new_id == current:
            return False
        new = await asyncio.to_thread(self._load_entry, entry) if entry is not None else None
        old, self.champion = self.champion, new
        self.reloads += 1
        log.info("champion changed: %s -> %s", current or "none", new_id or "none (serving the default)")
        if old is not None:
            old.retire()
        return True

    def model_ids(self) -> list[str]:
        ids = [MODEL]
        for m in (self.champion, self.default, *self.pinned.values()):
            if m is not None and m.model_id not in ids:
                ids.append(m.model_id)
        return ids

    def registered(self) -> list[str]:
        from conductor.learning.registry import Registry

        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(self.registry_uri)
            if not fs.exists(path):
                return []
            return sorted(Registry.open(self.registry_uri).backend.checkpoints())
        except Exception:  # noqa: BLE001 - listing is best effort
            return []

    async def resolve(self, name: str) -> Model:
        """``conductor`` (champion, else the default) or ``conductor@<checkpoint>``; 404 otherwise."""
        if name == MODEL:
            m = self.champion or self.default
            assert m is not None
            return m
        base, sep, ckpt = name.partition("@")
        if base != MODEL or not sep or not ckpt:
            raise unknown_model(name, self.model_ids())
        for m in (self.champion, self.default):
            if m is not None and m.checkpoint_id == ckpt:
                return m
        if ckpt in self.pinned:
            self.pinned.move_to_end(ckpt)
            return self.pinned[ckpt]
        from conductor.learning.registry import Registry, RegistryError

        if ckpt not in await asyncio.to_thread(self.registered):    # a lookup never creates a registry
            raise unknown_model(name, self.model_ids())
        try:
            entry = await asyncio.to_thread(lambda: Registry.open(self.registry_uri).get(ckpt))
        except (RegistryError, OSError, ValueError):
            raise unknown_model(name, self.model_ids()) from None
        try:
            model = await asyncio.to_thread(self._load_entry, entry)
        except Exception as e:  # noqa: BLE001 - a checkpoint that cannot load is unavailable, not a crash
            log.error("checkpoint %s could not be loaded: %s", ckpt, redact(f"{type(e).__name__}: {e}"))
            raise APIError(503, "api_error", "model_unavailable",
                           f"the checkpoint {ckpt!r} is registered but could not be loaded on this server") from None
        existing = self.pinned.get(ckpt)
        if existing is not None:            # loaded meanwhile by a concurrent request
            model.retire()
            return existing
        self.pinned[ckpt] = model
        while len(self.pinned) > PINNED_MAX:
            _, old = self.pinned.popitem(last=False)
            old.retire()
        return model

    # ------------------------------------------------------------------ one request
    def request_id(self) -> str:
        return f"{self.instance}-{next(self._ids)}"

    def spec_for(self, req: ServeRequest, model: Model) -> RunSpec:
        """The request as a one-question run over the pool its controls leave.

        WHY two parts: what depends only on the model and the controls (the sub-pool, the strategy check, the
        few-shot text, the grammar switch) is worked out once per shape and kept on the model; each request
        only fills in its own sampling, budget and date."""
        from conductor.execution.executor import Budget

        c = req.controls
        max_steps = min(self.config.max_steps, c.max_steps or self.config.max_steps)
        key = (None if c.workers is None else tuple(c.workers), tuple(c.exclude_workers), max_steps)
        base = model.specs.get(key)
        if base is None:
            base = self._base_spec(model, c.workers, c.exclude_workers, max_steps)
            if len(model.specs) >= SPEC_CACHE_MAX:
                model.specs.clear()
            model.specs[key] = base
        caps = [cap for cap in (self.config.max_dollars, c.max_cost) if cap is not None]
        date = time.strftime("%Y-%m-%d", time.gmtime())
        return replaced(base, run_id=self.config.run_id or f"served-{date}", samples=req.n, seed=req.seed or 0,
                        temperature=self.config.temperature if req.temperature is None else float(req.temperature),
                        budget=Budget(max_dollars=min(caps) if caps else None), date=date)

    def _base_spec(self, model: Model, workers: list[str] | None, exclude: list[str], max_steps: int) -> RunSpec:
        from conductor.policy.strategies import StrategyError, check_strategy, strategy_pool
        from conductor.run.pipeline import RunSpec

        cfg = self.config
        pool = restrict_pool(model.pool, workers, exclude)
        if model.strategy:
            key = (tuple(w.name for w in pool.workers), max_steps)
            problem = model.checked.get(key)
            if problem is None:
                try:
                    if strategy_pool(model.spec, pool) is not pool:   # the controls excluded its vote tool
                        raise StrategyError(f"strategy {str(model.spec)!r} needs its vote tool worker, which "
                                            "conductor.exclude_workers removed")
                    check_strategy(model.spec, pool, max_steps)
                    problem = ""
                except StrategyError as e:
                    problem = str(e)
                model.checked[key] = problem
            if problem:
                raise bad_controls(f"{model.model_id}: {problem} (the controls leave {len(pool.workers)} workers "
                                   f"and {max_steps} steps)", "conductor")
        return RunSpec(run_id="", kind="served", pool=pool, checkpoint_id=model.checkpoint_id,
                       recursion_depth=cfg.recursion_depth, max_steps=max_steps,
                       fewshot=cfg.fewshot.resolved(is_embedded_checkpoint(model.checkpoint_id)),
                       constrained=(is_embedded_checkpoint(model.checkpoint_id) if cfg.constrained is None
                                    else cfg.constrained),
                       max_tokens=cfg.conductor_max_tokens)

    @staticmethod
    def answer_depth(spec: RunSpec, model: Model) -> int:
        """The recursion round whose last step is surely the answer: 0 without recursion (strategies run
        none), else the last round (an earlier one may be replaced by the next)."""
        return 0 if model.strategy else spec.recursion_depth

    async def run(self, req: ServeRequest, model: Model | None = None, spec: RunSpec | None = None,
                  answer: AnswerSinks | None = None, request_id: str | None = None) -> Outcome:
        """Plan, generate and execute the request's workflows; raise APIError for what the client must see.

        A ``model`` passed in must already be held (``Model.acquire``) by the caller, who releases it: a
        champion swapped out between resolving and running is then still open. ``answer``: where the
        executor streams the answer as it is produced (``stream: true``; conductor/serve/stream.py).
        ``request_id``: the id the client already saw (a stream's first chunk), else a new one; the lake row
        and the trace carry the same."""
        from conductor.data.questions import Question
        from conductor.execution.executor import ANSWER_STREAM, Budget
        from conductor.execution.recursion import conductor_fn_from_backend, execute_batch
        from conductor.run.pipeline import plan

        started = time.perf_counter()
        held = model is None
        if model is None:
            model = (await self.resolve(req.model)).acquire()
        try:
            spec = spec or self.spec_for(req, model)
            rid = request_id or self.request_id()
            q = Question(id=f"served/{rid}", dataset="served", domain="free", prompt=req.question)
            trajs = plan([q], spec)
            async with asyncio.timeout(self.config.request_timeout_s):
                try:
                    await self.batcher.generate(model, trajs, spec)
                except Exception as e:  # noqa: BLE001 - the conductor's backend failing is infrastructure
                    log.warning("conductor %s failed: %s", model.checkpoint_id, redact(f"{type(e).__name__}: {e}"))
                    raise upstream(f"the conductor ({model.checkpoint_id}) failed to write a workflow") from None
                conductor = (conductor_fn_from_backend(model.policy, replace(spec.generation_params(), seed=None))
                             if spec.recursion_depth > 0 and not model.strategy else None)
                cap = spec.budget.max_dollars      # the request's: split evenly among its n choices
                budget = Budget(max_dollars=None if cap is None else cap / max(1, len(trajs)))
                if self.executor is None:
                    raise RuntimeError("ServeEngine: start() has not run")
                streaming = ANSWER_STREAM.set(answer)
                try:
                    await execute_batch(trajs, lambda t: spec.subpool_for(t.question_id), self.executor,
                                        conductor=conductor, max_depth=spec.recursion_depth,
                                        max_steps=spec.max_steps, budget=budget,
                                        call_factor=spec.recursion_call_factor)
                finally:
                    ANSWER_STREAM.reset(streaming)
        except TimeoutError:
            raise APIError(504, "api_error", "timeout",
                           f"the workflow did not finish within {self.config.request_timeout_s:g} s") from None
        finally:
            if held:
                model.release()
        out = Outcome(rid, model, spec, trajs, started, time.perf_counter() - started)
        for t in trajs:
            t.wall_s = out.seconds            # the served latency: conductor, execution and serving
        if self.writer is not None:
            self.writer.add(trajs)
        for cb in self.on_outcome:
            cb(out)
        failed = [t for t in trajs if t.infra_failed]
        if failed:
            raise upstream(f"the workflow failed on infrastructure: {failed[0].infra_cause or 'unknown cause'}")
        unrun = [t for t in trajs if t.parse_status != "ok"]
        if unrun:    # no workflow ran: an empty answer would look like one (the row is in the lake to debug it)
            root = unrun[0].root
            why = f"{unrun[0].parse_status}: {root.parse_error}" if root and root.parse_error else unrun[0].parse_status
            raise APIError(502, "api_error", "no_workflow",
                           f"the conductor ({model.checkpoint_id}) wrote no workflow that could run ({why})")
        return out


def restrict_pool(pool: Pool, allowed: list[str] | None, excluded: list[str]) -> Pool:
    """The pool a request's controls leave (manifest order kept; tool workers a strategy added stay).

    >>> from conductor.workers.pool import Pool, Worker
    >>> p = Pool(pool_id="p", workers=[Worker(name=n, provider="simulated", model=n) for n in "abc"])
    >>> [w.name for w in restrict_pool(p, ["c", "a"], ["a"]).workers]
    ['c']
    """
    names = [w.name for w in pool.workers]
    for param, given in (("conductor.workers", allowed or []), ("conductor.exclude_workers", excluded)):
        unknown = [n for n in given if n not in names]
        if unknown:
            raise bad_controls(f"{param}: no worker named {unknown[0]!r} in pool {pool.id} "
                               f"(workers: {', '.join(names)})", param)
    if allowed is None and not excluded:
        return pool
    keep = [w for w in pool.workers if (allowed is None or w.name in allowed or w.provider in ("vote", "agree"))
            and w.name not in excluded]
    if not [w for w in keep if w.provider not in ("vote", "agree")]:
        raise bad_controls("the controls leave no worker to call", "conductor.workers")
    return pool.model_copy(update={"workers": tuple(keep)})
