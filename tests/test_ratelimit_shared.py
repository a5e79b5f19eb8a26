"""Limits shared by processes: real OS processes spend one provider quota through one SQLite store.

The emulator (one server, one RPM bucket for all clients) counts the 429s it had to send; a control run
with per-process limits shows the same load does overrun the quota when nothing is shared.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conductor.execution.executor import Executor
from conductor.execution.ratelimit import RateLimiter
from conductor.execution.recursion import run_batch
from conductor.execution.shared_limits import Lease, SQLiteLimits, open_shared
from conductor.testing.emulator import Emulator
from conductor.workers.pool import Limits, Pool
from tests.fixtures_emulator import emu, emulator, lists, make_traj, worker  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent

CALLS_CHILD = textwrap.dedent('''
    import asyncio, json, os, sys, time
    from conductor.execution.executor import Executor
    from conductor.execution.ratelimit import RateLimiter
    from conductor.execution.shared_limits import open_shared
    from conductor.trajectory import CallRecord
    from conductor.workers.pool import Worker
    from conductor.workers.providers.base import Message

    cfg = json.loads(sys.argv[1])
    w = Worker.model_validate(cfg["worker"])

    async def main():
        ex = Executor(limiter=RateLimiter(shared=open_shared(cfg["limits"])))
        async def one(i):
            rec = CallRecord(call_id="0.0", parent_call_id=None, depth=0, step=0, worker_index=0, worker=w.name,
                             provider=w.provider, model=w.model, subtask="s", access=[], access_all=False)
            await ex.call(w, [Message("user", f"{cfg['tag']} call {i}")], rec)
            return rec.retries
        open(cfg["ready"], "w").close()
        while not os.path.exists(cfg["go"]):
            await asyncio.sleep(0.01)
        retries = await asyncio.gather(*(one(i) for i in range(cfg["n"])))
        await ex.aclose()
        return sum(retries)

    print(json.dumps({"retries": asyncio.run(main())}))
''')

TOKENS_CHILD = textwrap.dedent('''
    import asyncio, json, os, sys
    from conductor.execution.shared_limits import SQLiteLimits
    from conductor.workers.pool import Limits

    cfg = json.loads(sys.argv[1])
    key = SQLiteLimits(cfg["path"]).key("k", Limits(**cfg["limits"]), 1.0)

    async def main():
        out = []
        open(cfg["ready"], "w").close()
        while not os.path.exists(cfg["go"]):
            await asyncio.sleep(0.01)
        for _ in range(cfg["n"]):
            lease, _ = await key.acquire(cfg["tokens"], None)
            out.append([lease.at, cfg["tokens"]])
            await key.release(lease, 0)
        return out

    print(json.dumps(asyncio.run(main())))
''')


def _run_children(tmp_path: Path, script: str, configs: list[dict]) -> list:
    """Start one OS process per config, release them together, return their JSON outputs."""
    path = tmp_path / "child.py"
    path.write_text(script, encoding="utf-8")
    go = tmp_path / "go"
    procs = []
    for i, cfg in enumerate(configs):
        cfg = {**cfg, "go": str(go), "ready": str(tmp_path / f"ready{i}")}
        procs.append(subprocess.Popen([sys.executable, str(path), json.dumps(cfg)], cwd=str(ROOT),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 300
    while not all((tmp_path / f"ready{i}").exists() for i in range(len(configs))):
        assert time.time() < deadline and all(p.poll() is None for p in procs), \
            [p.stderr.read() for p in procs if p.poll() is not None]
        time.sleep(0.05)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def _rpm_run(emu: Emulator, tmp_path: Path, limits: str) -> dict[str, int]:
    emu.configure(rpm=1200, rpm_burst_s=2.0)       # the provider: 20/s, 40 requests of burst, for all clients
    emu.reset()
    w = worker(emu, "w", "openai", limits={"requests_per_minute": 1200, "max_concurrency": 64, "max_retries": 10})
    cfg = {"worker": w.model_dump(mode="json"), "limits": limits, "n": 20}
    _run_children(tmp_path, CALLS_CHILD, [{**cfg, "tag": f"p{i}"} for i in range(3)])
    return emu.stats()


def test_processes_share_one_rpm_limit_without_a_429(emu: Emulator, tmp_path: Path) -> None:
    stats = _rpm_run(emu, tmp_path, f"sqlite:{tmp_path / 'limits.sqlite'}")
    assert stats["openai:ok"] == 60
    assert stats.get("openai:429", 0) == 0


def test_without_sharing_the_same_processes_overrun_the_quota(emu: Emulator, tmp_path: Path) -> None:
    """The control: three processes each bursting their own full limit get 429s from the provider."""
    stats = _rpm_run(emu, tmp_path, "local")
    assert stats["openai:ok"] == 60
    assert stats.get("openai:429", 0) > 0


def test_tokens_are_taken_by_weight_across_processes(tmp_path: Path) -> None:
    """3 processes x 4 calls x 110 tokens against 1200 tokens/min: no window ever admits more than the
    bucket allows (capacity + rate x span, by the store's clock), so the last calls had to wait."""
    limits = {"tokens_per_minute": 1200, "max_concurrency": 8}
    cfg = {"path": str(tmp_path / "limits.sqlite"), "limits": limits, "n": 4, "tokens": 110}
    outs = _run_children(tmp_path, TOKENS_CHILD, [cfg] * 3)
    admitted = sorted((at, n) for out in outs for at, n in out)
    assert len(admitted) == 12
    rate, cap = 1200 / 60, 1200
    for i in range(len(admitted)):
        for j in range(i, len(admitted)):
            tokens = sum(n for _, n in admitted[i:j + 1])
            assert tokens <= cap + rate * (admitted[j][0] - admitted[i][0]) + 1e-6, (i, j, admitted)
    assert admitted[-1][0] - admitted[0][0] >= (12 * 110 - cap) / rate - 1e-6


def test_unused_tokens_are_refunded_to_the_shared_bucket(tmp_path: Path) -> None:
    store = SQLiteLimits(tmp_path / "limits.sqlite")
    key = store.key("k", Limits(tokens_per_minute=1200), 1.0)

    async def main() -> float:
        lease, _ = await key.acquire(1000, None)
        await key.release(lease, 900)                     # the call used 100 of its 1000
        lease, _ = await key.acquire(1000, None)          # fits at once only because 900 came back
        return lease.at - time.time()

    asyncio.run(main())
    level = store._pool.submit(store.transact, lambda conn, now: key._bucket(conn, "tpm", now).level).result()
    assert 1200 - 1000 - 100 <= level <= 1200 - 1000 - 100 + 20      # (+ at most a second of refill)
    store.close()


def test_a_pause_holds_every_process_of_the_store(tmp_path: Path) -> None:
    a = SQLiteLimits(tmp_path / "limits.sqlite").key("k", Limits(requests_per_minute=6000), 1.0)
    b = SQLiteLimits(tmp_path / "limits.sqlite").key("k", Limits(requests_per_minute=6000), 1.0)

    async def main() -> tuple[float, Lease]:
        await a.pause(0.3)
        until = time.time() + 0.3
        lease, paused = await b.acquire(0, None)
        assert paused > 0
        return until, lease

    until, lease = asyncio.run(main())
    assert lease.at >= until - 0.05                   # admitted only once the other store's pause was over


def test_concurrency_cap_is_shared_and_a_killed_holder_frees_its_slots(emu: Emulator, tmp_path: Path) -> None:
    spec = f"sqlite:{tmp_path / 'limits.sqlite'}"
    emu.configure(latency_s=0.3)
    w = worker(emu, "w", "openai", limits={"max_concurrency": 2})
    _run_children(tmp_path, CALLS_CHILD, [{"worker": w.model_dump(mode="json"), "limits": spec, "n": 4,
                                            "tag": f"p{i}"} for i in range(2)])
    assert emu.max_in_flight() == 2 and emu.stats()["openai:ok"] == 8

    holder = textwrap.dedent(f'''
        import asyncio, os, signal
        from conductor.execution.shared_limits import SQLiteLimits
        from conductor.workers.pool import Limits
        key = SQLiteLimits({str(tmp_path / "limits.sqlite")!r}).key("k", Limits(max_concurrency=2, timeout_s=600), 1.0)
        async def main():
            await key.acquire(0, None)
            await key.acquire(0, None)
        asyncio.run(main())
        os.kill(os.getpid(), signal.SIGKILL)      # never releases: its leases would last 630 s
    ''')
    r = subprocess.run([sys.executable, "-c", holder], cwd=str(ROOT), capture_output=True, timeout=300)
    assert r.returncode == -signal.SIGKILL
    key = SQLiteLimits(tmp_path / "limits.sqlite").key("k", Limits(max_concurrency=2, timeout_s=600), 1.0)

    async def main() -> None:
        async with asyncio.timeout(30):
            await key.acquire(0, None)

    asyncio.run(main())


def test_open_shared_specs(tmp_path: Path) -> None:
    assert open_shared(None) is None and open_shared("local") is None
    store = open_shared(f"sqlite:{tmp_path / 'x' / 'limits.sqlite'}")
    assert isinstance(store, SQLiteLimits) and (tmp_path / "x" / "limits.sqlite").exists()
    assert open_shared("prefect").spec == "prefect"
    with pytest.raises(ValueError, match="expected 'local', 'sqlite:PATH' or 'prefect"):
        open_shared("redis://x")


@pytest.mark.slow
def test_prefect_global_limits_hold_rpm_and_concurrency(emu: Emulator) -> None:
    """Real Prefect (ephemeral server): rate_limit with slot decay keeps under the provider's RPM, and the
    slots limit caps calls in flight."""
    from conductor.execution.shared_limits import PrefectLimits

    emu.configure(rpm=600, rpm_burst_s=2.0, latency_s=0.05)
    pool = Pool(pool_id="pf", workers=(worker(emu, "w", "openai", limits={"requests_per_minute": 600,
                                                                           "max_concurrency": 2}),))
    limiter = RateLimiter(shared=PrefectLimits(prefix=f"test{time.time_ns()}"))
    # 40 calls: two in flight at 50 ms each would reach the provider at ~40/s without the rate limit,
    # far past its 20 requests of burst and 10/s
    trajs = [make_traj(lists([0], [f"s{i}"], [[]]), qid=f"q{i}") for i in range(40)]
    out = run_batch(trajs, pool.full(), Executor(limiter=limiter))
    assert all(not t.infra_failed for t in out), [t.infra_cause for t in out]
    assert emu.max_in_flight() <= 2 and emu.stats().get("openai:429", 0) == 0
    assert emu.stats()["openai:ok"] == 40


def test_live_executor_uses_the_runs_store(tmp_path: Path) -> None:
    from conductor.run.runtime import Live
    from conductor.workers.pool import load_pool

    live = Live(pool=load_pool(ROOT / "data/pools/simulated.yaml"), manifest=load_pool(ROOT / "data/pools/simulated.yaml"),
                policy=None, checkpoint_id="x")  # type: ignore[arg-type]
    spec = f"sqlite:{tmp_path / 'limits.sqlite'}"
    ex = live.executor(None, limits=spec)
    assert ex.limiter.shared is not None and ex.limiter.shared.spec == spec
    assert live.executor(None).limiter.shared is None


@pytest.mark.slow
def test_rollout_fanned_out_on_dask_shares_one_limit(emu: Emulator, tmp_path: Path) -> None:
    """Two Dask worker processes run the rollout shards against one provider limit; the flow passes the
    default store (limits.sqlite next to the cache) to both, and the provider sends no 429. (Slow: a Dask
    LocalCluster and Prefect's temporary server; 5 min on the loaded 2-core box. The same run with
    ``limits="local"`` got 429s from the emulator: 2 of 32 calls, run once by hand.)"""
    from conductor.run.config import RolloutConfig
    from flows.rollout import on_dask, rollout_flow

    emu.configure(rpm=300, rpm_burst_s=2.0, latency_s=0.05)     # 5/s, 10 requests of burst
    pool = tmp_path / "pool.yaml"
    pool.write_text(textwrap.dedent(f"""
        pool_id: emu
        workers:
          - name: w
            provider: openai_compatible
            model: emu-model
            base_url: {emu.base_url}/v1
            limits: {{requests_per_minute: 300, max_concurrency: 16, timeout_s: 30, max_retries: 0}}
    """), encoding="utf-8")
    qs = tmp_path / "q.jsonl"
    qs.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                          for i in range(8)), encoding="utf-8")
    emu.reset()
    cache = tmp_path / "run" / "cache.sqlite"
    summary = on_dask(rollout_flow, n_workers=2)(RolloutConfig(
        questions=str(qs), lake=str(tmp_path / "lake"), pool=str(pool), conductor="fixed:0", run_id="dask-limits",
        group_size=4, shard_size=1, cache=str(cache), max_tokens=64))
    assert summary["trajectories"] == 32
    assert emu.stats().get("openai:429", 0) == 0 and emu.stats()["openai:ok"] == 32
    assert (tmp_path / "run" / "limits.sqlite").exists()
