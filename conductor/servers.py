"""llama.cpp OpenAI-compatible servers that the project starts, health-checks and stops itself.

WHY: the embedded pool's workers are ordinary OpenAI-compatible endpoints, so the
same provider code calls a local 135M model and a frontier API. A pool manifest
names an embedded worker as ``base_url: embedded://<model>``; ``resolve_embedded``
starts one ``python -m llama_cpp.server`` per distinct model on 127.0.0.1 and a
free port, waits until ``/v1/models`` answers, and returns the pool with real
URLs. Servers die with the process (atexit) or when the context manager exits;
their output goes to a log file, never to the terminal.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from conductor.pool import Pool

EMBEDDED_SCHEME = "embedded://"


class ServerError(RuntimeError):
    """A server that would not start or answer; one line, names the model and its log."""


@dataclass(frozen=True)
class ServerSettings:
    n_ctx: int = 4096
    n_threads: int | None = None     # None: all cores but one (spinning OpenMP threads starve a busy small machine)
    n_batch: int = 512
    logits_all: bool = False         # True makes the server return logprobs, at a prompt-processing cost
    startup_timeout_s: float = 180.0
    extra_args: tuple[str, ...] = ()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    """One ``llama_cpp.server`` subprocess serving one GGUF file under an alias."""

    model_path: Path
    alias: str
    settings: ServerSettings = field(default_factory=ServerSettings)
    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL (with /v1)."""
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        s = self.settings
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path), "--model_alias", self.alias,
               "--host", self.host, "--port", str(self.port), "--n_ctx", str(s.n_ctx), "--n_batch", str(s.n_batch),
               "--n_threads", str(s.n_threads or max(1, (os.cpu_count() or 1) - 1))]
        if s.logits_all:
            cmd += ["--logits_all", "true"]
        return cmd + list(s.extra_args)

    def start(self) -> "LlamaServer":
        if self.process is not None and self.process.poll() is None:
            return self
        if not self.model_path.is_file():
            raise ServerError(f"{self.alias}: model file {self.model_path} does not exist")
        self.port = self.port or free_port(self.host)
        if self.log_path is None:
            from conductor.embedded import conductor_home

            self.log_path = conductor_home() / "logs" / f"llama-server-{self.alias}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        finally:
            log.close()
        _LIVE.append(self)
        try:
            self.wait_healthy(self.settings.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def healthy(self) -> bool:
        """True when ``GET /v1/models`` lists this server's alias."""
        try:
            with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                return r.status == 200 and self.alias.encode() in r.read()
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(f"{self.alias}: llama.cpp server exited with code {self.process.returncode} during start-up: "
                                  f"{_last_line(self.log_path)} (log: {self.log_path})")
            if self.healthy():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
        raise ServerError(f"{self.alias}: llama.cpp server not healthy after {timeout_s:.0f}s (log: {self.log_path})")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate, then kill if it does not exit in time; safe to call twice."""
        p = self.process
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout_s)
        if self in _LIVE:
            _LIVE.remove(self)

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_LIVE: list[LlamaServer] = []


def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop(timeout_s=5)


atexit.register(_stop_all)


def _last_line(path: Path | None) -> str:
    try:
        lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()] if path else []
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"


class EmbeddedServers:
    """The set of servers for the embedded models a run uses; a context manager that stops them all."""

    def __init__(self, settings: ServerSettings | None = None, data_dir: str | Path | None = None,
                 per_model: dict[str, ServerSettings] | None = None):
        self.settings = settings
        self.data_dir = data_dir
        self.per_model = dict(per_model or {})
        self.servers: dict[str, LlamaServer] = {}

    def url(self, name: str) -> str:
        """The base URL for an embedded model, starting its server on first use."""
        from conductor.embedded import model_path, spec_for

        spec = spec_for(name)
        server = self.servers.get(spec.name)
        if server is None or server.process is None or server.process.poll() is not None:
            settings = self.per_model.get(spec.name) or self.settings or ServerSettings(n_ctx=spec.n_ctx)
            server = LlamaServer(model_path(spec.name, self.data_dir), alias=spec.name, settings=settings).start()
            self.servers[spec.name] = server
        return server.url

    def start(self, names: Iterable[str]) -> dict[str, str]:
        return {n: self.url(n) for n in names}

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def __enter__(self) -> "EmbeddedServers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def embedded_name(base_url: str | None) -> str | None:
    """The model named by an ``embedded://`` URL, else None.

    >>> embedded_name("embedded://smollm2-135m-instruct")
    'smollm2-135m-instruct'
    >>> embedded_name("http://127.0.0.1:8000/v1") is None
    True
    """
    if base_url and base_url.startswith(EMBEDDED_SCHEME):
        return base_url[len(EMBEDDED_SCHEME):].strip("/")
    return None


def embedded_models(pool: "Pool") -> list[str]:
    """Distinct embedded models a pool needs, in manifest order."""
    seen: list[str] = []
    for w in pool.workers:
        name = embedded_name(w.base_url)
        if name is not None and name not in seen:
            seen.append(name)
    return seen


def resolve_embedded(pool: "Pool", servers: EmbeddedServers | None = None) -> tuple["Pool", EmbeddedServers]:
    """Start servers for every ``embedded://`` worker and return (pool with real URLs, servers).

    Compute ``pool.fingerprint`` (and any cache keys) from the manifest pool, before
    resolution: the resolved URLs carry a port that changes from run to run.
    Use the returned ``EmbeddedServers`` as a context manager to stop them.
    """
    from conductor.cache import MANIFEST_URL_OPTION   # the cache keys on it, so it survives new ports

    servers = servers or EmbeddedServers()
    workers = []
    for w in pool.workers:
        name = embedded_name(w.base_url)
        workers.append(w.model_copy(update={"base_url": servers.url(name),
                                            "options": {**w.options, MANIFEST_URL_OPTION: w.base_url}}) if name else w)
    return pool.model_copy(update={"workers": tuple(workers)}), servers
