"""The OpenAI-compatible servers that the project starts, health-checks and stops itself.

WHY: the embedded pool's workers are ordinary OpenAI-compatible endpoints, so the
same provider code calls a local 135M model and a frontier API. A pool manifest
names an embedded worker as ``base_url: embedded://<model>``; ``resolve_embedded``
starts one server per distinct model on 127.0.0.1 and a free port, waits until it
answers, and returns the pool with real URLs. The server is llama.cpp's
(``python -m llama_cpp.server``) when llama-cpp-python is importable, else the
transformers fallback (``conductor.local.transformers_server``, for machines without a
C++ compiler); ``CONDUCTOR_EMBEDDED_SERVER=llamacpp|transformers`` overrides the
choice. Servers die with the process (atexit) or when the context manager exits;
their output goes to a log file, never to the terminal.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from conductor.local.process import ServerError, ServerProcess, ServerSettings, default_threads, free_port
from conductor.workers import startup

if TYPE_CHECKING:
    from conductor.workers.pool import Pool

EMBEDDED_SCHEME = "embedded://"
SERVER_ENV = "CONDUCTOR_EMBEDDED_SERVER"
SERVER_KINDS = ("llamacpp", "transformers")

log = logging.getLogger(__name__)


@dataclass
class LlamaServer(ServerProcess):
    """One ``llama_cpp.server`` subprocess serving one GGUF file under an alias (any request model name works)."""

    label: ClassVar[str] = "llama.cpp server"
    log_prefix: ClassVar[str] = "llama-server"

    def command(self) -> list[str]:
        s = self.settings
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model_path), "--model_alias", self.alias,
               "--host", self.host, "--port", str(self.port), "--n_ctx", str(s.n_ctx), "--n_batch", str(s.n_batch),
               "--n_threads", str(s.n_threads or default_threads()),
               # prompts too: llama_cpp.server's default reads them on every core, a second OpenMP thread that spins
               # against the conductor and the other server beside it (a 600-token report step took 34 s instead of ~8)
               "--n_threads_batch", str(s.n_threads or default_threads())]
        if s.logits_all:
            cmd += ["--logits_all", "true"]
        return cmd + list(s.extra_args)

    def healthy(self) -> bool:
        """True when ``GET /v1/models`` lists this server's alias."""
        try:
            with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                return r.status == 200 and self.alias.encode() in r.read()
        except (urllib.error.URLError, OSError, ValueError):
            return False


def server_kind(requested: str | None = None) -> str:
    """Which server runs the embedded models: ``requested``, else ``$CONDUCTOR_EMBEDDED_SERVER``, else auto.

    Auto is llama.cpp when ``llama_cpp`` is importable (faster decode, quantised
    weights), else transformers (no compiler needed).

    >>> server_kind("transformers")
    'transformers'
    >>> server_kind("vllm")
    Traceback (most recent call last):
    ...
    conductor.local.process.ServerError: embedded server kind 'vllm': expected llamacpp, transformers or auto
    """
    source = "embedded server kind" if requested is not None else SERVER_ENV
    value = (requested if requested is not None else os.environ.get(SERVER_ENV, "")).strip().lower() or "auto"
    has_llama = importlib.util.find_spec("llama_cpp") is not None
    if value == "auto":
        return "llamacpp" if has_llama else "transformers"
    if value not in SERVER_KINDS:
        raise ServerError(f"{source} {value!r}: expected {', '.join(SERVER_KINDS)} or auto")
    if value == "llamacpp" and not has_llama:
        raise ServerError(f"{source} 'llamacpp': llama_cpp is not importable (install llama-cpp-python[server], "
                          f"or use transformers)")
    return value


