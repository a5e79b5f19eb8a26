"""The viewer's queries: one read-only DuckDB session over the validated files of one or more lakes.

WHY DuckDB here (and not the polars scans the reports use): a page wants 50 rows, not a frame. DuckDB stops a
``LIMIT`` scan as soon as it has them, prunes files by the Hive partition keys and row groups by their
statistics, caches Parquet footers between queries, and answers ``count(*)`` from the footers. So the first
page of a million-row lake costs about what it costs on a hundred rows. Counts of filtered tables need a full
scan; they are computed on their own request and cached per filter, so a page never waits for one.

Several lakes become one view with a ``lake`` column (their position on the command line), so a run in one lake
compares with a run in another. The file lists are those ``open_lake`` validated (corrupt files skipped,
compaction's superseded files hidden), taken once when the viewer starts: ``reload`` lists them again.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from conductor.lake.reader import HIVE_SCHEMA, Lake, open_lake
from conductor.lake.schema import SCHEMAS
from conductor.lake.view.filters import TrajectoryFilter
from conductor.lake.writer import TRAINING_DIR

# What the trajectory table shows (the big columns, prompts and token ids, are read only by the detail page).
TABLE_COLUMNS = ("lake", "kind", "date", "run_id", "shard", "trajectory_id", "question_id", "dataset", "domain",
                 "checkpoint_id", "sample_index", "left(question, 160) AS question", "correct", "reward",
                 "n_steps", "n_calls", "cost_usd", "parse_status", "infra_failed", "n_call_errors",
                 "advantage", "used_in_training", "unused_reason")


@dataclass(frozen=True)
class Page:
    """One page of a table: its rows, where it starts, and whether more follow."""

    rows: list[dict[str, Any]]
    offset: int
    limit: int
    more: bool


@dataclass
class LakeData:
    """DuckDB over the lakes' files; thread-safe (one cursor per query)."""

    roots: list[str]
    threads: int = 2
    _con: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _cache: dict[str, Any] = field(default_factory=dict)
    _calls_files: set[str] = field(default_factory=set)
    _shard_files: dict[tuple[int, str, str], list[str]] = field(default_factory=dict)   # (lake, run, shard)
    _hive: str = ""

    def __post_init__(self) -> None:
        self.reload()

    def reload(self) -> None:
        """List every lake's files again and rebuild the views (new runs appear; cached results are dropped)."""
        import duckdb

        con = duckdb.connect(config={"threads": self.threads, "autoinstall_known_extensions": False,
                                     "autoload_known_extensions": False})
        con.execute("SET parquet_metadata_cache = true")
        hive = "{" + ", ".join(f"'{k}': 'VARCHAR'" for k in HIVE_SCHEMA) + "}"
        calls_files: set[str] = set()
        shard_files: dict[tuple[int, str, str], list[str]] = {}
        for table, schema in SCHEMAS.items():
            con.register(f"_arrow_{table}", schema.empty_table())   # registered objects are not seen by cursors:
            con.execute(f"CREATE TABLE _empty_{table} AS SELECT * FROM _arrow_{table}")   # a real (empty) table is
            con.unregister(f"_arrow_{table}")
            parts = [f"SELECT NULL::INTEGER AS lake, * FROM _empty_{table}"]
            for i, root in enumerate(self.roots):
                lake = open_lake(root)
                if not lake.location.is_local:
                    con.register_filesystem(lake.location.fs)
                files = lake.list_files(table)
                if table == "calls":
                    calls_files.update(files)
                else:
                    _index_shards(i, lake, files, shard_files)
                if files:
                    listing = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
                    parts.append(f"SELECT {i}::INTEGER AS lake, * FROM read_parquet({listing}, hive_partitioning=true, "
                                 f"union_by_name=true, hive_types={hive}, filename=true)")
            # the typed empty table first: every current column exists, older files read as nulls there
            con.execute(f"CREATE VIEW {table} AS " + " UNION ALL BY NAME ".join(parts))
        with self._lock:
            old, self._con, self._cache, self._calls_files = self._con, con, {}, calls_files
            self._shard_files, self._hive = shard_files, hive
        if old is not None:
            old.close()

    def warm(self) -> None:
        """Read every footer (the unfiltered count) and the filter drop-downs' values now, at start, so the first
        page a user opens pays for neither."""
        self.count(TrajectoryFilter())
        self.options()

    def query(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of ``sql``. A file listed at start that is gone (``lake compact`` replaced it, a shard was
        removed) makes DuckDB fail to open it: the files are listed again (``reload``) and the query asked once
        more, so the page shows the lake as it is now instead of an error until someone presses reload."""
        import duckdb

        try:
            return self._query(sql, params)
        except duckdb.IOException:
            self.reload()
            return self._query(sql, params)

    def _query(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        cur = self._con.cursor()
        try:
            cur.execute(sql, params or [])
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]
        finally:
            cur.close()

    def _cached(self, key: str, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        if key not in self._cache:
            self._cache[key] = self.query(sql, params)
        rows: list[dict[str, Any]] = self._cache[key]
        return rows

    # ------------------------------------------------------------------ pages

    def runs(self) -> list[dict[str, Any]]:
        """One row per (lake, kind, date, run): what the runs page lists (cached: a full scan of small columns)."""
        return self._cached("runs", """
            SELECT lake, kind, date, run_id,
                   string_agg(DISTINCT checkpoint_id, ', ' ORDER BY checkpoint_id) AS checkpoints,
                   string_agg(DISTINCT pool_id, ', ' ORDER BY pool_id) AS pools,
                   count(DISTINCT question_id) AS questions, count(*) AS trajectories,
                   avg(CAST(correct AS DOUBLE)) AS accuracy, sum(cost_usd) AS dollars, sum(n_calls) AS calls,
                   count(*) FILTER (WHERE infra_failed) AS infra_failures,
                   count(*) FILTER (WHERE parse_status <> 'ok') AS parse_failures,
                   count(*) FILTER (WHERE used_in_training) AS used_in_training,
                   max(policy_version) AS policy_version
            FROM trajectories GROUP BY ALL ORDER BY date DESC, kind, run_id, lake""")

    def trajectories(self, flt: TrajectoryFilter, offset: int = 0, limit: int = 50) -> Page:
        """One page of the filtered table, in lake order (or ``flt.sort``); one row more tells if more follow."""
        where, params = flt.where()
        order = f" ORDER BY {flt.order_by()}" if flt.order_by() else ""
        rows = self.query(f"SELECT {', '.join(TABLE_COLUMNS)} FROM trajectories WHERE {where}{order} "
                          f"LIMIT {int(limit) + 1} OFFSET {int(offset)}", params)
        return Page(rows[:limit], offset, limit, len(rows) > limit)

    def count(self, flt: TrajectoryFilter) -> int:
        """Rows matching ``flt`` (no filter: from the Parquet footers), cached per filter."""
        where, params = flt.where()
        key = "count:" + json.dumps([where, params], default=str)
        return int(self._cached(key, f"SELECT count(*) AS n FROM trajectories WHERE {where}", params)[0]["n"])

    def options(self) -> dict[str, list[str]]:
        """Distinct values for the filter drop-downs: one pass over small dictionary-encoded columns, cached."""
        rows = self._cached("options", """
            SELECT list(DISTINCT kind ORDER BY kind) AS kind, list(DISTINCT run_id ORDER BY run_id) AS run,
                   list(DISTINCT checkpoint_id ORDER BY checkpoint_id) AS checkpoint,
                   list(DISTINCT dataset ORDER BY dataset) AS dataset, list(DISTINCT domain ORDER BY domain) AS domain,
                   list(DISTINCT parse_status ORDER BY parse_status) AS parse_status,
                   list(DISTINCT unused_reason ORDER BY unused_reason) FILTER (WHERE unused_reason IS NOT NULL)
                     AS unused_reason
            FROM trajectories""")
        out = {k: [str(x) for x in (v or [])] for k, v in rows[0].items()}
        out["worker"] = [r["worker"] for r in self._cached(
            "workers", "SELECT DISTINCT worker FROM calls ORDER BY worker")]
        return out

    def trajectory(self, trajectory_id: str, run_id: str = "", lake: int | None = None,
                   shard: str = "") -> dict[str, Any] | None:
        """The whole row, big columns included (``run_id`` lets DuckDB open only that run's files, ``shard`` skips
        the files and row groups whose statistics rule it out); ``filename`` names the file it came from."""
        conds: list[str] = ["trajectory_id = ?"]
        params: list[Any] = [trajectory_id]
        for col, val in (("run_id", run_id), ("lake", lake), ("shard", shard)):
            if val not in ("", None):
                conds.append(f"{col} = ?")
                params.append(val)
        import duckdb

        def ask(source: str) -> list[dict[str, Any]]:
            return self.query(f"SELECT * EXCLUDE (completion_token_ids, completion_logprobs), "
                              f"len(completion_token_ids) AS n_completion_tokens FROM {source} "
                              f"WHERE {' AND '.join(conds)} LIMIT 1", params)

        files = self._shard_files.get((lake, run_id, shard)) if lake is not None else None
        if files:   # the shard's own file (or the compacted file holding it): no planning over the whole lake
            listing = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            try:
                rows = ask(f"(SELECT {int(lake or 0)}::INTEGER AS lake, * FROM read_parquet([{listing}], "
                           f"hive_partitioning=true, union_by_name=true, hive_types={self._hive}, filename=true) "
                           f"UNION ALL BY NAME SELECT NULL::INTEGER AS lake, * FROM _empty_trajectories)")
            except duckdb.IOException:   # the shard's file is gone (compacted since): the view was listed again
                rows = ask("trajectories")
        else:
            rows = ask("trajectories")
        return rows[0] if rows else None

    def calls(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A trajectory's calls in execution order, read from the calls file paired with its trajectories file
        (same name under ``calls/``; ``list_files`` admitted it only if its write_id matches), else the view."""
        name = str(row.get("filename") or "")
        paired = name.replace("/trajectories/", "/calls/", 1) if "/trajectories/" in name else ""
        if paired and paired in self._calls_files:
            import duckdb

            try:
                return self.query("SELECT * FROM read_parquet(?) WHERE trajectory_id = ? ORDER BY call_index",
                                  [paired, row["trajectory_id"]])
            except duckdb.IOException:   # compacted since the row was read: ask the (listed again) view
                pass
        return self.query("SELECT * FROM calls WHERE trajectory_id = ? AND run_id = ? AND lake = ? "
                          "ORDER BY call_index", [row["trajectory_id"], row["run_id"], row["lake"]])

    def compare(self, a: str, b: str, show: str = "differ", offset: int = 0, limit: int = 50) -> tuple[Page, dict[str, int]]:
        """Questions both runs answered, side by side: per question each run's accuracy over its samples, the
        questions where they differ first (``show``: differ, regressions = right in A and wrong in B,
        improvements, all); plus the counts of each kind."""
        base = """
            WITH a AS (SELECT question_id, any_value(dataset) AS dataset, any_value(left(question, 200)) AS question,
                              avg(CAST(correct AS DOUBLE)) AS acc, avg(cost_usd) AS cost, count(*) AS n,
                              min(trajectory_id) AS tid, any_value(lake) AS lake
                       FROM trajectories WHERE run_id = ? GROUP BY question_id),
                 b AS (SELECT question_id, avg(CAST(correct AS DOUBLE)) AS acc, avg(cost_usd) AS cost, count(*) AS n,
                              min(trajectory_id) AS tid, any_value(lake) AS lake
                       FROM trajectories WHERE run_id = ? GROUP BY question_id),
                 j AS (SELECT a.question_id, a.dataset, a.question, a.acc AS acc_a, b.acc AS acc_b, a.cost AS cost_a,
                              b.cost AS cost_b, a.n AS n_a, b.n AS n_b, a.tid AS tid_a, b.tid AS tid_b,
                              a.lake AS lake_a, b.lake AS lake_b,
                              coalesce(a.acc, 0) - coalesce(b.acc, 0) AS delta
                       FROM a JOIN b USING (question_id))"""
        summary = self._cached(f"cmp:{a}\x1f{b}", base + """
            SELECT count(*) AS both_answered, count(*) FILTER (WHERE delta > 0) AS regressions,
                   count(*) FILTER (WHERE delta < 0) AS improvements, count(*) FILTER (WHERE delta = 0) AS same
            FROM j""", [a, b])[0]
        cond = {"differ": "delta <> 0", "regressions": "delta > 0", "improvements": "delta < 0", "all": "true"}[show]
        rows = self.query(base + f" SELECT * FROM j WHERE {cond} ORDER BY abs(delta) DESC, delta DESC, question_id "
                                 f"LIMIT {int(limit) + 1} OFFSET {int(offset)}", [a, b])
        return Page(rows[:limit], offset, limit, len(rows) > limit), {k: int(v or 0) for k, v in summary.items()}

    def training(self) -> list[dict[str, Any]]:
        """Per rollout run, in policy order: reward, parse rate, accuracy and the training columns from the lake,
        joined with the update's record (KL, entropy, loss, worker shares) where one was written."""
        rows = self._cached("training", """
            SELECT lake, run_id, any_value(date) AS date, max(policy_version) AS policy_version,
                   string_agg(DISTINCT checkpoint_id, ', ') AS checkpoints, count(*) AS trajectories,
                   avg(reward) AS reward_mean, avg(CAST(parse_status = 'ok' AS DOUBLE)) AS parse_rate,
                   avg(CAST(correct AS DOUBLE)) AS accuracy,
                   count(*) FILTER (WHERE used_in_training) AS used,
                   count(*) FILTER (WHERE unused_reason = 'zero_variance_group') AS zero_variance,
                   count(*) FILTER (WHERE unused_reason = 'infra_failed') AS infra_failed
            FROM trajectories WHERE kind = 'rollout' GROUP BY lake, run_id
            ORDER BY policy_version NULLS LAST, date, run_id""")
        shares = self._cached("training-shares", """
            SELECT lake, run_id, worker, count(*) AS n FROM calls WHERE kind = 'rollout' AND depth = 0
            GROUP BY ALL""")
        by_run: dict[tuple[int, str], dict[str, float]] = {}
        for s in shares:
            by_run.setdefault((s["lake"], s["run_id"]), {})[s["worker"]] = s["n"]
        records = self.training_records()
        out = []
        for r in rows:
            counts = by_run.get((r["lake"], r["run_id"]), {})
            total = sum(counts.values()) or 1
            rec = records.get((r["lake"], r["run_id"]), {})
            metrics = rec.get("metrics", {})
            out.append({**r, "worker_share": {w: n / total for w, n in sorted(counts.items())},
                        "kl_ref": metrics.get("kl_ref"), "entropy": metrics.get("entropy"),
                        "loss": metrics.get("loss"), "iteration": rec.get("iteration"),
                        "trained_checkpoint": rec.get("checkpoint_id")})
        return out

    def training_records(self) -> dict[tuple[int, str], dict[str, Any]]:
        """(lake, rollout run) -> the record its GRPO update wrote (``<lake>/training/run_id=<run>.json``)."""
        out: dict[tuple[int, str], dict[str, Any]] = {}
        for i, root in enumerate(self.roots):
            loc = open_lake(root).location
            for path in loc.glob(loc.path(TRAINING_DIR, "run_id=*.json")):
                try:
                    with loc.fs.open(path, "rb") as fh:
                        rec = json.loads(fh.read())
                except (OSError, ValueError):
                    continue   # a damaged record hides its KL/entropy points, nothing else
                out[(i, str(rec.get("rollout_run") or path.rsplit("run_id=", 1)[-1][:-5]))] = rec
        return out


def _index_shards(lake_index: int, lake: Lake, files: list[str], out: dict[tuple[int, str, str], list[str]]) -> None:
    """(lake, run, shard id) -> the visible trajectories file(s) holding that shard: ``shard-<id>.parquet``, or a
    compacted file whose manifest lists the id (conductor/lake/manifest.py)."""
    from conductor.lake.manifest import shard_id_of

    visible = lake.visibility().visible
    for uri in files:
        parts = dict(seg.split("=", 1) for seg in uri.split("/") if "=" in seg)
        name = uri.rsplit("/", 1)[-1]
        run_id = parts.get("run_id", "")
        manifest = visible.get(((parts.get("kind", ""), run_id), name))
        shards = set(manifest.shards) if manifest is not None else {shard_id_of(name)}
        for sid in shards:
            if sid:
                out.setdefault((lake_index, run_id, sid), []).append(uri)


def run_report(data: LakeData, run_id: str, lake: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The standard report's tables for one run (conductor/lake/queries.py asks the same questions of a whole
    lake): outcomes by dataset, worker usage and outcomes, failure classes."""
    cond = "run_id = ?"
    params: list[Any] = [run_id]
    if lake is not None:
        cond, params = cond + " AND lake = ?", [run_id, lake]
    return {
        "by_dataset": data.query(f"""
            SELECT dataset, domain, count(*) AS n, count(DISTINCT question_id) AS questions,
                   avg(CAST(correct AS DOUBLE)) AS accuracy, avg(reward) AS mean_reward,
                   avg(CAST(parse_status = 'ok' AS DOUBLE)) AS parse_ok, count(*) FILTER (WHERE infra_failed) AS infra,
                   avg(cost_usd) AS cost, avg(n_steps) AS steps
            FROM trajectories WHERE {cond} GROUP BY ALL ORDER BY dataset, domain""", params),
        "workers": data.query(f"""
            SELECT c.worker, count(*) AS calls, count(DISTINCT c.trajectory_id) AS trajectories,
                   sum(c.cost_usd) AS dollars, avg(c.latency_s) AS seconds,
                   count(*) FILTER (WHERE c.error_kind IS NOT NULL) AS errors
            FROM calls c WHERE {cond.replace('run_id', 'c.run_id').replace('lake', 'c.lake')}
            GROUP BY ALL ORDER BY calls DESC""", params),
        "failures": data.query(f"""
            SELECT 'parse' AS type, split_part(parse_error, ':', 1) AS class, count(*) AS n FROM trajectories
              WHERE {cond} AND parse_error IS NOT NULL GROUP BY ALL
            UNION ALL SELECT 'infra', split_part(infra_cause, ':', 1), count(*) FROM trajectories
              WHERE {cond} AND infra_failed GROUP BY ALL
            UNION ALL SELECT 'call', error_kind, count(*) FROM calls
              WHERE {cond} AND error_kind IS NOT NULL GROUP BY ALL
            ORDER BY n DESC""", params * 3),
    }
