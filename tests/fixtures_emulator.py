"""Shared fixtures for the execution-engine tests: a live provider emulator and pools pointing at it.

Import the fixtures into a test module with ``from tests.fixtures_emulator import *``-style
explicit imports; every test drives the real SDK clients over 127.0.0.1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from conductor.testing.emulator import Emulator
from conductor.trajectory import Round, Trajectory, trajectory_id
from conductor.workers.pool import Pool, Worker

FAKE_KEYS = {
    "EMU_OPENAI_KEY": "sk-emu-openai-7f3a9c1e5b2d4f60a8c7",
    "EMU_ANTHROPIC_KEY": "sk-ant-emu-2b8e6d4c1a9f7e53b1d0",
    "EMU_GEMINI_KEY": "AIzaEmuGeminiKey0123456789abcdefghijkl",
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    old = {k: os.environ.get(k) for k in FAKE_KEYS}
    os.environ.update(FAKE_KEYS)
    emu = Emulator().start()
    try:
        yield emu
    finally:
        emu.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture()
def emu(emulator: Emulator) -> Emulator:
    """The module's emulator, reset to defaults for this test."""
    emulator.configure(latency_s=0.0, latency_jitter_s=0.0, rpm=None, retry_after_s=0.05, hang_s=3600.0,
                       api_key=None, scripted=[], faults=[], reply_prefix="")
    emulator.reset()
    return emulator


def worker(emu: Emulator, name: str, provider: str = "openai", **kw: Any) -> Worker:
    base = {"openai": emu.base_url + "/v1", "openai_compatible": emu.base_url + "/v1",
            "local": emu.base_url + "/v1"}.get(provider, emu.base_url)
    env = {"openai": "EMU_OPENAI_KEY", "anthropic": "EMU_ANTHROPIC_KEY", "google": "EMU_GEMINI_KEY"}.get(provider)
    args: dict[str, Any] = {"name": name, "provider": provider, "model": kw.pop("model", f"{name}-model"),
                            "base_url": base, "api_key_env": env}
    limits = {"timeout_s": 5.0, "max_retries": 6, "max_concurrency": 32}
    limits.update(kw.pop("limits", {}))
    args["limits"] = limits
    args.update(kw)
    return Worker.model_validate(args)


def three_provider_pool(emu: Emulator, **kw: Any) -> Pool:
    return Pool(pool_id="emu", workers=(worker(emu, "gpt", "openai", **kw), worker(emu, "claude", "anthropic", **kw),
                                        worker(emu, "gemini", "google", **kw)))


def make_traj(completion: str, question: str = "What is 6 * 7?", sample: int = 0, qid: str = "q0",
              prompt: str = "CONDUCTOR PROMPT") -> Trajectory:
    return Trajectory(trajectory_id=trajectory_id("test", qid, sample), run_id="test", kind="eval", question_id=qid,
                      dataset="unit", domain="math", question=question, sample_index=sample,
                      rounds=[Round(depth=0, prompt=prompt, completion=completion)])


def lists(model_id: list[int], subtasks: list[str], access: list[Any]) -> str:
    return f"Plan.\nmodel_id = {model_id!r}\nsubtasks = {subtasks!r}\naccess_list = {access!r}"
