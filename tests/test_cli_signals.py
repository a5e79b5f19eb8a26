"""Ctrl-C and SIGTERM reach the terminal as one ``error:`` line with exit 130 / 143 wherever the command is: while
its modules import, while it prepares its inputs (before any flow), and (tests/test_shard_loop.py) while its
workflows run. Real subprocesses and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
CASES = [(signal.SIGINT, 130, "error: interrupted"), (signal.SIGTERM, 143, "error: terminated (SIGTERM)")]


def _blocked_reading_stdin(pid: int, timeout_s: float = 180.0) -> bool:
    """Wait until the process sits in read(0, ...) (Linux: /proc/PID/syscall starts with the read syscall's
    number and fd 0), i.e. the command is reading its questions from stdin."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/syscall").read_text().split()[:2] == ["0", "0x0"]:
                return True
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/syscall").exists(), reason="needs Linux /proc/PID/syscall")
@pytest.mark.parametrize(("sig", "code", "line"), CASES, ids=["ctrl-c", "sigterm"])
def test_a_signal_while_the_command_prepares_its_inputs_is_one_line_and_its_code(tmp_path, sig, code, line):
    """`conductor answer -` reads its questions from stdin before any flow starts; a signal there used to leave
    as a silent exit 130 (typer's conversion of KeyboardInterrupt), SIGTERM included."""
    p = subprocess.Popen([sys.executable, "-m", "conductor.cli", "answer", "-", "--conductor", "fixed:0",
                          "--out", str(tmp_path / "out")], cwd=ROOT, env=ENV, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _blocked_reading_stdin(p.pid), "the command never read its stdin"
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert (p.returncode, err) == (code, line + "\n")
    assert not (tmp_path / "out" / "summary.json").exists()


# The signal arrives while `conductor.cli` imports its command modules (the slowest part of start-up on a loaded
# machine): the child sends it to itself from the import of the last command module.
_MID_IMPORT = """
import builtins, os, signal, sys
real = builtins.__import__
def hook(name, *a, **k):
    if name == "conductor.cli" and a and a[2] and "train_cmd" in a[2]:
        os.kill(os.getpid(), signal.{sig})
    return real(name, *a, **k)
builtins.__import__ = hook
sys.argv = ["conductor", "--help"]
from conductor.cli import main
main()
"""


@pytest.mark.parametrize(("sig", "code", "line"), CASES, ids=["ctrl-c", "sigterm"])
def test_a_signal_while_the_cli_imports_is_one_line_not_a_traceback(sig, code, line):
    proc = subprocess.run([sys.executable, "-c", _MID_IMPORT.format(sig=sig.name)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr, proc.stdout) == (code, line + "\n", "")


def test_importing_the_cli_leaves_the_signal_handlers_as_they_were():
    """A program (or a test) that imports conductor.cli keeps its own Ctrl-C: the start-up handlers are only
    there while the CLI's modules import."""
    code = ("import signal; before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)); "
            "import conductor.cli; "
            "print(before == (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "True", proc.stderr
