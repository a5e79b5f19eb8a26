"""infra/quickstart.sh's control flow: the real script, run by bash from a copy of infra/ whose install.sh does
nothing, with PYTHON pointing at a stand-in that records each `-m conductor ...` call and exits with the status a
test chooses. (What the commands themselves print is tested with the commands.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

STAND_IN = """#!/usr/bin/env bash
echo "$3" >> "$CALLS"
case "$3" in
  answer) exit "${ANSWER_RC:-0}" ;;
  compare) exit "${COMPARE_RC:-0}" ;;
esac
"""


def run_quickstart(tmp_path: Path, answer_rc: int, compare_rc: int = 0) -> tuple[int, list[str], str]:
    (tmp_path / "infra").mkdir()
    shutil.copy(ROOT / "infra" / "quickstart.sh", tmp_path / "infra" / "quickstart.sh")
    (tmp_path / "infra" / "install.sh").write_text("exit 0\n")
    py = tmp_path / "python"
    py.write_text(STAND_IN)
    py.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(py), "CALLS": str(calls), "ANSWER_RC": str(answer_rc),
           "COMPARE_RC": str(compare_rc)}
    done = subprocess.run(["bash", str(tmp_path / "infra" / "quickstart.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    lines = calls.read_text().split() if calls.exists() else []
    return done.returncode, lines, done.stdout


def test_a_clean_run_answers_then_compares(tmp_path: Path) -> None:
    rc, calls, out = run_quickstart(tmp_path, answer_rc=0)
    assert (rc, calls) == (0, ["answer", "compare"]) and "What the comparison can and cannot say" in out


def test_infrastructure_failures_still_compare_and_end_with_4(tmp_path: Path) -> None:
    """Exit 4 of `conductor answer` (some questions failed on infrastructure, e.g. a worker timed out) used to stop
    the script under `set -e`: a newcomer got no comparison at all (found on a loaded machine, issue #48)."""
    rc, calls, out = run_quickstart(tmp_path, answer_rc=4)
    assert (rc, calls) == (4, ["answer", "compare"]) and "What the comparison can and cannot say" in out


@pytest.mark.parametrize("answer_rc", [1, 2])
def test_other_failures_stop_before_the_comparison(tmp_path: Path, answer_rc: int) -> None:
    rc, calls, _ = run_quickstart(tmp_path, answer_rc=answer_rc)
    assert (rc, calls) == (answer_rc, ["answer"])


def test_a_comparison_with_infrastructure_failures_ends_with_4(tmp_path: Path) -> None:
    rc, calls, out = run_quickstart(tmp_path, answer_rc=0, compare_rc=4)
    assert (rc, calls) == (4, ["answer", "compare"]) and "What the comparison can and cannot say" in out


def test_a_broken_comparison_fails_the_script(tmp_path: Path) -> None:
    rc, calls, _ = run_quickstart(tmp_path, answer_rc=0, compare_rc=2)
    assert (rc, calls) == (2, ["answer", "compare"])
