"""Run one GRPO step as ``torchrun`` processes over the ``conductor train-step`` CLI, and read its result back.

WHY: sharded (FSDP) training needs one process per GPU, all started together, which a Prefect task (one
Python process) cannot be. The task therefore launches ``python -m torch.distributed.run --standalone``
(= ``torchrun``, on a free loopback port) as a real subprocess; rank 0 prints the JSON result that this
module parses. torch is imported only to count GPUs; the child processes do the work.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

from conductor.learning.grpo.trainer import TrainError


def processes_for(config: dict[str, Any], nproc_per_node: int | None) -> int:
    """How many training processes: as asked, else (None) one per visible GPU when the config says fsdp.

    >>> processes_for({"distributed": "fsdp"}, 2), processes_for({}, None)
    (2, 1)
    """
    if nproc_per_node is not None:
        if nproc_per_node < 1:
            raise ValueError(f"nproc_per_node: must be >= 1, not {nproc_per_node}")
        return nproc_per_node
    if config.get("distributed") != "fsdp":
        return 1
    import torch

    return max(1, torch.cuda.device_count())


def torchrun_command(nproc_per_node: int, *, run_id: str, lake: str, base: str, out: str,
                     checkpoint_id: str | None = None, config: dict[str, Any] | None = None,
                     python: str | None = None) -> list[str]:
    """The argv of a single-node ``torchrun`` over ``train-step``; ``config`` = GRPOConfig fields (``--set``).

    The ``--`` ends torchrun's own options: its parser would otherwise read ``--run`` as an abbreviation
    of its ``--run-path`` (the CLI's command group skips the ``--``).

    >>> torchrun_command(2, run_id="r", lake="L", base="B", out="O", config={"distributed": "fsdp"},
    ...                  python="py")[:8]
    ['py', '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', '-m', 'conductor.cli']
    """
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node: must be >= 1, not {nproc_per_node}")
    cmd = [python or sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(nproc_per_node), "-m", "conductor.cli", "--", "train-step", "--run", run_id, "--lake", lake,
           "--from", base, "--out", out]
    if checkpoint_id:
        cmd += ["--id", checkpoint_id]
    if config:
        cmd += ["--set", json.dumps(config)]
    return cmd


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def failure_reason(stderr: str, returncode: int) -> str:
    """One line saying why the processes failed: the CLI's ``error: ...``, else the last exception line of a
    traceback, else torchrun's ``exitcode``/``error_file`` summary, else the last line that is not a rule.

    >>> failure_reason("x\\nerror: bad lake\\n====", 1)
    'bad lake'
    >>> failure_reason("Traceback (most recent call last):\\n  f()\\nRuntimeError: gloo: connection reset\\n" + "=" * 20, 1)
    'RuntimeError: gloo: connection reset'
    >>> failure_reason("Root Cause\\n  exitcode  : -9 (pid: 7)\\nx.ChildFailedError:\\n" + "=" * 20, 1)
    'exitcode  : -9 (pid: 7)'
    >>> failure_reason("", 3)
    'exit code 3'
    """
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]

    def child_exception(ln: str) -> bool:     # torchrun's own ChildFailedError only says "a child failed"
        return bool(_EXCEPTION_LINE.match(ln)) and "ChildFailedError" not in ln

    for pick in (lambda ln: ln.startswith("error: "), child_exception, lambda ln: ln.startswith("exitcode"),
                 lambda ln: ln.strip("=-_ ") != ""):
        found = [ln for ln in lines if pick(ln)]
        if found:
            line = found[0] if found[0].startswith("error: ") else found[-1]
            return line.removeprefix("error: ")
    return f"exit code {returncode}"


def torchrun_train_step(nproc_per_node: int, *, run_id: str, lake: str, base: str, out: str,
                        checkpoint_id: str | None = None, config: dict[str, Any] | None = None,
                        env: dict[str, str] | None = None, timeout: float | None = None) -> tuple[str, dict[str, Any]]:
    """Run the step in ``nproc_per_node`` processes; returns (checkpoint, metrics) as ``grpo_step`` does.

    A failure raises ``TrainError`` with one line from the processes' output (``failure_reason``).
    """
    cmd = torchrun_command(nproc_per_node, run_id=run_id, lake=lake, base=base, out=out,
                           checkpoint_id=checkpoint_id, config=config)
    proc_env = {**os.environ, **(env or {})}
    proc_env.setdefault("OMP_NUM_THREADS", "1")      # torchrun's own default, said explicitly (no warning)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=proc_env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TrainError(f"torchrun train-step on {run_id!r}: no result after {timeout} s") from None
    if p.returncode != 0:
        raise TrainError(f"torchrun train-step ({nproc_per_node} processes) failed: "
                         f"{failure_reason(p.stderr, p.returncode)}")
    try:
        res = json.loads(p.stdout[p.stdout.index("{"):])
        return res["checkpoint"], res["metrics"]
    except (ValueError, KeyError) as e:
        raise TrainError(f"torchrun train-step: unreadable result ({e}): {p.stdout[-200:]!r}") from None
