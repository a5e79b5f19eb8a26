"""Rollout shards on a Dask cluster with prefect-dask's DaskTaskRunner: a local cluster, or any cluster by address.

WHY Dask: a rollout run is a list of independent shards; the rollout flow submits one task per shard when it
runs on a Dask (or Ray) task runner, and each Dask worker process builds its own runtime (policy, servers,
executor) once from plain specs and reuses it across shards (``conductor.run.runtime.shared_live``). The lake is
the only shared state, so the workers must all see the same lake path (a shared volume or ``s3://``).

    # a LocalCluster of 2 worker processes on this machine (what docs/deployments.md shows running):
    python infra/dask/local_cluster.py --questions gsm8k_train:4 --lake /tmp/dask-lake \\
        --pool data/pools/simulated.yaml --conductor transformers:$HOME/.cache/conductor/models/smollm2-135m-instruct-q4_1.gguf
    # an existing cluster (Kubernetes operator, dask-gateway, `dask scheduler` + `dask worker` by hand):
    python infra/dask/local_cluster.py --address tcp://dask-scheduler:8786 --lake s3://bucket/lake ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", help="scheduler address of an existing cluster (default: start a LocalCluster)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    p.add_argument("--questions", default="gsm8k_train:4")
    p.add_argument("--lake", required=True)
    p.add_argument("--pool", default="data/pools/simulated.yaml")
    p.add_argument("--conductor", required=True, help="conductor policy spec, as for `conductor answer --conductor`")
    p.add_argument("--run-id", default=None)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--shard-size", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)

    from distributed import LocalCluster

    from conductor.run.config import RolloutConfig
    from flows.rollout import on_dask, rollout_flow

    cluster = None
    address = args.address
    if address is None:
        # processes=True: one model per worker process, as on a real cluster; loopback only.
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None)
        address = cluster.scheduler_address
    print(f"dask scheduler: {address}", file=sys.stderr)
    start = time.perf_counter()
    try:
        summary = on_dask(rollout_flow, address)(RolloutConfig(
            questions=args.questions, lake=args.lake, pool=args.pool, conductor=args.conductor,
            run_id=args.run_id or f"dask-demo-{int(time.time())}", group_size=args.group_size,
            shard_size=args.shard_size, max_tokens=args.max_tokens))
    finally:
        if cluster is not None:
            cluster.close()
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
