"""Synthetic trajectories with realistic field sizes, for benchmarks, demos and fault tests.

Sizes follow what a rollout really stores: a ~2 KB conductor prompt, a ~300-token
completion with ids and log-probs, 1-5 steps, one worker call per step with a
~600-character response. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from conductor.trajectory import CallRecord, Kind, ParseStatus, Round, Trajectory, trajectory_id

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


def synthetic_trajectories(n: int, *, run_id: str = "bench", kind: Kind = "rollout", date: str = "2026-11-21",
                           seed: int = 0, prompt_chars: int = 2000, completion_tokens: int = 300,
                           response_chars: int = 600, start: int = 0, checkpoint_id: str = "ckpt-0001",
                           policy_version: int | None = 0, accuracy_shift: float = 0.0,
                           recursion_rate: float = 0.0) -> Iterator[Trajectory]:
    """``n`` trajectories (8 samples per question), numbered from ``start``. Rollouts carry the training columns
    an update writes back (``policy_version``, ``advantage``, ``used_in_training``, ``unused_reason``; see
    ``with_training_use``) unless ``policy_version`` is None; ``accuracy_shift`` moves the chance of a right
    answer (two runs of the same questions that differ, for comparisons); ``recursion_rate``: the share of
    trajectories with a recursion round."""
    group: list[Trajectory] = []
    for t in _synthetic(n, run_id, kind, date, seed, prompt_chars, completion_tokens, response_chars, start,
                        checkpoint_id, accuracy_shift, recursion_rate):
        if kind != "rollout" or policy_version is None:
            yield t
            continue
        if group and group[0].question_id != t.question_id:
            yield from with_training_use(group, policy_version)
            group = []
        group.append(t)
    yield from with_training_use(group, policy_version) if group and policy_version is not None else ()


def with_training_use(group: list[Trajectory], policy_version: int) -> list[Trajectory]:
    """One GRPO group with what an update would record: the sample-std-normalised advantage of each scored
    member, infra failures and groups without contrast unused (the rule of conductor.learning.grpo.usage).

    >>> g = [Trajectory(str(i), "r", "rollout", "q", "d", "math", "?", reward=r) for i, r in enumerate((1.0, 0.0))]
    >>> [(t.used_in_training, round(t.advantage or 0, 3), t.unused_reason) for t in with_training_use(g, 0)]
    [(True, 0.707, None), (True, -0.707, None)]
    """
    scored = [t.reward for t in group if t.reward is not None and not t.infra_failed]
    mean = sum(scored) / len(scored) if scored else 0.0
    std = (sum((r - mean) ** 2 for r in scored) / max(len(scored) - 1, 1)) ** 0.5
    for t in group:
        t.policy_version = policy_version
        if t.reward is None or t.infra_failed:
            t.used_in_training, t.unused_reason = False, "infra_failed"
        elif std == 0:
            t.used_in_training, t.advantage, t.unused_reason = False, 0.0, "zero_variance_group"
        else:
            t.used_in_training, t.advantage = True, (t.reward - mean) / (std + 1e-4)
    return group


def _recursion_round(rng: random.Random, text: _Texts, subpool: list[str], calls: list[CallRecord],
                     response_chars: int) -> Round:
    """A depth-1 round refining the root's answer: two steps, the second seeing the first, with their calls."""
    steps: list[dict[str, Any]] = [{"worker": rng.randrange(5), "subtask": text(60), "access": []},
             {"worker": rng.randrange(5), "subtask": text(60), "access": [0]}]
    for s, st in enumerate(steps):
        name, provider, pin, pout = next(w for w in WORKERS if w[0] == subpool[st["worker"]])
        tin, tout = rng.randrange(200, 2000), rng.randrange(50, 800)
        calls.append(CallRecord(f"1.{s}", "0.0", 1, s, st["worker"], name, provider, name, st["subtask"],
                                list(range(s)), False, f"{rng.getrandbits(64):016x}", text(response_chars), "stop",
                                tin, tout, (tin * pin + tout * pout) / 1e6, rng.random() * 10))
    return Round(1, "Refine the previous answer. " + text(200), text(200), None, None, "ok", None, steps, "42")


