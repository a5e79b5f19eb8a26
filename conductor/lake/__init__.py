"""The trajectory lake: a versioned Parquet schema, atomic shard writes, scans and queries.

Local directories and ``s3://`` URLs are both supported (see docs/lake.md).
"""

from conductor.lake.reader import Lake, load_trajectories, open_lake, scan
from conductor.lake.schema import SCHEMA_VERSION, LakeSchemaError
from conductor.lake.writer import shard_done, write_shard

__all__ = ["SCHEMA_VERSION", "Lake", "LakeSchemaError", "load_trajectories", "open_lake", "scan",
           "shard_done", "write_shard"]
