"""Shared test set-up: an isolated Prefect home (ephemeral mode), no analytics, hypothesis without deadlines,
slow real-model tests skipped unless asked for (`-m slow` or CONDUCTOR_RUN_SLOW=1), and the fixtures several
test files share (`tiny`: one tiny checkpoint per session)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

_PREFECT_HOME = tempfile.mkdtemp(prefix="conductor-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs two test files at a time on two cores (xdist): an engine per test on one thread keeps their
# spinning llama.cpp threads from slowing each other (a run's own layout gives all cores to a serial one:
# conductor/local/layout.py; tests that check the thread count set or clear this themselves).
os.environ.setdefault("CONDUCTOR_LOCAL_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

settings.register_profile("conductor", deadline=None, print_blob=True)
settings.load_profile("conductor")

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("CONDUCTOR_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """On a native crash print the crashing thread's stack only, not every thread's.

    WHY: CI shows the beginning of a long output. A segfault in CI (stop 20) printed three idle threads first,
    and the crashing one, listed last, was cut off. pytest's own handler stays in place if its stash key moves.
    """
    import faulthandler

    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key
    except ImportError:
        return
    fd = config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.enable(file=fd, all_threads=False)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CONDUCTOR_RUN_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow real-model test: run with -m slow or CONDUCTOR_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A tiny random Llama checkpoint over a byte-level tokenizer (``grpo_fixtures.tiny_checkpoint``), built once
    per session: the tests that train, load or register it read it and write their results elsewhere."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from grpo_fixtures import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "base")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared datasets not found at {SHARED_DATA}")
    return SHARED_DATA
