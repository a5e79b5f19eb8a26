"""The transformers fallback for the embedded servers: a real ``transformers serve`` subprocess on SmolLM2-135M.

Needs the model installed (`python -m conductor.local.embedded smollm2-135m-instruct`); its float checkpoint is
converted once into $CONDUCTOR_HOME/hf by the transformers backend (first run only, ~1 min).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket

import pytest

from conductor.local.process import ServerError, ServerSettings
from conductor.local.servers import EmbeddedServers, resolve_embedded
from conductor.local.transformers_server import TransformersServer, serving_dir
from conductor.workers.pool import parse_pool
from test_embedded import SMOL, smol_path

needs_serve = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "torch", "fastapi", "uvicorn")),
    reason="transformers serve needs transformers, torch, fastapi and uvicorn")

SYSTEM = "Answer with one word."


def _run(pool, executor, workflow):
    async def go():
        try:
            return await executor.run_workflow("Name a colour.", workflow, pool.full())
        finally:
            await executor.aclose()
    return asyncio.run(go())


@needs_serve
def test_the_embedded_pool_runs_on_the_transformers_server_through_the_executor(monkeypatch):
    from conductor.execution.executor import Executor
    from conductor.workflow import Workflow

    smol_path()
    monkeypatch.setenv("CONDUCTOR_EMBEDDED_SERVER", "transformers")
    # a: greedy. b: another model name for the same embedded model, top_k=1 at a high temperature (so greedy too).
    # c: sampling at a high temperature.
    pool = parse_pool(f"""
pool_id: t
workers:
  - name: a
    provider: local
    model: {SMOL}
    base_url: "embedded://{SMOL}"
    sampling: {{temperature: 0, max_tokens: 8, system_prompt: "{SYSTEM}"}}
  - name: b
    provider: local
    model: {SMOL}-as-named-elsewhere
    base_url: "embedded://{SMOL}"
    sampling: {{temperature: 1.5, top_k: 1, max_tokens: 8, system_prompt: "{SYSTEM}"}}
  - name: c
    provider: local
    model: {SMOL}
    base_url: "embedded://{SMOL}"
    sampling: {{temperature: 1.5, max_tokens: 8, system_prompt: "{SYSTEM}"}}
""")
    with EmbeddedServers(settings=ServerSettings(n_threads=1, startup_timeout_s=150)) as servers:
        resolved, _ = resolve_embedded(pool, servers)
        assert servers.kind == "transformers" and len(servers.servers) == 1
        server = servers.servers[SMOL]
        assert isinstance(server, TransformersServer)
        assert {w.model for w in resolved.workers} == {SMOL}, "requests must name the served model"
        assert len({w.base_url for w in resolved.workers}) == 1

        # steps 0-1: workers a and b; steps 2-4: worker c three times (same messages, independent samples)
        workflow = Workflow.from_lists([0, 1, 2, 2, 2], ["Name a colour."] * 5, [[], [], [], [], []])
        result = _run(resolved, Executor(), workflow)
        assert result.failure is None, result.infra_cause
        greedy = result.responses[0]
        assert greedy.strip(), "empty answer"
        assert result.responses[1] == greedy, "top_k=1 must decode like temperature 0"
        assert result.final_answer == result.responses[4]
        for rec in result.calls:
            assert rec.input_tokens > 10 and 0 < rec.output_tokens <= 8
            assert rec.finish_reason in ("stop", "length")
            assert rec.model == SMOL
        sampled = [result.responses[i] for i in (2, 3, 4)]
        assert len({greedy, *sampled}) > 1, "temperature 1.5 sampled nothing but the greedy answer"

        proc, port, log_path = server.process, server.port, server.log_path
    assert proc.poll() is not None, "server still running after the context exited"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "port still open after stop"
    assert log_path.stat().st_size > 0


def test_a_missing_model_is_a_one_line_server_error(tmp_path):
    server = TransformersServer(tmp_path / "nope.gguf", alias="nope", log_path=tmp_path / "n.log")
    with pytest.raises(ServerError, match=r"^nope: model .*nope\.gguf does not exist$") as e:
        server.start()
    assert "\n" not in str(e.value) and server.process is None


@needs_serve
def test_a_checkpoint_that_cannot_load_is_reported_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    server = TransformersServer(bad, alias="broken", settings=ServerSettings(n_threads=1, startup_timeout_s=120),
                                log_path=tmp_path / "b.log")
    with pytest.raises(ServerError, match=r"^broken: transformers server exited with code \d+ during start-up: .+ "
                                          r"\(log: .*b\.log\)$") as e:
        server.start()
    assert "\n" not in str(e.value)
    assert server.process.poll() is not None


def test_an_unknown_server_kind_fails_on_first_use_naming_the_variable(monkeypatch):
    monkeypatch.setenv("CONDUCTOR_EMBEDDED_SERVER", "vllm")
    servers = EmbeddedServers()   # runs that need no embedded model never look at it
    with pytest.raises(ServerError, match=r"^CONDUCTOR_EMBEDDED_SERVER 'vllm': expected llamacpp, transformers or "
                                          r"auto$"):
        servers.url(SMOL)
    assert servers.servers == {}


def test_resolution_refuses_sampling_the_server_would_ignore_before_starting_anything(monkeypatch):
    monkeypatch.setenv("CONDUCTOR_EMBEDDED_SERVER", "transformers")
    pool = parse_pool(f"""
pool_id: t
workers:
  - {{name: ok, provider: local, model: {SMOL}, base_url: "embedded://{SMOL}"}}
  - {{name: pp, provider: local, model: {SMOL}, base_url: "embedded://{SMOL}", sampling: {{presence_penalty: 0.5}}}}
""")
    servers = EmbeddedServers()
    with pytest.raises(ServerError, match=r"^worker pp: sampling\.presence_penalty is not supported by the "
                                          r"transformers server \(.*CONDUCTOR_EMBEDDED_SERVER=llamacpp\)$"):
        resolve_embedded(pool, servers)
    assert servers.servers == {}, "no server may start for a pool that cannot run"


def test_the_serving_directory_links_the_checkpoint_and_samples_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path / "home"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"w")
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "temperature": 0.7, "top_k": 20,
                                                             "repetition_penalty": 1.1}))
    d = serving_dir(ckpt, "m")
    assert d.name == "m" and (d / "model.safetensors").resolve() == (ckpt / "model.safetensors").resolve()
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen == {"eos_token_id": 2, "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    assert json.loads((ckpt / "generation_config.json").read_text())["top_k"] == 20, "the checkpoint is not touched"
    mtime = (d / "generation_config.json").stat().st_mtime_ns
    assert serving_dir(ckpt, "m") == d and (d / "generation_config.json").stat().st_mtime_ns == mtime
    (ckpt / "tokenizer.json").write_text("{}")   # the checkpoint changed: rebuilt
    assert (serving_dir(ckpt, "m") / "tokenizer.json").is_file()
