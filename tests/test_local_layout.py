"""How a run's embedded engines share the cores (conductor/local/layout.py): the layout each conductor gets, the
shared concurrency slot holding two models to one call at a time (real SDK against the emulator), the servers'
threads and shared slot set where embedded URLs are resolved, and a menu-like conductor that never writes while
the workers execute (the shard loop)."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from conductor.execution.executor import Executor
from conductor.execution.ratelimit import RateLimiter
from conductor.execution.recursion import run_batch
from conductor.local.layout import SERIAL_SLOT, LocalLayout, free_cores
from conductor.policy.spec import parse_conductor_spec
from conductor.run.runtime import layout_for
from conductor.testing.emulator import Emulator
from conductor.workers.pool import Pool, parse_pool
from tests.fixtures_emulator import emu, emulator, lists, make_traj, worker  # noqa: F401
from tests.test_embedded import SMOL, needs_llama, smol_path
from tests.test_shard_loop import Scripted, _questions, _spec

CORES = os.cpu_count() or 1


@pytest.mark.parametrize("spec, serial", [
    ("menu:fixed:0,chain:0:1", True), ("fixed:0", True), ("chain:0:1", True), ("sc:0:3", True),
    ("auto", False), ("embedded", False),
])
def test_a_conductor_that_writes_little_runs_the_engines_one_at_a_time_on_every_core(monkeypatch, spec, serial):
    monkeypatch.delenv("CONDUCTOR_LOCAL_THREADS", raising=False)
    layout = layout_for(parse_conductor_spec(spec))
    assert layout.serial == serial
    assert 1 <= layout.threads <= CORES if serial else layout.threads == max(1, CORES - 1)


def test_a_serial_run_leaves_busy_cores_to_their_jobs():
    """Every core kept busy by another process: a serial run takes one thread, not all the cores (its threads
    would spin against those jobs)."""
    import subprocess
    import sys

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(CORES)]
    try:
        threading.Event().wait(0.5)
        assert free_cores(sample_s=0.5) == 1
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_the_thread_count_follows_the_environment_in_either_layout(monkeypatch):
    monkeypatch.setenv("CONDUCTOR_LOCAL_THREADS", "3")
    assert LocalLayout.serial_on(free=2).threads == LocalLayout.parallel().threads == 3


def _two_models(emu: Emulator, share: str | None) -> Pool:
    limits = {"max_concurrency": 1, **({"share": share} if share else {})}
    return Pool(pool_id="two", workers=(worker(emu, "big", "local", limits=limits),
                                        worker(emu, "small", "local", limits=limits)))


@pytest.mark.parametrize("share, most", [(None, 2), (SERIAL_SLOT, 1)])
def test_models_sharing_a_slot_take_turns(emu: Emulator, share, most) -> None:
    """Each question asks both models at once (two independent steps); sharing one slot they answer one call at
    a time, across questions too, and every call still succeeds."""
    emu.configure(latency_s=0.05)
    pool = _two_models(emu, share)
    trajs = [make_traj(lists([0, 1], ["a", "b"], [[], []]), question=f"q{i}", qid=f"q{i}") for i in range(4)]
    limiter = RateLimiter()
    out = run_batch(trajs, pool.full(), Executor(limiter=limiter))
    assert all(not t.infra_failed for t in out) and sum(t.n_calls for t in out) == 8
    assert emu.max_in_flight() == most
    assert len(limiter.stats()) == (1 if share else 2)


@needs_llama
def test_resolving_embedded_urls_gives_the_servers_the_layouts_threads_and_the_workers_one_slot():
    from conductor.local.servers import EmbeddedServers, resolve_embedded

    smol_path()
    pool = parse_pool(f"""
pool_id: t
workers:
  - {{name: a, provider: local, model: {SMOL}, base_url: "embedded://{SMOL}", limits: {{max_concurrency: 4}}}}
  - {{name: c, provider: openai_compatible, model: m, base_url: "http://127.0.0.1:9/v1"}}
""")
    with EmbeddedServers(threads=2) as servers:
        resolved, _ = resolve_embedded(pool, servers, lazy=True, share=SERIAL_SLOT)   # reserved, not started
        a, c = resolved.workers
        assert (a.limits.share, a.limits.max_concurrency) == (SERIAL_SLOT, 1)
        assert c.limits == pool.workers[1].limits and c.limit_key == pool.workers[1].limit_key
        cmd = servers.servers[SMOL].command()
        assert cmd[cmd.index("--n_threads") + 1] == cmd[cmd.index("--n_threads_batch") + 1] == "2"
        parallel, _ = resolve_embedded(pool, EmbeddedServers(), lazy=True)
        assert parallel.workers[0].limits.share is None and parallel.workers[0].limits.max_concurrency == 4


class Deciding(Scripted):
    """A conductor like a menu: it must not decide while a workflow executes on the same cores."""

    overlaps_execution = False

    def __init__(self, executing: threading.Event):
        super().__init__(generation_batch=1)
        self.executing, self.overlapped = executing, 0

    def generate(self, prompts, n, params):
        self.overlapped += self.executing.is_set()
        return super().generate(prompts, n, params)


def test_a_conductor_that_does_not_overlap_decides_only_between_executions(tmp_path: Path):
    from conductor.run import pipeline
    from conductor.run.shards import PLAIN, ShardLoop

    executing = threading.Event()

    def execute(trajs, spec, executor, policy, on_done):
        executing.set()
        try:
            threading.Event().wait(0.05)        # long enough for a look-ahead generation to start
            return pipeline.execute(trajs, spec, executor, policy, on_done)
        finally:
            executing.clear()

    policy, qs, commits = Deciding(executing), _questions("d", 4), []
    loop = ShardLoop(_spec("serial"), policy, Executor(), lake=str(tmp_path / "lake"),
                     stages=replace(PLAIN, execute=execute), on_commit=lambda sid, rows: commits.append(sid))
    assert loop.run([("s1", qs[:2]), ("s2", qs[2:])]) == 4
    assert policy.calls == 4 and policy.overlapped == 0 and commits == ["s1", "s2"]
