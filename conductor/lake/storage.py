"""Where the lake lives: a local directory or an ``s3://`` URL, opened through fsspec.

Endpoints and credentials come only from the environment (``AWS_*``) or from the
caller's ``storage_options``; nothing about them is ever written into the lake.
Polars reads S3 with its own client, so the same options are translated for it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import fsspec

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@-]*$")


def check_key(name: str, value: str) -> str:
    """A partition value or shard id must be a plain path segment (no '/', '=', spaces).

    >>> check_key("run_id", "grpo-2026-11-21.a")
    'grpo-2026-11-21.a'
    >>> check_key("run_id", "a/b")
    Traceback (most recent call last):
    ...
    ValueError: run_id 'a/b' is not a plain name (letters, digits, . _ + @ -)
    """
    if not isinstance(value, str) or not _SAFE.match(value):
        raise ValueError(f"{name} {value!r} is not a plain name (letters, digits, . _ + @ -)")
    return value


def s3_credentials_problem(url: str) -> str | None:
    """Why an ``s3://`` lake cannot be read without first asking the network for credentials, or None.

    botocore's chain ends at the EC2 instance metadata service, which a machine off EC2 answers only after
    timeouts (and a traceback): unless a credential source is configured (the ``AWS_*`` keys, a profile or
    shared credentials file, a web identity or container credentials), the lake is refused before any network
    use. On EC2 with an instance role, set ``AWS_EC2_METADATA_DISABLED=false`` to say so.
    """
    env = os.environ
    if not url.startswith(("s3://", "s3a://")):
        return None
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return None
    if any(env.get(k) for k in ("AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        return None
    if env.get("AWS_EC2_METADATA_DISABLED", "").lower() == "false":
        return None
    files = (env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials", env.get("AWS_CONFIG_FILE") or "~/.aws/config")
    if any(os.path.isfile(os.path.expanduser(f)) for f in files):
        return None
    return ("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a "
            "non-AWS store) or AWS_PROFILE; on EC2 with an instance role, AWS_EC2_METADATA_DISABLED=false")


@dataclass
class LakeLocation:
    """An opened lake root: the fsspec filesystem, the root path inside it, and how to address files."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.root = root.rstrip("/")
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.is_local = self.protocol in ("file", "local")

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def glob(self, pattern: str) -> list[str]:
        """Paths matching ``pattern`` (hidden names never match ``*``), sorted.

        Local lakes use the standard library: it checks a literal name with one stat and
        lists a directory without a stat per entry, where fsspec stats every file under
        the pattern's root; a run of 20,000 shards made each shard write list them all.
        """
        if self.is_local:
            import glob as _glob

            return sorted(_glob.glob(pattern))
        return sorted(self.fs.glob(pattern))

    def uri(self, path: str) -> str:
        """A path the fs returned -> a URL other engines (polars, duckdb) can open."""
        if self.is_local:
            return path
        return path if "://" in path else f"{self.protocol}://{path}"

    def polars_options(self) -> dict[str, str] | None:
        """Storage options for polars' native object-store reader (None for local files)."""
        if self.is_local:
            return None
        if self.protocol not in ("s3", "s3a"):
            return None
        so = self.storage_options
        ck = so.get("client_kwargs") or {}
        endpoint = so.get("endpoint_url") or ck.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") \
            or os.environ.get("AWS_ENDPOINT_URL")
        opts = {
            "aws_access_key_id": so.get("key") or os.environ.get("AWS_ACCESS_KEY_ID"),
            "aws_secret_access_key": so.get("secret") or os.environ.get("AWS_SECRET_ACCESS_KEY"),
            "aws_session_token": so.get("token") or os.environ.get("AWS_SESSION_TOKEN"),
            "aws_region": ck.get("region_name") or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "aws_endpoint_url": endpoint,
            "aws_allow_http": "true" if endpoint and endpoint.startswith("http://") else None,
        }
        return {k: v for k, v in opts.items() if v}


def open_location(lake_root: str | LakeLocation, storage_options: dict[str, Any] | None = None) -> LakeLocation:
    if isinstance(lake_root, LakeLocation):
        return lake_root
    return LakeLocation(str(lake_root), dict(storage_options or {}))
