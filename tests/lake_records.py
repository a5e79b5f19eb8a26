"""Hand-made trajectories for the lake tests: small, with outcomes chosen so query answers are known."""

from __future__ import annotations

from conductor.trajectory import CallRecord, Round, Trajectory, trajectory_id


def call(step: int, worker: str, *, depth: int = 0, tin: int = 100, tout: int = 10, cost: float = 0.01,
         error_kind: str | None = None) -> CallRecord:
    return CallRecord(call_id=f"{depth}.{step}", parent_call_id=None if depth == 0 else f"{depth - 1}.0",
                      depth=depth, step=step, worker_index=step, worker=worker, provider="simulated", model=worker,
                      subtask=f"do part {step}", access=list(range(step)), access_all=True,
                      messages_hash=f"h{step}", response="" if error_kind else f"answer from {worker}",
                      finish_reason="stop", input_tokens=tin, output_tokens=tout, cost_usd=cost, latency_s=0.5,
                      cache_hit=step == 0, retries=1 if error_kind else 0,
                      error=f"{error_kind}: redacted" if error_kind else None, error_kind=error_kind)


def traj(run_id: str, qid: str, sample: int, *, workers: list[str] | None = None, correct: bool | None = True,
         dataset: str = "gsm8k", domain: str = "math", kind: str = "rollout", date: str = "2026-11-20",
         checkpoint: str = "ckpt-1", pool: str = "pool-a@v1", parse_status: str = "ok",
         parse_error: str | None = None, infra_cause: str | None = None, cost: float = 0.01,
         recursion: bool = False) -> Trajectory:
    """One trajectory whose root workflow has one step per name in ``workers``."""
    workers = workers if workers is not None else ["w-a"]
    steps = [{"worker": i, "subtask": f"do part {i}", "access": "all" if i else []} for i in range(len(workers))]
    if parse_status != "ok":
        steps, workers = [], []
    root = Round(0, f"prompt for {qid}", "model_id = [0]", [11, 12, 13], [-0.5, -0.25, -0.125],
                 parse_status, parse_error, steps, final_answer="42" if workers else None)
    infra = infra_cause is not None
    calls = [call(i, w, cost=cost, error_kind="rate_limited" if infra and i == len(workers) - 1 else None)
             for i, w in enumerate(workers)]
    rounds = [root]
    if recursion:
        rounds.append(Round(1, "refine", "model_id = []", [7], [-1.0], "ok", None, [], "42", kept_previous=True))
    reward = None if infra else (0.0 if parse_status != "ok" else (1.0 if correct else 0.5))
    return Trajectory(
        trajectory_id=trajectory_id(run_id, qid, sample), run_id=run_id, kind=kind,  # type: ignore[arg-type]
        question_id=qid, dataset=dataset, domain=domain, question=f"What is {qid}?", sample_index=sample,
        date=date, checkpoint_id=checkpoint, pool_id=pool, subpool=list(workers), gold="42", rounds=rounds,
        calls=calls, final_answer="42" if correct else "41", extracted_answer="42" if correct else "41",
        correct=None if (infra or parse_status != "ok") else correct, reward=reward,
        round_rewards=[1.0, 1.0] if recursion else None, infra_failed=infra, infra_cause=infra_cause,
        wall_s=1.5)


def small_lake_records() -> list[Trajectory]:
    """Two runs, two datasets, two checkpoints; every aggregate the query tests check is countable by hand.

    run r1 (ckpt-1, pool-a): gsm8k q1 x2 (correct, correct) using w-a,w-b; gsm8k q2 x2 (wrong, parse_error);
                             mmlu q3 x2 (correct via w-b; infra failure)
    run r2 (ckpt-2, pool-b): gsm8k q1 x2 (correct; wrong) each one step w-c
    """
    r1 = [
        traj("r1", "gsm8k/1", 0, workers=["w-a", "w-b"], correct=True, cost=0.02),
        traj("r1", "gsm8k/1", 1, workers=["w-a", "w-b"], correct=True, cost=0.02),
        traj("r1", "gsm8k/2", 0, workers=["w-a"], correct=False, cost=0.01),
        traj("r1", "gsm8k/2", 1, parse_status="parse_error", parse_error="model_id: entry 0 is 9, outside the pool",
             correct=None),
        traj("r1", "mmlu/3", 0, workers=["w-b"], correct=True, dataset="mmlu", domain="knowledge", cost=0.04,
             recursion=True),
        traj("r1", "mmlu/3", 1, workers=["w-b"], correct=None, dataset="mmlu", domain="knowledge",
             infra_cause="rate_limited: 429 after 6 retries", cost=0.0),
    ]
    r2 = [
        traj("r2", "gsm8k/1", 0, workers=["w-c"], correct=True, checkpoint="ckpt-2", pool="pool-b@v1",
             kind="eval", date="2026-11-21"),
        traj("r2", "gsm8k/1", 1, workers=["w-c"], correct=False, checkpoint="ckpt-2", pool="pool-b@v1",
             kind="eval", date="2026-11-21"),
    ]
    return r1 + r2
