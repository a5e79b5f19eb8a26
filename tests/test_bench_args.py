"""The bench scripts' argument mistakes are one line with exit 2, and nothing starts (issue #51, item 14; the
finished experiments' scripts left bench/ in #50, their settings' checks are tested where they now live; the
replay stage's options in tests/test_workflow_replay.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args, needle", [
    (["record", "--shard", "2/2"], "--shard"),
    (["record", "--shard", "x"], "--shard"),
])
def test_workflow_replay_record_argument_mistakes_are_one_line(args, needle, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "workflow_replay.py"), *args,
                        "--cache", str(tmp_path / "rec.sqlite")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and needle in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
    assert not list(tmp_path.iterdir())          # nothing started


@pytest.mark.parametrize("args, needle", [
    (["--tree-b", "/nonexistent/tree"], "--tree-b /nonexistent/tree: not a conductor source tree"),
    (["--env-b", "NOVALUE"], "--env-b 'NOVALUE': expected NAME=VALUE"),
    (["--rounds", "0"], "--rounds"),
])
def test_serve_pair_argument_mistakes_are_one_line(args, needle):
    """bench/serve_pair.py refuses a bad tree, a bad variable or no rounds before any server starts."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "serve_pair.py"), *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr and needle in last, r.stderr[-2000:]
    assert "round" not in r.stdout               # no round ran
