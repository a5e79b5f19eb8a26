"""Shared by the serve tests: a simulated pool that knows the gold answers of a question set
(``conductor.testing.simulated_load``, which bench/serve.py uses too), and `conductor serve` on loopback in a
background thread."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conductor.testing.simulated_load import free_port, questions, simulated_pool

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "LiveServer", "free_port", "keyed_server", "questions", "simulated_pool"]


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
