"""A flow's shards on a Dask cluster: prefect-dask's ``DaskTaskRunner`` on an existing cluster or a local one.

``conductor rollout --dask`` and ``conductor answer --dask`` take ``local:N`` (a ``distributed.LocalCluster`` of N
worker processes, one thread each) or a scheduler address (``tcp://HOST:8786``). The flow asks ``runs_remotely()``
and, when it does, submits one self-contained task per shard (tasks/shard.py); each worker process builds its own
runtime from plain specs and the lake is the only shared state (docs/deployments.md, "Scale-out").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from prefect import Flow

P = ParamSpec("P")
R = TypeVar("R")


def runs_remotely() -> bool:
    """True inside a flow run whose task runner sends tasks to other processes (Dask, Ray)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return ctx is not None and type(ctx.task_runner).__name__ in ("DaskTaskRunner", "RayTaskRunner")


def on_dask(flow_fn: Flow[P, R], address: str | None = None, n_workers: int = 2) -> Flow[P, R]:
    """The same flow with its shards on a Dask cluster: an existing one (``address``) or a local one."""
    from prefect_dask import DaskTaskRunner

    runner = (DaskTaskRunner(address=address) if address else
              DaskTaskRunner(cluster_kwargs={"n_workers": n_workers, "threads_per_worker": 1, "processes": True}))
    # prefect types task_runner as TaskRunner[PrefectFuture[...]], which DaskTaskRunner's own future type does not
    # match (the parameter is invariant); it is the runner prefect-dask documents for with_options.
    return flow_fn.with_options(task_runner=runner)  # type: ignore[arg-type]


def on_cluster(flow_fn: Flow[P, R], where: str) -> Flow[P, R]:
    """``on_dask`` for a ``--dask`` value (checked first: conductor/cli/dask_option.py): ``local:N`` or an address.

    >>> from prefect import flow
    >>> on_cluster(flow(lambda: None), "local:0")
    Traceback (most recent call last):
    ValueError: local:0: a local cluster needs at least one worker
    """
    if where.startswith("local:"):
        n = int(where.split(":", 1)[1])
        if n < 1:
            raise ValueError(f"{where}: a local cluster needs at least one worker")
        return on_dask(flow_fn, n_workers=n)
    return on_dask(flow_fn, where)
