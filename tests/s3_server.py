"""A real S3-compatible server (moto's server mode) on loopback, configured the production way: AWS_* env."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import urllib.request
from collections.abc import Iterator


@contextlib.contextmanager
def moto_s3(bucket: str, key: str, secret: str) -> Iterator[tuple[str, dict[str, str], object]]:
    """Yield (endpoint, env, fs) with ``bucket`` created; restore the environment and stop the server after.

    fsspec caches S3FileSystem instances by their arguments, and env-configured ones all look alike, so the
    cache is cleared on the way in and out: a later test must not reuse a client bound to a stopped server.
    """
    import fsspec
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    # moto keeps its buckets in process-global state shared by every server it starts in this process: start
    # each test from an empty S3, or a bucket an earlier test made (same name) makes mkdir fail.
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_ENDPOINT_URL": endpoint,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir(bucket)
        yield endpoint, env, fs
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