class EmbeddedServers:
    """The set of servers for the embedded models a run uses; a context manager that stops them all.

    ``kind`` (``llamacpp``/``transformers``/``auto``; default ``$CONDUCTOR_EMBEDDED_SERVER`` or auto) is
    resolved on the first start, so a run that needs no embedded model never checks it.
    """

    def __init__(self, settings: ServerSettings | None = None, data_dir: str | Path | None = None,
                 per_model: dict[str, ServerSettings] | None = None, kind: str | None = None,
                 threads: int | None = None):
        self.settings = settings
        self.threads = threads     # every server's threads without settings of its own (conductor/local/layout.py)
        self.data_dir = data_dir
        self.per_model = dict(per_model or {})
        self.requested_kind = kind
        self._kind: str | None = None
        self.servers: dict[str, ServerProcess] = {}

    @property
    def kind(self) -> str:
        if self._kind is None:
            self._kind = server_kind(self.requested_kind)
            log.info("embedded models are served by %s", "llama.cpp (llama_cpp.server)" if self._kind == "llamacpp"
                     else "transformers (transformers serve)")
        return self._kind

    @property
    def server_class(self) -> type[ServerProcess]:
        if self.kind == "transformers":
            from conductor.local.transformers_server import TransformersServer

            return TransformersServer
        return LlamaServer

    def server(self, name: str, alias: str | None = None, settings: ServerSettings | None = None) -> ServerProcess:
        """The running server for an embedded model, started on first use.

        ``alias`` starts a second server of the same model under another name: the embedded conductor gets
        its own, so worker prompts never evict the KV cache of its long, shared prompt prefix.
        """
        from conductor.local.embedded import model_path, spec_for

        spec = spec_for(name)
        key = alias or spec.name
        server = self.servers.get(key)
        if server is None or server.process is None or server.process.poll() is not None:
            settings = settings or self.per_model.get(key) or self.settings or ServerSettings(n_ctx=spec.n_ctx, n_threads=self.threads)
            path = model_path(spec.name, self.data_dir)
            server = self.server_class(path, alias=key, settings=settings).start()
            self.servers[key] = server
        return server

    def url(self, name: str, alias: str | None = None, settings: ServerSettings | None = None) -> str:
        """The base URL for an embedded model, starting its server on first use."""
        return self.server(name, alias, settings).url

    def reserve(self, name: str, alias: str | None = None, settings: ServerSettings | None = None) -> str:
        """The base URL a server for ``name`` WILL answer on; it starts before the first request to it
        (``workers/startup.py``: the provider calls what is registered here).

        WHY: a rerun whose calls all hit the response cache, or a run that never routes to some worker,
        should not wait for models to load; callers start the server just before the first real request.
        """
        from conductor.local.embedded import model_path, spec_for

        spec = spec_for(name)
        key = alias or spec.name
        server = self.servers.get(key)
        if server is None:
            settings = settings or self.per_model.get(key) or self.settings or ServerSettings(n_ctx=spec.n_ctx, n_threads=self.threads)
            server = self.server_class(model_path(spec.name, self.data_dir), alias=key, settings=settings,
                                       port=free_port())
            self.servers[key] = server
        startup.on_first_request(server.url, functools.partial(_start_reserved, server))
        return server.url

    def start(self, names: Iterable[str]) -> dict[str, str]:
        return {n: self.url(n) for n in names}

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
            startup.forget(server.url)
        self.servers.clear()

    def __enter__(self) -> EmbeddedServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_START_LOCK = threading.Lock()


def _start_reserved(server: ServerProcess) -> None:
    """Start a reserved server if it is not running (what the ``local`` provider runs before a request to it,
    through ``workers/startup.py``). Blocking (model load and health check): the provider calls it off the
    event loop."""
    with _START_LOCK:
        if server.process is None or server.process.poll() is not None:
            log.info("starting %s for %s on first use", server.label, server.alias)
            server.start()


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


def embedded_models(pool: Pool) -> list[str]:
    """Distinct embedded models a pool needs, in manifest order."""
    seen: list[str] = []
    for w in pool.workers:
        name = embedded_name(w.base_url)
        if name is not None and name not in seen:
            seen.append(name)
    return seen


def resolve_embedded(pool: Pool, servers: EmbeddedServers | None = None,
                     lazy: bool = False, share: str | None = None) -> tuple[Pool, EmbeddedServers]:
    """Start servers for every ``embedded://`` worker and return (pool with real URLs, servers).

    Compute ``pool.fingerprint`` (and any cache keys) from the manifest pool, before
    resolution: the resolved URLs carry a port that changes from run to run.
    With ``lazy`` the servers are only reserved (``EmbeddedServers.reserve``): the ``local`` provider
    starts each one before its first request. Use the returned ``EmbeddedServers`` as a context manager to
    stop them. ``share``: the embedded workers hold one concurrency slot of that name between them (the serial
    layout, conductor/local/layout.py). Each worker
    is adapted to its server (``ServerProcess.adapt``): the transformers server only
    answers requests naming its model, so a worker's ``model`` becomes the server's.
    """
    from conductor.execution.cache import MANIFEST_URL_OPTION  # the cache keys on it, so it survives new ports
    from conductor.local.embedded import spec_for

    servers = servers or EmbeddedServers()
    adapted = []
    for w in pool.workers:   # adapt (and refuse what the server cannot do) before any server starts
        name = embedded_name(w.base_url)
        adapted.append((w if name is None else servers.server_class.adapt(w, spec_for(name).name), name))
    workers = []
    for w, name in adapted:
        if name is not None:
            options = {**w.options, MANIFEST_URL_OPTION: w.base_url}
            url = servers.reserve(name) if lazy else servers.url(name)
            update: dict[str, object] = {"base_url": url, "options": options}
            if share is not None:
                update["limits"] = w.limits.model_copy(update={"share": share, "max_concurrency": 1})
            w = w.model_copy(update=update)
        workers.append(w)
    return pool.model_copy(update={"workers": tuple(workers)}), servers
