from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.workers.pool import Pool, PoolError, Worker, load_pool, parse_pool

ROOT = Path(__file__).resolve().parent.parent
POOLS = sorted((ROOT / "data" / "pools").glob("*.yaml"))


@pytest.mark.parametrize("path", POOLS, ids=[p.name for p in POOLS])
def test_shipped_pools_validate(path):
    pool = load_pool(path)
    assert pool.workers and pool.id.startswith(pool.pool_id)


def test_paper_pool_has_the_papers_workers_and_settings():
    pool = load_pool(ROOT / "data/pools/paper.yaml")
    assert len(pool.workers) == 7
    assert {w.provider for w in pool.workers} == {"openai", "anthropic", "google", "openai_compatible"}
    assert all(w.sampling.max_tokens == 4096 and w.sampling.temperature == 0.2 for w in pool.workers)
    assert pool.worker("gpt-5").sampling.reasoning_effort == "minimal"
    assert pool.worker("gemini-2.5-pro").sampling.thinking_budget == 128
    assert pool.worker("qwen3-32b-thinking").sampling.enable_thinking is True
    assert all(w.api_key_env for w in pool.workers)


def test_base_url_env_expansion(monkeypatch):
    monkeypatch.setenv("VLLM_BASE_URL", "http://10.1.2.3:9000/v1")
    pool = load_pool(ROOT / "data/pools/paper.yaml")
    assert pool.worker("gemma-3-27b").base_url == "http://10.1.2.3:9000/v1"


BAD = {
    "not yaml": ("pool_id: x\nworkers: [\n", "invalid YAML"),
    "no workers": ("pool_id: x\nworkers: []\n", "workers"),
    "bad provider": ("pool_id: x\nworkers:\n  - name: a\n    provider: nope\n    model: m\n", "workers[0](a).provider"),
    "negative rpm": ("pool_id: x\nworkers:\n  - name: a\n    provider: openai\n    model: m\n    limits:\n      requests_per_minute: -1\n",
                     "workers[0](a).limits.requests_per_minute"),
    "key in manifest": ("pool_id: x\nworkers:\n  - name: a\n    provider: openai\n    model: m\n    api_key_env: sk-abc123\n", "api_key_env"),
    "unknown field": ("pool_id: x\nworkers:\n  - name: a\n    provider: openai\n    model: m\n    temprature: 1\n", "temprature"),
    "compat without url": ("pool_id: x\nworkers:\n  - name: a\n    provider: openai_compatible\n    model: m\n", "base_url"),
    "duplicate names": ("pool_id: x\nworkers:\n  - {name: a, provider: openai, model: m}\n  - {name: a, provider: openai, model: n}\n", "duplicate"),
    "not a mapping": ("- a\n- b\n", "mapping"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_manifests_give_one_line_errors(name, tmp_path):
    text, needle = BAD[name]
    f = tmp_path / "pool.yaml"
    f.write_text(text)
    with pytest.raises(PoolError) as e:
        load_pool(f)
    msg = str(e.value)
    assert msg.startswith(str(f)) and needle in msg and "\n" not in msg
    assert "sk-abc123" not in msg


def test_error_names_the_line(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("pool_id: x\nworkers:\n  - name: a\n    provider: openai\n    model: m\n    limits:\n      requests_per_minute: -1\n")
    with pytest.raises(PoolError, match=r"p\.yaml:7: "):
        load_pool(f)


def _pool(n):
    return Pool(pool_id="t", workers=[Worker(name=f"w{i}", provider="simulated", model=f"m{i}") for i in range(n)])


@given(st.integers(1, 9), st.data())
def test_sampling_is_seeded_and_maps_ordinals(n, data):
    pool = _pool(n)
    k = data.draw(st.integers(1, n))
    seed = data.draw(st.integers(0, 2**32))
    sub = pool.sample(k, seed)
    assert sub.names == pool.sample(k, seed).names
    assert len(set(sub.names)) == k == len(sub)
    for ordinal, name in enumerate(sub.names):
        assert sub.worker(ordinal).name == name
    with pytest.raises(PoolError):
        sub.worker(k)


def test_sampling_covers_all_subsets_eventually():
    pool = _pool(4)
    seen = {tuple(pool.sample(2, s).names) for s in range(200)}
    assert len(seen) == 6


def test_sample_bounds():
    with pytest.raises(PoolError):
        _pool(3).sample(4, 0)


def test_fingerprint_changes_with_behaviour_not_notes():
    a = parse_pool("pool_id: x\nworkers:\n  - {name: a, provider: openai, model: m, notes: one}\n")
    b = parse_pool("pool_id: x\nworkers:\n  - {name: a, provider: openai, model: m, notes: two}\n")
    c = parse_pool("pool_id: x\nworkers:\n  - {name: a, provider: openai, model: m2}\n")
    assert a.fingerprint == b.fingerprint != c.fingerprint
