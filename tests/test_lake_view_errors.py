"""`conductor lake view` on a changing or remote lake (issue #51, item 10): it follows a compaction and a
removed shard without a 500, a huge offset is a 400 naming it, an s3:// lake without credentials is refused
before any network use, and /reload redirects only to a page of the viewer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_checks import one_error

ROOT = Path(__file__).resolve().parent.parent


def test_10_lake_view_follows_a_compaction_and_a_removed_shard_without_a_500(tmp_path):
    pytest.importorskip("duckdb")
    from starlette.testclient import TestClient

    from conductor.lake.compact import compact
    from conductor.lake.view.app import create_app
    from conductor.lake.writer import write_shard
    from lake_records import traj

    root = str(tmp_path / "lake")
    ts = [traj("r1", f"q{i}", 0, workers=["w-a", "w-b"], kind="answer") for i in range(8)]
    for i in range(4):
        write_shard(root, ts[2 * i:2 * i + 2], f"s{i}")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))   # a server exception fails the test
    before = {r["trajectory_id"]: r["shard"] for r in client.get("/api/trajectories").json()["rows"]}
    assert len(before) == 8 and client.get("/trajectories").status_code == 200
    compact(root, run_id="r1")                               # the files the viewer listed at start are gone
    r = client.get("/api/trajectories")
    assert r.status_code == 200 and len(r.json()["rows"]) == 8
    assert client.get("/trajectories").status_code == 200 and client.get("/runs").status_code == 200
    for tid, shard in list(before.items())[:2]:
        html = client.get(f"/t/{tid}?run=r1&lake=0&shard={shard}").text
        assert "answer from w-b" in html
    write_shard(root, [traj("r2", "z0", 0, workers=["w-a"], kind="answer")], "z0")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))
    for p in Path(root).glob("**/run_id=r2/**/*.parquet"):
        p.unlink()                                           # a removed shard
    r = client.get("/api/trajectories")
    assert r.status_code == 200 and {x["run_id"] for x in r.json()["rows"]} == {"r1"}
    assert client.get("/run/r2").status_code == 404


@pytest.mark.parametrize("offset", ["99999999999999999999", "1" * 5000])
def test_10_a_huge_offset_is_a_400_naming_it(offset, tmp_path):
    pytest.importorskip("duckdb")
    from starlette.testclient import TestClient

    from conductor.lake.view.app import create_app
    from conductor.lake.writer import write_shard
    from lake_records import traj

    root = str(tmp_path / "lake")
    write_shard(root, [traj("r1", "q0", 0, kind="answer")], "s0")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))
    for path in ("/api/trajectories", "/trajectories", "/compare?a=r1&b=r1"):
        sep = "&" if "?" in path else "?"
        r = client.get(f"{path}{sep}offset={offset}", headers={"accept": "application/json"})
        assert r.status_code == 400 and "offset" in r.text, (path, r.status_code, r.text[:300])


def test_10_lake_view_of_s3_without_credentials_is_refused_before_any_network_use(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_ENDPOINT_URL="http://192.0.2.1:9")    # TEST-NET: never answers
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "conductor", "lake", "view", "--lake", "s3://bucket/lake", "--port", "0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    one_error(r, "lake s3://bucket/lake: no S3 credentials", "AWS_ACCESS_KEY_ID")
    assert time.monotonic() - t0 < 30


def test_low_reload_redirects_only_to_a_page_of_the_viewer(tmp_path):
    pytest.importorskip("duckdb")
    from starlette.testclient import TestClient

    from conductor.lake.view.app import create_app
    from conductor.lake.writer import write_shard
    from lake_records import traj

    root = str(tmp_path / "lake")
    write_shard(root, [traj("r1", "q0", 0, kind="answer")], "s0")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]), follow_redirects=False)
    r = client.post("/reload", headers={"referer": "https://evil.example/phish"})
    assert r.status_code == 303 and r.headers["location"] == "/runs"
    r = client.post("/reload", headers={"referer": "http://127.0.0.1:8765/trajectories?run=r1"})
    assert r.headers["location"] == "/trajectories?run=r1"
