"""Providers through the real SDK clients against the local emulator (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import os

import pytest

from conductor.generation import Generation, GenerationParams
from conductor.testing.emulator import Emulator
from conductor.workers.pool import Worker
from conductor.workers.providers.base import Message, ProviderError, make_provider
from conductor.workers.providers.conductor import bind_conductor, unbind_conductor
from tests.fixtures_emulator import FAKE_KEYS, emu, emulator, worker  # noqa: F401

PROVIDERS = ["openai", "anthropic", "google", "openai_compatible", "local"]
ROUTE = {"openai": "openai", "openai_compatible": "openai", "local": "openai", "anthropic": "anthropic", "google": "gemini"}


async def _complete(w: Worker, text: str = "hello there", sample_index: int = 0):
    p = make_provider(w)
    try:
        return await p.complete([Message("user", text)], sample_index=sample_index)
    finally:
        await p.aclose()


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_happy_path_reads_text_and_usage(emu: Emulator, provider: str) -> None:
    w = worker(emu, f"w-{provider}", provider)
    c = run(_complete(w, "x" * 400))
    assert c.text.startswith(f"reply from {w.model} to ")
    assert c.input_tokens == 100          # the emulator bills len/4 of the prompt
    assert c.output_tokens == len(c.text) // 4
    assert c.finish_reason == "stop"
    assert emu.stats()[f"{ROUTE[provider]}:ok"] == 1


def test_openai_extra_body_and_reasoning_effort(emu: Emulator) -> None:
    w = worker(emu, "qwen", "openai_compatible",
               sampling={"top_k": 20, "top_p": 0.8, "presence_penalty": 1.0, "enable_thinking": False,
                         "assistant_prefill": "Let me solve this step by step."})
    run(_complete(w))
    body = emu.requests()[-1]["body"]
    assert body["top_k"] == 20 and body["presence_penalty"] == 1.0 and body["top_p"] == 0.8
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["max_tokens"] == 4096
    assert body["messages"][-1] == {"role": "assistant", "content": "Let me solve this step by step."}
    gpt = worker(emu, "gpt5", "openai", sampling={"reasoning_effort": "minimal"})
    run(_complete(gpt))
    body = emu.requests()[-1]["body"]
    assert body["reasoning_effort"] == "minimal" and body["max_completion_tokens"] == 4096
    assert "temperature" not in body   # reasoning models reject it


def test_anthropic_thinking_budget_rules(emu: Emulator) -> None:
    off = worker(emu, "claude0", "anthropic", sampling={"thinking_budget": 0, "assistant_prefill": "Let me"})
    run(_complete(off))
    body = emu.requests()[-1]["body"]
    assert "thinking" not in body and body["temperature"] == 0.2
    assert body["messages"][-1] == {"role": "assistant", "content": "Let me"}
    on = worker(emu, "claude128", "anthropic", sampling={"thinking_budget": 128, "assistant_prefill": "Let me"})
    c = run(_complete(on))
    body = emu.requests()[-1]["body"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}   # Anthropic's minimum
    assert body["messages"][-1]["role"] == "user"                           # no prefill with thinking
    assert "temperature" not in body
    assert c.text.startswith("reply from")                                  # thinking block skipped


def test_gemini_thinking_budget_and_system(emu: Emulator) -> None:
    w = worker(emu, "gem", "google", sampling={"thinking_budget": 128, "system_prompt": "Be brief."})
    c = run(_complete(w))
    body = emu.requests()[-1]["body"]
    tc = body["generationConfig"]["thinkingConfig"]
    assert tc.get("thinkingBudget", tc.get("thinking_budget")) == 128
    assert body["systemInstruction"]["parts"][0]["text"] == "Be brief."
    assert c.output_tokens == len(c.text) // 4 + 8     # thinking tokens are billed as output


@pytest.mark.parametrize("provider", ["openai", "anthropic", "google"])
def test_errors_are_classified(emu: Emulator, provider: str) -> None:
    w = worker(emu, f"e-{provider}", provider, limits={"timeout_s": 1.0})
    expect = {"429": "rate_limited", "500": "server", "503": "server", "malformed": "malformed",
              "badschema": "malformed", "400": "permanent", "401": "auth"}
    for fault, kind in expect.items():
        with pytest.raises(ProviderError) as ei:
            run(_complete(w, f"q [[fault:{fault}]]"))
        assert ei.value.kind == kind, (fault, str(ei.value))
        if fault == "429":
            assert ei.value.retry_after == pytest.approx(0.05)
        assert FAKE_KEYS["EMU_OPENAI_KEY"] not in str(ei.value)


def test_hang_becomes_timeout(emu: Emulator) -> None:
    w = worker(emu, "slow", "openai", limits={"timeout_s": 0.5})
    with pytest.raises(ProviderError) as ei:
        run(_complete(w, "q [[fault:hang]]"))
    assert ei.value.kind == "timeout"


def test_truncated_and_empty_replies_are_not_errors(emu: Emulator) -> None:
    w = worker(emu, "short", "anthropic", sampling={"max_tokens": 2})
    c = run(_complete(w))
    assert c.finish_reason == "length" and len(c.text) == 8
    c = run(_complete(worker(emu, "e", "google"), "q [[fault:empty]]"))
    assert c.text == "" and c.output_tokens == 0


def test_missing_key_names_the_variable_never_a_value(emu: Emulator) -> None:
    os.environ.pop("EMU_UNSET_KEY", None)
    w = worker(emu, "nokey", "anthropic", api_key_env="EMU_UNSET_KEY")
    with pytest.raises(ProviderError) as ei:
        make_provider(w)
    assert ei.value.kind == "missing_key"
    assert "EMU_UNSET_KEY" in str(ei.value) and "nokey" in str(ei.value)


def test_key_echoed_by_provider_is_redacted(emu: Emulator) -> None:
    emu.configure(api_key="the-right-key")
    for provider, env in (("openai", "EMU_OPENAI_KEY"), ("google", "EMU_GEMINI_KEY"), ("anthropic", "EMU_ANTHROPIC_KEY")):
        with pytest.raises(ProviderError) as ei:
            run(_complete(worker(emu, f"k-{provider}", provider)))
        assert ei.value.kind == "auth"
        assert FAKE_KEYS[env] not in str(ei.value)


def test_unknown_provider_module_is_a_clear_error() -> None:
    w = Worker(name="sim", provider="simulated", model="m")
    try:
        make_provider(w)
    except ProviderError as e:
        assert "simulated" in str(e) and e.kind == "permanent"


class _ScriptedPolicy:
    """A deterministic policy backend (the conductor-as-worker wrapper is what is under test)."""

    name = "scripted"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        self.prompts.extend(prompts)
        return [[Generation(text=f"policy saw {len(p)} chars", token_ids=[1, 2, 3], prompt_token_ids=[9] * 5,
                            finish_reason="stop")] * n for p in prompts]


def test_conductor_as_worker_uses_bound_policy() -> None:
    w = Worker(name="self", provider="conductor", model="conductor")
    unbind_conductor()
    with pytest.raises(ProviderError, match="no live conductor"):
        run(_complete(w))
    policy = _ScriptedPolicy()
    bind_conductor(policy)
    try:
        c = run(_complete(w, "route this"))
    finally:
        unbind_conductor()
    assert c.text == "policy saw 10 chars" and (c.input_tokens, c.output_tokens) == (5, 3)
    assert policy.prompts == ["route this"]


def test_preflight_names_impossible_limits_and_missing_keys(tmp_path) -> None:
    from typer.testing import CliRunner

    from conductor.cli import app

    os.environ.pop("EMU_PREFLIGHT_UNSET", None)
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(
        "pool_id: p\nworkers:\n"
        "  - {name: tiny, provider: openai_compatible, model: m, base_url: 'http://127.0.0.1:9/v1',\n"
        "     limits: {tokens_per_minute: 100}}\n"
        "  - {name: nokey, provider: anthropic, model: c, api_key_env: EMU_PREFLIGHT_UNSET}\n")
    r = CliRunner().invoke(app, ["preflight", str(manifest)])
    assert r.exit_code == 2
    assert "tokens_per_minute 100" in r.output and "EMU_PREFLIGHT_UNSET is not set" in r.output
