"""bench/gpu_check.py on the CPU with a tiny shape: the GRPO trainer in its three modes (bf16-mixed full fine-tuning
with gradient checkpointing, the shared prompt forward, LoRA; fp32 here) and the transformers backend under the
workflow grammar, end to end in a subprocess as someone rerunning it on a GPU machine would, with a byte-level
tokenizer (every random byte a token, so the grammar's control-character rule is exercised for real)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_fixtures import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_the_cpu_with_a_tiny_shape(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("llguidance")
    pytest.importorskip("peft")
    tokenizer = tiny_checkpoint(tmp_path / "tok")
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--tiny", "--tokenizer", str(tokenizer),
           "--group", "2", "--completion-tokens", "16", "--decode-samples", "4"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "error:" not in res.stdout
    last = dict(kv.split("=", 1) for kv in res.stdout.strip().splitlines()[-1].split())
    assert last["device"].startswith("cpu")
    for mode in ("full", "shared", "lora"):
        assert float(last[f"tiny_{mode}_step_s"]) > 0 and float(last[f"tiny_{mode}_peak_gib"]) > 0
        assert float(last[f"tiny_{mode}_tok_per_s"]) > 0
    assert float(last["tiny_free_tok_per_s"]) > 0 and float(last["tiny_grammar_tok_per_s"]) > 0
    finished, total = map(int, last["tiny_finished"].split("/"))
    assert total == 4 and finished >= 1
    assert last["tiny_parse_rate"] == "1.0", res.stdout      # every finished grammar completion parses


def test_gpu_check_refuses_bad_input_with_one_error_line(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--tiny", "--tokenizer", str(tmp_path / "missing")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: --tokenizer:")
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--shapes", "3b"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode != 0 and res.stderr.strip().splitlines()[-1].startswith("error: --shapes: unknown shape")
