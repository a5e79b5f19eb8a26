"""Synthetic trajectories with realistic field sizes, for benchmarks, demos and fault tests.

Sizes follow what a rollout really stores: a ~2 KB conductor prompt, a ~300-token
completion with ids and log-probs, 1-5 steps, one worker call per step with a
~600-character response. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from conductor.trajectory import CallRecord, Round, Trajectory, trajectory_id

DATASETS = {"math500": "math", "gsm8k": "math", "mmlu": "knowledge", "gpqa": "science",
            "livecodebench": "code", "rlpr": "reasoning"}
WORKERS = [("gpt-5", "openai", 1.25, 10.0), ("claude-sonnet-4", "anthropic", 3.0, 15.0),
           ("gemini-2.5-pro", "google", 1.25, 10.0), ("qwen3-32b", "openai_compatible", 0.1, 0.3),
           ("deepseek-r1-32b", "openai_compatible", 0.12, 0.4), ("gemma-3-27b", "local", 0.0, 0.0)]
_WORDS = ("solve compute the value of verify answer carefully step reason about each case check "
          "units final integer expression derive proof list options eliminate choose code test").split()
_PARSE_ERRORS = ("model_id: entry 2 is 7, outside the pool (0..4)", "access_list: entry 1 refers forward to step 3",
                 "syntax: no model_id list found", "subtasks: entry 0 is empty")
_INFRA = ("rate_limited: provider kept returning 429", "timeout: worker did not answer in 120 s",
          "server: 503 from provider")


def _corpus(rng: random.Random, n_chars: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_chars // 5))


class _Texts:
    """Random slices of one generated corpus: realistic sizes and entropy, cheap to make."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.corpus = _corpus(rng, 400_000)

    def __call__(self, n_chars: int) -> str:
        start = self.rng.randrange(len(self.corpus) - n_chars)
        return self.corpus[start:start + n_chars]


def synthetic_trajectories(n: int, *, run_id: str = "bench", kind: str = "rollout", date: str = "2026-11-21",
                           seed: int = 0, prompt_chars: int = 2000, completion_tokens: int = 300,
                           response_chars: int = 600, start: int = 0) -> Iterator[Trajectory]:
    """``n`` trajectories (8 samples per question), numbered from ``start``."""
    import numpy as np

    rng = random.Random(seed * 1_000_003 + start)
    nrng = np.random.default_rng(seed * 1_000_003 + start)
    _text = _Texts(rng)
    prompt_head = _text(prompt_chars)
    datasets = list(DATASETS)
    for i in range(start, start + n):
        qn, sample = divmod(i, 8)
        dataset = datasets[qn % len(datasets)]
        qid = f"{dataset}/test/{qn}"
        tid = trajectory_id(run_id, qid, sample)
        subpool = rng.sample([w[0] for w in WORKERS], 5)
        n_steps = rng.choice((1, 2, 2, 3, 3, 3, 4, 5))
        status = "ok" if rng.random() > 0.06 else rng.choice(("parse_error", "invalid"))
        steps = [{"worker": rng.randrange(5), "subtask": _text(80),
                  "access": "all" if rng.random() < 0.6 else sorted(rng.sample(range(s), min(s, 1)))}
                 for s in range(n_steps)] if status == "ok" else []
        completion = _text(completion_tokens * 4)
        root = Round(0, prompt_head + f" Question {qid}.", completion,
                     nrng.integers(0, 150_000, completion_tokens).tolist(),
                     (-2 * nrng.random(completion_tokens, dtype=np.float32)).tolist(),
                     status, None if status == "ok" else rng.choice(_PARSE_ERRORS), steps)
        calls: list[CallRecord] = []
        infra = status == "ok" and rng.random() < 0.02
        for s, st in enumerate(steps):
            name, provider, pin, pout = next(w for w in WORKERS if w[0] == subpool[st["worker"]])
            tin, tout = rng.randrange(200, 3000), rng.randrange(50, 1500)
            err = infra and s == len(steps) - 1
            calls.append(CallRecord(f"0.{s}", None, 0, s, st["worker"], name, provider, name, st["subtask"],
                                    list(range(s)) if st["access"] == "all" else list(st["access"]),
                                    st["access"] == "all", f"{rng.getrandbits(64):016x}",
                                    "" if err else _text(response_chars), "stop", tin, tout,
                                    (tin * pin + tout * pout) / 1e6, rng.random() * 20, rng.random() < 0.1,
                                    rng.choice((0, 0, 0, 1)), "timeout" if err else None, "timeout" if err else None))
        correct = None if (infra or status != "ok") else rng.random() < 0.35 + 0.1 * len(steps)
        reward = None if infra else (0.0 if status != "ok" else (1.0 if correct else 0.5))
        yield Trajectory(tid, run_id, kind, qid, dataset, DATASETS[dataset], _text(300), sample, date,
                         "ckpt-0001", "pool-main@v1", subpool, "42", [root], calls,
                         "42" if correct else "41", "42" if correct else "41", correct, reward, None,
                         infra, rng.choice(_INFRA) if infra else None, rng.random() * 60, shard="")