def _synthetic(n: int, run_id: str, kind: Kind, date: str, seed: int, prompt_chars: int, completion_tokens: int,
               response_chars: int, start: int, checkpoint_id: str, accuracy_shift: float,
               recursion_rate: float = 0.0) -> Iterator[Trajectory]:
    import numpy as np

    rng = random.Random(seed * 1_000_003 + start)
    nrng = np.random.default_rng(seed * 1_000_003 + start)
    _text = _Texts(rng)
    prompt_head = _text(prompt_chars)
    datasets = list(DATASETS)
    outcome = random.Random(f"{run_id}\x1f{seed}\x1f{start}")
    for i in range(start, start + n):
        qn, sample = divmod(i, 8)
        dataset = datasets[qn % len(datasets)]
        qid = f"{dataset}/test/{qn}"
        tid = trajectory_id(run_id, qid, sample)
        subpool = rng.sample([w[0] for w in WORKERS], 5)
        n_steps = rng.choice((1, 2, 2, 3, 3, 3, 4, 5))
        status: ParseStatus = "ok" if rng.random() > 0.06 else rng.choice(("parse_error", "invalid"))
        steps: list[dict[str, Any]] = [{"worker": rng.randrange(5), "subtask": _text(80),
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
        rounds = [root]
        if recursion_rate and status == "ok" and not infra and rng.random() < recursion_rate:
            rounds.append(_recursion_round(rng, _text, subpool, calls, response_chars))
        # drawn apart from the rest, so two runs of one seed ask the same questions but answer them differently
        correct = None if (infra or status != "ok") else outcome.random() < 0.35 + 0.1 * len(steps) + accuracy_shift
        reward = None if infra else (0.0 if status != "ok" else (1.0 if correct else 0.5))
        yield Trajectory(tid, run_id, kind, qid, dataset, DATASETS[dataset], _text(300), sample, date,
                         checkpoint_id, "pool-main@v1", subpool, "42", rounds, calls,
                         "42" if correct else "41", "42" if correct else "41", correct, reward, None,
                         infra, rng.choice(_INFRA) if infra else None, rng.random() * 60, shard="")


def build_demo_lake(root: str, rows_per_run: int = 400, *, date: str = "2026-11-21") -> list[str]:
    """A small lake with every kind of thing the viewer shows: three GRPO iterations (rollout runs with their
    training columns and update records, 5% with a recursion round) and two evaluation runs of successive
    checkpoints on the same questions. Returns the run ids. For demos, docs screenshots and the viewer's tests."""
    from conductor.lake.writer import write_shard, write_training_record

    runs = []
    for it in range(3):
        run_id = f"grpo-it{it:02d}"
        write_shard(root, synthetic_trajectories(rows_per_run, run_id=run_id, seed=it, date=date, prompt_chars=400,
                                                 completion_tokens=32, checkpoint_id=f"ckpt-{it:04d}",
                                                 policy_version=it, accuracy_shift=0.05 * it, recursion_rate=0.05),
                    "00000")
        write_training_record(root, run_id, {"rollout_run": run_id, "checkpoint_id": f"ckpt-{it + 1:04d}",
                                             "iteration": it + 1, "policy_version": it,
                                             "metrics": {"kl_ref": 0.004 * it, "entropy": 0.8 - 0.1 * it,
                                                         "loss": 0.02 - 0.005 * it}})
        runs.append(run_id)
    for ckpt, shift in (("ckpt-0002", 0.0), ("ckpt-0003", 0.15)):
        run_id = f"eval-{ckpt}"
        write_shard(root, synthetic_trajectories(rows_per_run, run_id=run_id, kind="eval", seed=99, date=date,
                                                 prompt_chars=400, completion_tokens=32, checkpoint_id=ckpt,
                                                 accuracy_shift=shift, recursion_rate=0.05), "00000")
        runs.append(run_id)
    return runs
