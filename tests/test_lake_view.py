"""`conductor lake view`: the web app's pages and JSON API on a real lake (written by the project's writer), checked
against the same questions answered by polars over the same files; the lake's v3 training columns (written back
by a GRPO update) and the migration of older lakes."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from typer.testing import CliRunner

from conductor.lake.reader import load_trajectories, open_lake, scan
from conductor.lake.schema import SCHEMA_VERSION
from conductor.lake.synthetic import build_demo_lake
from conductor.lake.view.app import create_app
from conductor.lake.view.filters import FilterError, TrajectoryFilter
from conductor.lake.writer import migrate, write_shard
from lake_records import traj

pytest.importorskip("duckdb")


def hand_made() -> list:
    """Known outcomes: a three-step workflow, a recursion, an infra failure, literal wildcards in a question."""
    ts = [traj("hand", "hand/q1", 0, workers=["w-a", "w-b", "w-c"], correct=False, cost=0.5, kind="eval"),
          traj("hand", "hand/q2", 0, workers=["w-a"], recursion=True, kind="eval"),
          traj("hand", "hand/q3", 0, workers=["w-b", "w-a"], infra_cause="rate_limited: 429", kind="eval"),
          traj("hand", "hand/50%_off", 0, workers=["w-a"], kind="eval"),
          traj("hand", "hand/500 off", 0, workers=["w-a"], kind="eval")]
    ts[1].rounds[1].steps = [{"worker": 0, "subtask": "check it", "access": []},
                             {"worker": 1, "subtask": "fix it", "access": [0]}]
    return ts


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("view") / "lake")
    build_demo_lake(root, rows_per_run=240)
    write_shard(root, hand_made(), "hand-0")
    return root


@pytest.fixture(scope="module")
def client(lake: str) -> TestClient:
    return TestClient(create_app([lake], allowed_hosts=["testserver"]))


def frame(lake: str) -> pl.DataFrame:
    return scan(lake).collect()


def all_rows(client: TestClient, query: str) -> list[dict]:
    rows: list[dict] = []
    offset = 0
    while True:
        r = client.get(f"/api/trajectories?{query}&offset={offset}&limit=97")
        assert r.status_code == 200, r.text
        body = r.json()
        rows += body["rows"]
        if not body["more"]:
            return rows
        offset += 97


def test_runs_page_lists_every_run_with_its_figures(client: TestClient, lake: str) -> None:
    runs = {r["run_id"]: r for r in client.get("/api/runs").json()["runs"]}
    truth = (frame(lake).group_by("run_id").agg(
        pl.col("question_id").n_unique().alias("questions"), pl.col("correct").mean().alias("accuracy"),
        pl.col("cost_usd").sum().alias("dollars"), pl.col("n_calls").sum().alias("calls"),
        pl.col("infra_failed").sum().alias("infra")))
    assert set(runs) == set(truth["run_id"].to_list())
    for row in truth.iter_rows(named=True):
        got = runs[row["run_id"]]
        assert got["questions"] == row["questions"] and got["calls"] == row["calls"]
        assert got["infra_failures"] == row["infra"]
        assert got["dollars"] == pytest.approx(row["dollars"])
        assert got["accuracy"] == pytest.approx(row["accuracy"])
    html = client.get("/runs").text
    assert html.count('class="run-row"') == len(truth)
    assert 'href="/run/eval-ckpt-0002?lake=0"' in html      # each run links its report
    report = client.get("/run/hand?lake=0")
    assert report.status_code == 200 and "rate_limited" in report.text and "w-c" in report.text


FILTERS = [
    ("dataset=gsm8k&correct=false", (pl.col("dataset") == "gsm8k") & (pl.col("correct") == False)),  # noqa: E712
    ("domain=math&steps_min=3&steps_max=4", (pl.col("domain") == "math") & pl.col("n_steps").is_between(3, 4)),
    ("cost_min=0.01&cost_max=0.03", pl.col("cost_usd").is_between(0.01, 0.03)),
    ("reward_min=0.5&reward_max=0.5", pl.col("reward") == 0.5),
    ("failure=infra", pl.col("infra_failed")),
    ("failure=parse&kind=eval", (pl.col("parse_status") != "ok") & (pl.col("kind") == "eval")),
    ("parse_status=invalid", pl.col("parse_status") == "invalid"),
    ("correct=ungraded", pl.col("correct").is_null()),
    ("run=grpo-it01&training=unused", (pl.col("run_id") == "grpo-it01") & (pl.col("used_in_training") == False)),  # noqa: E712
    ("unused_reason=zero_variance_group", pl.col("unused_reason") == "zero_variance_group"),
    ("checkpoint=ckpt-0003", pl.col("checkpoint_id") == "ckpt-0003"),
    ("training=unrecorded", pl.col("used_in_training").is_null()),
]


@pytest.mark.parametrize(("query", "expr"), FILTERS, ids=[q for q, _ in FILTERS])
def test_filters_select_exactly_the_matching_rows(client: TestClient, lake: str, query: str, expr: pl.Expr) -> None:
    want = set(frame(lake).filter(expr)["trajectory_id"].to_list())
    assert want, "the demo lake should have rows for every filter"
    got = [r["trajectory_id"] for r in all_rows(client, query)]
    assert len(got) == len(set(got)) and set(got) == want
    assert client.get(f"/api/count?{query}").json()["count"] == len(want)


def test_worker_filter_finds_trajectories_whose_workflow_used_it(client: TestClient, lake: str) -> None:
    calls = scan(lake, "calls").collect()
    want = set(calls.filter(pl.col("worker") == "w-c")["trajectory_id"].to_list())
    assert {r["trajectory_id"] for r in all_rows(client, "worker=w-c")} == want and len(want) == 1
    gpt = set(calls.filter(pl.col("worker") == "gpt-5")["trajectory_id"].to_list())
    assert {r["trajectory_id"] for r in all_rows(client, "worker=gpt-5")} == gpt


def test_free_text_search_is_literal_and_case_blind(client: TestClient) -> None:
    got = [r["question_id"] for r in all_rows(client, "q=50%25_OFF")]
    assert got == ["hand/50%_off"]          # % and _ are not wildcards; case does not matter


def test_unfiltered_pages_cover_every_row_once(client: TestClient, lake: str) -> None:
    ids = [r["trajectory_id"] for r in all_rows(client, "")]
    assert len(ids) == len(set(ids)) == frame(lake).height
    html = client.get("/trajectories?offset=50").text
    assert html.count('class="traj-row"') == 50 and 'id="prev"' in html and 'id="next"' in html


def _expected_graph(row: dict) -> tuple[int, int, int]:
    rounds = [row["steps"]] + [r["steps"] for r in row["recursion_rounds"] or []]
    nodes = sum(len(s) for s in rounds)
    edges = sum(i if st["access_all"] else len(st["access"]) for s in rounds for i, st in enumerate(s))
    return nodes, edges, 1 + len(row["recursion_rounds"] or [])


def test_trajectory_page_draws_the_workflow_and_shows_every_step(client: TestClient, lake: str) -> None:
    df = frame(lake)
    nested = df.filter(pl.col("recursion_rounds").list.len() > 0, pl.col("run_id") != "hand").row(0, named=True)
    for row in (df.filter(pl.col("question_id") == "hand/q1").row(0, named=True), nested):
        html = client.get(f"/t/{row['trajectory_id']}?run={row['run_id']}").text
        nodes, edges, rounds = _expected_graph(row)
        svg = re.search(r'<svg class="workflow".*?</svg>', html, re.S).group(0)
        assert (svg.count('class="node"'), svg.count('class="edge"'), svg.count('<g class="round"')) == \
            (nodes, edges, rounds)
        api = client.get(f"/api/trajectory/{row['trajectory_id']}").json()
        assert api["graph"] == {"nodes": nodes, "edges": edges, "rounds": rounds}
        for call in scan(lake, "calls").filter(pl.col("trajectory_id") == row["trajectory_id"]).collect().iter_rows(named=True):
            assert f'id="step-{call["depth"]}-{call["step"]}"' in html
    html = client.get(f"/t/{df.filter(pl.col('question_id') == 'hand/q1')['trajectory_id'][0]}").text
    assert "answer from w-c" in html and "do part 2" in html and "model_id = [0]" in html   # reply, subtask, raw
    assert 'id="gold"' in html and "$0.5000" in html


def test_rollout_page_shows_advantage_and_training_use(client: TestClient, lake: str) -> None:
    row = frame(lake).filter(pl.col("used_in_training") == True).row(0, named=True)  # noqa: E712
    html = client.get(f"/t/{row['trajectory_id']}?run={row['run_id']}&lake=0").text
    assert f"{row['advantage']:,.4f}" in html and "used in training" in html
    assert client.get("/t/nope").status_code == 404


def test_compare_puts_questions_a_checkpoint_lost_first(client: TestClient, lake: str) -> None:
    df = frame(lake)
    acc = {run: dict(df.filter(pl.col("run_id") == run).group_by("question_id").agg(pl.col("correct").mean())
                     .iter_rows()) for run in ("eval-ckpt-0002", "eval-ckpt-0003")}
    lost = {q for q, a in acc["eval-ckpt-0002"].items() if (a or 0) > (acc["eval-ckpt-0003"].get(q) or 0)}
    assert lost
    html = client.get("/compare?a=eval-ckpt-0002&b=eval-ckpt-0003&show=regressions").text
    shown = re.findall(r'<div class="qid">([^<]+)</div>', html)
    assert set(shown) == lost
    html = client.get("/compare?a=eval-ckpt-0002&b=eval-ckpt-0003").text
    deltas = [float(d) for d in re.findall(r'<td class="n">(-?[0-9.]+)</td><td class="n">\$', html)]
    assert deltas and all(d != 0 for d in deltas)
    assert [abs(d) for d in deltas] == sorted((abs(d) for d in deltas), reverse=True)
    assert f"<b>{len(lost)}</b> better in A" in html


def test_training_page_points_link_to_their_rollouts(client: TestClient) -> None:
    html = client.get("/training").text
    reward = re.search(r'<svg class="chart" data-key="reward_mean".*?</svg>', html, re.S).group(0)
    assert reward.count('class="point"') == 3
    for it in range(3):
        assert f'href="/trajectories?run=grpo-it{it:02d}&amp;lake=0"' in reward
    assert 'data-key="kl_ref"' in html and 'data-key="entropy"' in html and 'data-key="worker_share"' in html


def test_bad_input_is_one_clear_400(client: TestClient) -> None:
    r = client.get("/api/trajectories?steps_min=two")
    assert r.status_code == 400 and r.json() == {"error": "steps_min: 'two' is not a whole number"}
    r = client.get("/trajectories?correct=maybe")
    assert r.status_code == 400 and "correct: 'maybe' is not one of" in r.text
    assert client.get("/compare?a=x&b=y&show=sideways").status_code == 400


def test_only_loopback_hosts_are_served(lake: str) -> None:
    app = create_app([lake])
    assert TestClient(app, base_url="http://127.0.0.1:8765").get("/runs").status_code == 200
    assert TestClient(app, base_url="http://attacker.example").get("/runs").status_code == 400


def test_several_lakes_are_one_view(lake: str, tmp_path: Path) -> None:
    other = str(tmp_path / "other")
    write_shard(other, [traj("elsewhere", "hand/q1", 0, workers=["w-a"], correct=True)], "0")
    client = TestClient(create_app([lake, other], allowed_hosts=["testserver"]))
    runs = {(r["lake"], r["run_id"]) for r in client.get("/api/runs").json()["runs"]}
    assert (1, "elsewhere") in runs and (0, "hand") in runs
    html = client.get("/compare?a=hand&b=elsewhere&show=improvements").text
    assert re.findall(r'<div class="qid">([^<]+)</div>', html) == ["hand/q1"]


def _downgrade(path: Path) -> None:
    """Rewrite a file as schema v2 wrote it: without the v3 columns, version 2 in its footer (write_id kept)."""
    t = pq.read_table(path)
    meta = dict(t.schema.metadata)
    t = t.drop_columns([c for c in ("policy_version", "advantage", "used_in_training", "unused_reason")
                        if c in t.column_names])
    meta[b"conductor.schema_version"] = b"2"
    t = t.set_column(t.schema.get_field_index("schema_version"), "schema_version", pa.array([2] * t.num_rows, pa.int16()))
    pq.write_table(t.replace_schema_metadata(meta), path)


def test_migrate_brings_old_files_to_the_current_schema(tmp_path: Path) -> None:
    root = tmp_path / "old"
    write_shard(str(root), hand_made(), "0")
    for p in root.glob("*/**/*.parquet"):
        _downgrade(p)
    before = sorted((t.trajectory_id, len(t.calls), t.reward) for t in load_trajectories(str(root), "hand", kind=None))
    out = migrate(str(root))
    assert out == {"checked": 2, "migrated": 2}
    for p in root.glob("*/**/*.parquet"):
        f = pq.ParquetFile(p)
        assert f.schema_arrow.metadata[b"conductor.schema_version"] == str(SCHEMA_VERSION).encode()
    assert "used_in_training" in pq.read_schema(next(root.glob("trajectories/**/*.parquet"))).names
    after = sorted((t.trajectory_id, len(t.calls), t.reward) for t in load_trajectories(str(root), "hand", kind=None))
    assert after == before and sum(n for _, n, _ in after) == 8      # calls stay matched (write_id kept)
    assert migrate(str(root)) == {"checked": 2, "migrated": 0}
    result = CliRunner().invoke(_cli(), ["lake", "migrate", "--lake", str(root)])
    assert result.exit_code == 0 and "0 of 2 files rewritten" in result.output


def test_a_grpo_update_writes_its_use_of_each_rollout_back(tmp_path: Path) -> None:
    from conductor.learning.grpo.config import GRPOConfig
    from conductor.learning.grpo.samples import build_samples
    from conductor.learning.grpo.usage import record_update

    root = str(tmp_path / "lake")
    ts = [traj("r1", "q1", 0), traj("r1", "q1", 1, correct=False), traj("r1", "q2", 0), traj("r1", "q2", 1),
          traj("r1", "q3", 0, infra_cause="timeout: 120 s"), traj("r1", "q3", 1)]
    write_shard(root, ts, "0")
    loaded = load_trajectories(root, "r1")
    n = record_update(root, "r1", loaded, GRPOConfig(), {"iteration": 3, "kl_ref": 0.25, "entropy": 0.5,
                                                          "worker_share": {"w-a": 1.0}, "bad": float("nan")}, "ck-3")
    assert n == 6
    samples, _ = build_samples(loaded)
    adv = {s.trajectory_id: s.advantage for s in samples}
    rows = {r["question_id"] + f"/{r['sample_index']}": r for r in scan(root).collect().to_dicts()}
    assert rows["q1/0"]["used_in_training"] and rows["q1/0"]["advantage"] == pytest.approx(adv[rows["q1/0"]["trajectory_id"]])
    assert rows["q1/1"]["advantage"] < 0 and rows["q1/0"]["policy_version"] == 2
    assert (rows["q2/0"]["used_in_training"], rows["q2/0"]["unused_reason"]) == (False, "zero_variance_group")
    assert (rows["q3/0"]["unused_reason"], rows["q3/0"]["advantage"]) == ("infra_failed", None)
    assert rows["q3/1"]["unused_reason"] == "zero_variance_group"     # alone in its group: no contrast
    assert sum(len(t.calls) for t in load_trajectories(root, "r1")) == sum(len(t.calls) for t in loaded)
    record = json.loads((Path(root) / "training" / "run_id=r1.json").read_text())
    assert record["checkpoint_id"] == "ck-3" and record["metrics"]["kl_ref"] == 0.25 and "bad" not in record["metrics"]
    html = TestClient(create_app([root], allowed_hosts=["testserver"])).get("/training").text
    assert "ck-3" in html and 'data-key="kl_ref"' in html and 'data-key="entropy"' in html
    first = scan(root).collect().sort("trajectory_id")
    record_update(root, "r1", None, GRPOConfig(), {"iteration": 3}, "ck-3")     # rerun: same values
    assert scan(root).collect().sort("trajectory_id").equals(first)
    assert open_lake(root).list_files("calls")


def _cli():  # the conductor CLI app
    from conductor.cli import app

    return app


def test_cli_refuses_a_missing_lake_with_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(_cli(), ["lake", "view", "--lake", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: lake {tmp_path / 'missing'}: no such directory"]


def test_every_asset_is_declared_package_data() -> None:
    """The pages, stylesheet and script are installed with the package (no CDN): pyproject's package-data globs
    for conductor.lake.view match every file the app serves or renders."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parent.parent
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = globs["conductor.lake.view"]
    view = root / "conductor" / "lake" / "view"
    assets = [p.relative_to(view).as_posix() for d in ("templates", "static") for p in (view / d).iterdir()]
    assert assets and all(any(fnmatch.fnmatch(a, pat) for pat in patterns) for a in assets), (assets, patterns)
    for html in (view / "templates").glob("*.html"):
        assert not re.search(r'(src|href)="(https?:)?//', html.read_text()), html   # nothing from the network


