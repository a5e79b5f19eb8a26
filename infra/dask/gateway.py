"""Rollout shards on a cluster created through a dask-gateway server (shared, authenticated clusters).

prefect-dask creates and tears down the cluster itself (``cluster_class``), with adaptive scaling, and
passes the gateway's TLS security to the client, so nothing here handles addresses or certificates.

    pip install dask-gateway
    DASK_GATEWAY_ADDRESS=https://gateway.example.org python infra/dask/gateway.py \\
        --lake s3://bucket/lake --pool data/pools/paper.yaml --conductor vllm:/models/champion --questions gsm8k_train:256

NOT run on the development machine (no gateway there). The gateway's worker image must be conductor:cpu or
conductor:gpu (infra/Dockerfile.*) so the workers import the same ``conductor``/``flows``/``tasks`` code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", default="gsm8k_train:64")
    p.add_argument("--lake", required=True)
    p.add_argument("--pool", required=True)
    p.add_argument("--conductor", required=True)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--shard-size", type=int, default=4)
    p.add_argument("--max-workers", type=int, default=int(os.environ.get("DASK_WORKERS", "8")))
    args = p.parse_args(argv)

    from prefect_dask import DaskTaskRunner

    from conductor.run.config import RolloutConfig
    from flows.rollout import rollout_flow

    runner = DaskTaskRunner(
        cluster_class="dask_gateway.GatewayCluster",
        cluster_kwargs={"address": os.environ["DASK_GATEWAY_ADDRESS"],
                        "image": os.environ.get("CONDUCTOR_IMAGE", "conductor:gpu")},
        adapt_kwargs={"minimum": 1, "maximum": args.max_workers},
    )
    summary = rollout_flow.with_options(task_runner=runner)(RolloutConfig(
        questions=args.questions, lake=args.lake, pool=args.pool, conductor=args.conductor,
        run_id=f"gateway-{int(time.time())}", group_size=args.group_size, shard_size=args.shard_size))
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
