"""One server subprocess serving one model: start it, wait until it answers, stop it.

WHY a module of its own: both kinds of local server (llama.cpp in ``servers``, transformers in
``transformers_server``) subclass ``ServerProcess``, and ``servers`` picks the kind at run time;
with the base here neither server module imports the other's module at import time.
Every started process is stopped at exit (atexit) if nobody stopped it before.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from conductor.workers.startup import StartError

if TYPE_CHECKING:
    from conductor.workers.pool import Worker

log = logging.getLogger(__name__)


class ServerError(StartError):
    """A server that would not start or answer; one line, names the model and its log."""


@dataclass(frozen=True)
class ServerSettings:
    n_ctx: int = 4096
    n_threads: int | None = None     # None: all cores but one (spinning OpenMP threads starve a busy small machine)
    n_batch: int = 512
    logits_all: bool = False         # True makes the server return logprobs, at a prompt-processing cost
    startup_timeout_s: float = 180.0
    extra_args: tuple[str, ...] = ()  # appended to the server command (llama.cpp or transformers flags, per kind)


THREADS_ENV = "CONDUCTOR_LOCAL_THREADS"   # the local servers' thread count when set (bench/answer_flow.py tries each)


def default_threads() -> int:
    """All cores but one, at least one; ``$CONDUCTOR_LOCAL_THREADS`` (a positive integer) when set, e.g. all
    cores for a model that runs alone on an idle machine."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ServerError(f"{THREADS_ENV}={env!r}: expected a positive number of threads")
        return int(env)
    return max(1, (os.cpu_count() or 1) - 1)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess(ABC):
    """One server subprocess serving one model under an alias: start, wait until healthy, stop.

    Subclasses say how to launch it (``command``, ``env``, ``cwd``), what to check or
    build first (``prepare``) and how to tell it is ready (``healthy``).
    """

    model_path: Path
    alias: str
    settings: ServerSettings = field(default_factory=ServerSettings)
    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    process: subprocess.Popen | None = None

    label: ClassVar[str] = "server"          # for messages: "<alias>: <label> exited ..."
    log_prefix: ClassVar[str] = "server"     # log file: <log_prefix>-<alias>-<port>.log

    @property
    def url(self) -> str:
        """The OpenAI base URL (with /v1)."""
        return f"http://{self.host}:{self.port}/v1"

    @abstractmethod
    def command(self) -> list[str]:
        """The argv that starts the server."""

    @abstractmethod
    def healthy(self) -> bool:
        """True once the server answers requests for this model."""

    def prepare(self) -> None:
        """Check (or build) what the server needs before it starts; raise ServerError if impossible."""
        if not self.model_path.is_file():
            raise ServerError(f"{self.alias}: model file {self.model_path} does not exist")

    def env(self) -> dict[str, str] | None:
        """The child's environment (None: inherit ours)."""
        return None

    def cwd(self) -> Path | None:
        return None

    @classmethod
    def adapt(cls, worker: Worker, alias: str) -> Worker:
        """The worker as a server of this kind for ``alias`` needs it called; unchanged by default.

        A classmethod so resolution can check every worker before starting any server.
        """
        return worker

    def start(self) -> ServerProcess:
        if self.process is not None and self.process.poll() is None:
            return self
        self.port = self.port or free_port(self.host)
        if self.log_path is None:
            from conductor.local.embedded import conductor_home

            self.log_path = conductor_home() / "logs" / f"{self.log_prefix}-{self.alias}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.prepare()
        log_file = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(self.command(), stdout=log_file, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, env=self.env(),
                                            cwd=self.cwd())
        finally:
            log_file.close()
        _LIVE.append(self)
        try:
            self.wait_healthy(self.settings.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(f"{self.alias}: {self.label} exited with code {self.process.returncode} during "
                                  f"start-up: {_last_line(self.log_path)} (log: {self.log_path})")
            if self.healthy():
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
        raise ServerError(f"{self.alias}: {self.label} not healthy after {timeout_s:.0f}s (log: {self.log_path})")

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

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_LIVE: list[ServerProcess] = []


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
