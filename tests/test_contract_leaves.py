"""The shared leaves the contracts sank to (#50): answer extraction and number parsing (``conductor/extract/``),
the sandbox (``conductor/sandbox.py``), the generation protocol (``conductor/generation.py``), and the start of a
reserved server handed to the providers (``conductor/workers/startup.py``) instead of imported from ``local/``."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conductor.testing.emulator import Emulator
from conductor.workers import startup
from conductor.workers.providers.base import Message, ProviderError, make_provider
from tests.fixtures_emulator import emu, emulator, worker  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
LEAVES = ["conductor.extract.answer", "conductor.extract.numbers", "conductor.generation", "conductor.sandbox",
          "conductor.workers.startup"]


def test_the_leaves_import_nothing_of_the_project_but_where_its_files_are() -> None:
    code = (f"import sys\nimport {', '.join(LEAVES)}\n"
            "import json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('conductor'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=120,
                         check=True).stdout
    loaded = set(json.loads(out.splitlines()[-1]))
    package = {"conductor", "conductor.workflow", "conductor.extract", "conductor.workers"}   # what the packages load
    assert loaded <= package | {"conductor.resources", *LEAVES}, loaded


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("upper", ["conductor.grading", "conductor.execution", "conductor.policy", "conductor.local"])
def test_workers_reach_no_floor_above_them(upper: str) -> None:
    """workers/ is the pool and the providers: extraction, the sandbox, the generation protocol and a server's
    start come from the leaves, at module level and inside functions alike."""
    offenders = [f"{p.relative_to(ROOT)}: {m}" for p in sorted((ROOT / "conductor" / "workers").rglob("*.py"))
                 for m in _imports(p) if m == upper or m.startswith(upper + ".")]
    assert offenders == []


def _complete(w):
    async def go():
        p = make_provider(w)
        try:
            return await p.complete([Message("user", "hello")])
        finally:
            await p.aclose()
    return asyncio.run(go())


def test_a_local_worker_starts_what_the_runtime_handed_in_before_its_request(emu: Emulator) -> None:
    w = worker(emu, "smol", "local")
    calls: list[int] = []

    def start() -> None:
        calls.append(emu.stats().get("openai:ok", 0))   # requests answered when the start ran

    startup.on_first_request(w.base_url, start)
    try:
        assert _complete(w).text.startswith("reply from smol-model")
        assert calls == [0], "the start runs before the first request"
    finally:
        startup.forget(w.base_url)
    _complete(w)
    assert calls == [0], "a forgotten server is not started again"


def test_a_server_that_will_not_start_is_a_permanent_provider_error_and_sends_nothing(emu: Emulator) -> None:
    from conductor.local.process import ServerError

    w = worker(emu, "smol", "local")

    def start() -> None:
        raise ServerError("smol: model would not load (see /tmp/smol.log)")

    startup.on_first_request(w.base_url, start)
    try:
        with pytest.raises(ProviderError) as err:
            _complete(w)
    finally:
        startup.forget(w.base_url)
    assert err.value.kind == "permanent"
    assert str(err.value) == "worker smol: smol: model would not load (see /tmp/smol.log)"
    assert emu.stats().get("openai:ok", 0) == 0