FIELDS = [f.name for f in dataclasses.fields(TrajectoryFilter)]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), st.text(max_size=8)))
def test_any_query_string_is_a_filter_or_one_error_naming_its_parameter(params: dict[str, str]) -> None:
    try:
        flt = TrajectoryFilter.from_params(params)
    except FilterError as e:
        assert str(e).split(":", 1)[0] in params
    else:
        where, args = flt.where()
        assert where.count("?") == len(args)        # every value is a bound parameter


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(needle=st.text(alphabet="abcdeilnorstuvw %_\\'", min_size=1, max_size=6))
def test_search_matches_a_literal_case_blind_substring(client: TestClient, lake: str, needle: str) -> None:
    questions = frame(lake).select("trajectory_id", "question")
    text = needle.strip()          # the viewer strips every parameter, as a form field would be read
    want = {t for t, q in questions.iter_rows() if text.lower() in q.lower()}
    r = client.get("/api/count", params={"q": needle})
    assert r.status_code == 200
    if text:
        assert r.json()["count"] == len(want)


def test_a_trajectory_opens_from_its_shard_link_after_compaction(tmp_path: Path) -> None:
    """A row's link names its run and shard; after `compact` the shard's rows live in a compacted file, which the
    viewer finds through the file's manifest (and its calls through the paired calls file)."""
    from conductor.lake.compact import compact

    root = str(tmp_path / "lake")
    ts = [traj("r1", f"q{i}", 0, workers=["w-a", "w-b"], kind="answer") for i in range(6)]
    for i in range(3):
        write_shard(root, ts[2 * i:2 * i + 2], f"s{i}")
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))
    before = {r["trajectory_id"]: r["shard"] for r in client.get("/api/trajectories").json()["rows"]}
    compact(root, run_id="r1")
    assert any(p.name.startswith("compact-") for p in Path(root).glob("trajectories/**/*.parquet"))
    client = TestClient(create_app([root], allowed_hosts=["testserver"]))
    for tid, shard in before.items():
        html = client.get(f"/t/{tid}?run=r1&lake=0&shard={shard}").text
        assert "answer from w-b" in html and html.count('class="node"') == 2
