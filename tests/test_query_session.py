"""`conductor query` is a lake-only, read-only session (issue #39, item 1): DuckDB's and polars' file
readers, writes, ATTACH, INSTALL and settings are refused with one line; SELECT, WITH, DESCRIBE, SHOW and
EXPLAIN work; `--allow-files` gives DuckDB's full power on purpose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.lake import queries as q
from conductor.lake import write_shard
from lake_records import small_lake_records
from tests.cli_checks import one_error, run


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lake3")
    write_shard(root, small_lake_records(), "00000")
    return root


def test_1_query_is_a_lake_only_read_only_session(lake, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret,1\n")
    refused = [
        f"COPY (SELECT * FROM trajectories) TO '{tmp_path}/x.csv'",
        f"COPY trajectories TO '{lake}/inside.csv'",                 # even inside the lake: no writes
        f"SELECT * FROM read_csv('{outside}')",
        f"SELECT * FROM read_text('{outside}')",
        "SELECT * FROM glob('/etc/*')",
        f"ATTACH '{tmp_path}/y.db'",
        f"EXPORT DATABASE '{tmp_path}/exp'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SELECT 1; SELECT 2",
    ]
    for sql in refused:
        with pytest.raises(Exception) as e:
            q.sql(str(lake), sql)
        assert "Traceback" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside.txt"]
    assert not (lake / "inside.csv").exists()
    with pytest.raises(q.QueryRefused, match="read_"):   # polars' own file readers
        q.sql(str(lake), f"SELECT * FROM read_csv('{outside}')", engine="polars")
    # what the command is for still works: SELECT, WITH, DESCRIBE, SHOW, EXPLAIN
    assert q.sql(str(lake), "SELECT count(*) AS n FROM trajectories").rows() == [(8,)]
    assert q.sql(str(lake), "WITH t AS (SELECT run_id FROM trajectories) SELECT count(*) FROM t").rows() == [(8,)]
    assert q.sql(str(lake), "DESCRIBE trajectories").height > 10
    assert {"calls", "trajectories"} <= set(q.sql(str(lake), "SHOW TABLES")["name"])
    # the command: one error line; --allow-files gives DuckDB's full power on purpose
    one_error(run("query", f"SELECT * FROM read_text('{outside}')", "--lake", str(lake)), "query")
    one_error(run("query", f"COPY trajectories TO '{tmp_path}/z.csv'", "--lake", str(lake)), "COPY", "--allow-files")
    one_error(run("query", "", "--lake", str(lake)), "empty")                          # 19: was an AttributeError
    r = run("query", f"SELECT * FROM read_csv('{outside}', header=false)", "--lake", str(lake), "--allow-files",
            "-f", "csv")
    assert r.exit_code == 0 and "secret" in r.stdout
