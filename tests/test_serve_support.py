"""Shared by the serve tests and bench/serve.py: a simulated pool that knows the gold answers of a question
set (options.gold_path), and `conductor serve` on loopback in a background thread."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def questions(n: int, offset: int = 0) -> list[tuple[str, str]]:
    """(question, gold) arithmetic items, distinct for distinct i."""
    out = []
    for i in range(offset, offset + n):
        a, b = 17 + i * 7 % 89, 5 + i * 13 % 61
        out.append((f"Question {i}: a shop sells {a} apples in the morning and {b} in the afternoon. "
                    "How many apples does it sell in total? Give the final answer in <answer></answer> tags.",
                    str(a + b)))
    return out


def simulated_pool(tmp: Path, items: list[tuple[str, str]], latency_s: float = 0.0,
                   skills: float | None = None) -> Path:
    """data/pools/simulated.yaml with a gold file for ``items`` (and a fixed latency per call)."""
    import json

    gold = tmp / "gold.jsonl"
    gold.write_text("".join(json.dumps({"question": q, "gold": g, "domain": "math"}) + "\n" for q, g in items))
    doc = yaml.safe_load((ROOT / "data/pools/simulated.yaml").read_text())
    for w in doc["workers"]:
        w["options"]["gold_path"] = str(gold)
        w["options"]["latency_s"] = latency_s
        if skills is not None:
            w["options"]["skills"] = {"default": skills, "math": skills}
        w["limits"]["max_concurrency"] = 256
    path = tmp / "pool.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving ``create_app(config)`` on 127.0.0.1 in a thread; ``base_url`` for the openai SDK."""

    def __init__(self, config: Any):
        import uvicorn

        from conductor.serve.app import create_app

        self.port = free_port()
        self.app = create_app(config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error",
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine(self) -> Any:
        return self.app.state.server.engine

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("conductor serve did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@contextmanager
def keyed_server(tmp: Path, pool: Path, key_env: str, key: str, **overrides: Any) -> Iterator[LiveServer]:
    """`conductor serve` over ``pool`` (Mixture-of-Agents 0+1 -> 2, registry and lake in ``tmp``) accepting one
    API key, ``key``, read from ``key_env``; the variable is removed when the server stops."""
    from conductor.serve.config import ServeConfig

    os.environ[key_env] = f"tester={key}"
    cfg = ServeConfig(pool=str(pool), conductor="moa:0+1:2", registry=str(tmp / "registry"), reload_s=0,
                      lake=str(tmp / "lake"), lake_flush_s=0.2, api_keys_env=key_env, key_rpm=None, **overrides)
    try:
        with LiveServer(cfg) as s:
            yield s
    finally:
        os.environ.pop(key_env, None)
