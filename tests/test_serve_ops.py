"""`conductor serve` operations: champion hot-reload without dropped requests, conductor@<checkpoint>, per-key
limits (in process and shared by replicas), hashed key files, stored text, batched conductor generations."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import openai
import pytest

from conductor.serve.config import ServeConfig
from tests.test_serve_support import LiveServer, questions, simulated_pool

ITEMS = questions(60, offset=500)


def _chat(base_url: str, key: str, i: int, model: str = "conductor", **kw):
    c = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": ITEMS[i][0]}], **kw)


def _register(registry, tmp_path, cid: str, spec: str) -> None:
    d = tmp_path / cid
    d.mkdir()
    registry.register(str(d), lineage={"policy_spec": spec}, checkpoint_id=cid)


def test_promoted_champion_is_picked_up_without_dropping_requests(tmp_path):
    from conductor.learning.registry import Registry

    reg = Registry(str(tmp_path / "registry"))
    _register(reg, tmp_path, "ck-a", "fixed:0")
    _register(reg, tmp_path, "ck-b", "fixed:1")
    reg.promote("ck-a")
    pool = simulated_pool(tmp_path, ITEMS, latency_s=0.05, skills=1.0)
    cfg = ServeConfig(pool=str(pool), conductor="fixed:2", registry=str(tmp_path / "registry"), reload_s=0.05)
    with LiveServer(cfg) as s:
        assert _chat(s.base_url, "k", 0).model == "conductor@ck-a"
        old = s.engine.champion

        async def burst():
            c = openai.AsyncOpenAI(base_url=s.base_url, api_key="k", max_retries=0)
            first_answered, picked_up = asyncio.Event(), asyncio.Event()

            async def one(i):
                await asyncio.sleep(0.01 * i)
                if i == 39:      # the last request leaves once the server has switched (on a loaded machine too)
                    await picked_up.wait()
                r = await c.chat.completions.create(model="conductor",
                                                    messages=[{"role": "user", "content": ITEMS[i][0]}])
                if i == 0:
                    first_answered.set()
                return r

            async def promote():     # while requests are in flight: after the first answer, before the last
                await first_answered.wait()
                await asyncio.to_thread(reg.promote, "ck-b")
                for _ in range(600):
                    if s.engine.champion.checkpoint_id == "ck-b":
                        break
                    await asyncio.sleep(0.05)
                picked_up.set()

            rs = await asyncio.gather(*(one(i) for i in range(40)), promote())
            await c.close()
            return rs[:-1]

        rs = asyncio.run(burst())
        assert all(f"<answer>{ITEMS[i][1]}</answer>" in r.choices[0].message.content for i, r in enumerate(rs))
        models = [r.model for r in rs]
        assert models[0] == "conductor@ck-a" and models[-1] == "conductor@ck-b", models
        assert old.retired and old.in_flight == 0
        # a pinned checkpoint, the untrained default, and the registered ones are all addressable
        assert _chat(s.base_url, "k", 1, model="conductor@ck-a").model == "conductor@ck-a"
        assert _chat(s.base_url, "k", 1, model="conductor@fixed:2").model == "conductor@fixed:2"
        with pytest.raises(openai.NotFoundError):
            _chat(s.base_url, "k", 1, model="conductor@ck-zzz")
        ids = [m.id for m in openai.OpenAI(base_url=s.base_url, api_key="k").models.list().data]
        assert {"conductor", "conductor@ck-a", "conductor@ck-b", "conductor@fixed:2"} <= set(ids)
        reg.rollback()
        deadline = time.monotonic() + 10
        while s.engine.champion.checkpoint_id != "ck-a" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _chat(s.base_url, "k", 2).model == "conductor@ck-a"


def test_per_key_rate_limit_refuses_with_429_and_retry_after(tmp_path):
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    os.environ["CONDUCTOR_TEST_KEYS_RL"] = "alice=key-alice-000000,bob=key-bob-000000"
    try:
        cfg = ServeConfig(pool=str(pool), conductor="fixed:0", registry=str(tmp_path / "r"), reload_s=0,
                          api_keys_env="CONDUCTOR_TEST_KEYS_RL", key_rpm=6.0)
        with LiveServer(cfg) as s:
            _chat(s.base_url, "key-alice-000000", 0)
            with pytest.raises(openai.RateLimitError) as e:
                _chat(s.base_url, "key-alice-000000", 1)
            assert e.value.code == "rate_limit_exceeded" and int(e.value.response.headers["retry-after"]) >= 1
            assert "key-alice" not in e.value.message
            _chat(s.base_url, "key-bob-000000", 1)            # another key has its own quota
    finally:
        os.environ.pop("CONDUCTOR_TEST_KEYS_RL", None)


def test_replicas_share_per_key_limits_and_hashed_keys_file(tmp_path):
    from conductor.serve.auth import new_key_line

    key, line = new_key_line("carol")
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# clients\n{line}\n")
    assert key not in keys.read_text()
    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    cfg = dict(pool=str(pool), conductor="fixed:0", registry=str(tmp_path / "r"), reload_s=0,
               keys_file=str(keys), key_rpm=6.0, client_limits=f"sqlite:{tmp_path / 'clients.sqlite'}",
               api_keys_env="CONDUCTOR_TEST_UNSET_VAR")
    with LiveServer(ServeConfig(**cfg)) as a, LiveServer(ServeConfig(**cfg)) as b:
        _chat(a.base_url, key, 0)
        with pytest.raises(openai.RateLimitError):
            _chat(b.base_url, key, 1)                           # the other replica sees the same quota
        with pytest.raises(openai.AuthenticationError):
            _chat(b.base_url, line.split()[1], 1)              # the stored hash is not a key


def test_store_text_keeps_the_question_in_the_lake(tmp_path):
    from conductor.lake.reader import load_trajectories

    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    cfg = ServeConfig(pool=str(pool), conductor="fixed:0", registry=str(tmp_path / "r"), reload_s=0,
                      lake=str(tmp_path / "lake"), store_text=True, run_id="served-test")
    with LiveServer(cfg) as s:
        _chat(s.base_url, "k", 3)
        s.engine.writer.flush()
        rows = load_trajectories(str(tmp_path / "lake"), "served-test", kind="served")
    assert [t.question for t in rows] == [ITEMS[3][0]]
    assert rows[0].calls and rows[0].rounds[0].steps and rows[0].final_answer


def test_concurrent_conductor_generations_are_batched():
    from conductor.data.questions import Question
    from conductor.generation import Generation
    from conductor.policy.fixed import FixedWorkflowPolicy
    from conductor.run.pipeline import RunSpec, plan
    from conductor.serve.engine import GenerationBatcher, Model
    from conductor.workers.pool import Pool, Worker

    class Recording:
        name = "recording"

        def __init__(self):
            self.batches: list[int] = []
            self.inner = FixedWorkflowPolicy.single_worker(0)

        def generate(self, prompts, n, params):
            self.batches.append(len(prompts))
            time.sleep(0.05)
            return [[Generation(text=self.inner.workflow.render())] * n for _ in prompts]

    pool = Pool(pool_id="p", workers=[Worker(name="w", provider="simulated", model="w")])
    policy = Recording()
    model = Model("ck", "transformers:/x", policy, pool, strategy=False)
    spec = RunSpec(run_id="r", kind="served", pool=pool, temperature=0.0)

    async def main():
        b = GenerationBatcher(window_s=0.002, max_batch=64)
        trajs = [plan([Question(id=f"q{i}", dataset="d", domain="free", prompt=f"question {i}")], spec)
                 for i in range(20)]
        await asyncio.gather(*(b.generate(model, t, spec) for t in trajs))
        await b.aclose()
        return trajs

    trajs = asyncio.run(main())
    assert all(t[0].rounds[0].completion.startswith("model_id") for t in trajs)
    assert sum(policy.batches) == 20 and len(policy.batches) <= 3, policy.batches


def test_cli_serve_and_serve_key_are_registered():
    from typer.testing import CliRunner

    from conductor.cli import app

    r = CliRunner().invoke(app, ["serve", "--help"])
    assert r.exit_code == 0 and "--pool" in r.output
    r = CliRunner().invoke(app, ["serve-key", "dave"])
    assert r.exit_code == 0 and "line: dave sha256:" in r.output
    assert httpx  # imported for symmetry with test_serve


def test_conductor_serve_process_answers_and_stops_cleanly_on_sigterm(tmp_path):
    """The real command under a process manager: SIGTERM finishes, flushes the lake and exits 0."""
    import subprocess
    import sys

    from tests.test_serve_support import free_port

    pool = simulated_pool(tmp_path, ITEMS, skills=1.0)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "conductor", "serve", "--pool", str(pool), "--conductor", "fixed:0",
                             "--port", str(port), "--lake", str(tmp_path / "lake"), "--registry", str(tmp_path / "r"),
                             "--run-id", "served-proc"], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        r = _chat(f"http://127.0.0.1:{port}/v1", "k", 4)
        assert f"<answer>{ITEMS[4][1]}</answer>" in r.choices[0].message.content
    finally:
        proc.terminate()
        code = proc.wait(60)
    assert code == 0
    from conductor.lake.reader import load_trajectories

    assert len(load_trajectories(str(tmp_path / "lake"), "served-proc", kind="served")) == 1
