"""Rollout shards on a Ray cluster with prefect-ray's RayTaskRunner.

NOT RUN on the development machine: prefect-ray pulls in ray (a very large install with grpcio and
its own runtime), which the project does not install; the Dask path (infra/dask/) is the one shown
working. The rollout flow already fans its shards out on any task runner named RayTaskRunner or
DaskTaskRunner (``flows/rollout.py``: one ``run_shard_task`` per shard, each worker building its runtime
once with ``conductor.run.runtime.shared_live``), so Ray needs no code change, only this runner.

    pip install "prefect-ray>=0.6"            # brings ray; keep torch at 2.13.0 (pip check afterwards)
    ray start --head --port 6379               # or a KubeRay cluster (see README.md here)
    python infra/ray/rollout_on_ray.py --address ray://127.0.0.1:10001 --lake s3://bucket/lake \\
        --pool data/pools/paper.yaml --conductor vllm:/models/champion --gpus-per-shard 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default=None, help="ray://HOST:10001 of a running cluster (default: a local Ray)")
    p.add_argument("--questions", default="gsm8k_train:64")
    p.add_argument("--lake", required=True)
    p.add_argument("--pool", required=True)
    p.add_argument("--conductor", required=True)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--shard-size", type=int, default=4)
    p.add_argument("--gpus-per-shard", type=float, default=0.0, help="Ray schedules each shard task on a GPU slot")
    args = p.parse_args(argv)

    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    from conductor.run.config import RolloutConfig
    from flows.rollout import rollout_flow

    runner = RayTaskRunner(address=args.address,
                           init_kwargs={"runtime_env": {"env_vars": {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}}})
    run = rollout_flow.with_options(task_runner=runner)
    config = RolloutConfig(questions=args.questions, lake=args.lake, pool=args.pool, conductor=args.conductor,
                           run_id=f"ray-{int(time.time())}", group_size=args.group_size, shard_size=args.shard_size)
    if args.gpus_per_shard:
        with remote_options(num_gpus=args.gpus_per_shard):   # applies to the shard tasks submitted inside
            summary = run(config)
    else:
        summary = run(config)
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
