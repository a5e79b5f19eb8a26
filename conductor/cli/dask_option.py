"""The ``--dask ADDRESS|local:N`` option of `conductor rollout` and `conductor answer`, checked before Prefect starts."""

from __future__ import annotations

from conductor.cli import fail

DASK_HELP = ("Run shards on a Dask cluster: a scheduler address (tcp://HOST:8786), or 'local:N' for a local "
             "cluster of N worker processes (docs/deployments.md, Scale-out).")


def check_dask(address: str) -> None:
    """``local:N`` or ``[tcp://]HOST:PORT`` that resolves and accepts a connection within a few seconds."""
    import socket
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    if address.startswith("local:"):
        n = address.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            fail(f"--dask {address!r}: local:N needs a number of workers >= 1")
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"--dask {address!r}: expected local:N or a scheduler address tcp://HOST:PORT")
    ex = ThreadPoolExecutor(max_workers=1)
    try:
        ex.submit(socket.create_connection, (host.strip("[]"), int(port)), 3).result(timeout=5).close()
    except FutureTimeout:
        fail(f"--dask {address}: no answer from {host}:{port} within 5 s")
    except OSError as e:
        fail(f"--dask {address}: cannot reach the scheduler ({e.strerror or e})")
    finally:
        ex.shutdown(wait=False)
