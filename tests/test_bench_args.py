"""The bench scripts' argument mistakes are one line with exit 2, and nothing starts (issue #51, item 14).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script, args, needle", [
    ("replay_learning.py", ["--lambdas", "abc"], "--lambdas"),
    ("replay_learning.py", ["--split", "abc"], "--split"),
    ("replay_learning.py", ["--split", "0.9,0.5"], "test share"),
    ("replay_learning.py", ["--lr", "nan"], "--lr"),
    ("replay_learning.py", ["--lr", "-1"], "--lr"),
    ("replay_learning.py", ["--dataset", "nosuch"], "unknown dataset 'nosuch'"),
    ("replay_learning.py", ["--pool", "missing.yaml"], "missing.yaml"),
    ("replay_learning.py", ["--split", "0.999,0.0005"], "empty"),
    ("robustness.py", ["--lr", "nan"], "--lr"),
    ("learning.py", ["--lr", "-1"], "--lr"),
    ("learning_local.py", ["--lr", "nan"], "--lr"),
])
def test_14_bench_argument_mistakes_are_one_line(script, args, needle, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args, "--headroom-only"
                        if script == "replay_learning.py" else "--quick", *(["--state", str(tmp_path)]
                        if script == "replay_learning.py" else [])],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and needle in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
    assert not list(tmp_path.iterdir())          # nothing started
