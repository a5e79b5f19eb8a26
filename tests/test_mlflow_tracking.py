"""Training observability against a REAL MLflow store (mlflow-skinny, local file store and SQLite): the
tracker, the trainer's per-iteration metrics (reward mean/std, parse rate, loss, KL to the starting policy,
entropy, gradient norm, worker shares, calls, seconds), the PNG curves, and the Prefect train flow."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("mlflow")

from conductor.learning.grpo.config import GRPOConfig
from conductor.trajectory import CallRecord
from grpo_fixtures import rollout


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_tracker_logs_flattened_metrics_to_a_file_store_and_resumes_without_duplicates(tmp_path):
    from conductor.learning.grpo.tracking import MetricsTracker

    uri = (tmp_path / "mlruns").as_uri()
    t = MetricsTracker(uri, "exp-a", run_name="night-1", tags={"pool": "local"})
    t.log_params({"grpo": {"learning_rate": 1e-5, "kl_beta": 0.0}, "base": "smollm2"})
    assert t.log({"loss": 0.5, "kl_ref": None, "worker_share": {"qwen 1.5b": 0.75, "python": 0.25}, "name": "x"}, step=1)
    assert t.log({"loss": 0.25, "worker_share": {"qwen 1.5b": 0.5}}, step=2)
    assert (tmp_path / "mlruns").is_dir()
    # a fresh client, as `mlflow ui` would read it
    run = _client(uri).get_run(t.run_id)
    assert run.data.params["grpo.learning_rate"] == "1e-05" and run.data.tags["pool"] == "local"
    assert run.data.metrics["worker_share/qwen 1.5b"] == 0.5 and "kl_ref" not in run.data.metrics
    assert [(m.step, m.value) for m in _client(uri).get_metric_history(t.run_id, "loss")] == [(1, 0.5), (2, 0.25)]
    t.finish()
    # resume the same run (an interrupted flow or bench): step 2 is not written twice, step 3 is added
    again = MetricsTracker(uri, run_id=t.run_id)
    assert again.logged_steps == {1, 2}
    assert not again.log({"loss": 9.0}, step=2)
    assert again.log({"loss": 0.125}, step=3)
    assert again.history("loss") == [(1, 0.5), (2, 0.25), (3, 0.125)]
    assert _client(uri).get_run(t.run_id).info.status == "RUNNING"
    png = tmp_path / "curve.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    again.log_artifact(png, "curves")
    assert [a.path for a in _client(uri).list_artifacts(t.run_id, "curves")] == ["curves/curve.png"]
    # a second run in the same experiment
    other = MetricsTracker(uri, "exp-a", run_name="night-2")
    assert other.run_id != t.run_id and other.experiment_id == t.experiment_id


def test_tracker_on_a_sqlite_store(tmp_path):
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("alembic")
    from conductor.learning.grpo.tracking import MetricsTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    t = MetricsTracker(uri, "exp-b", run_name="r")
    t.log({"reward_mean": 0.75}, step=1)
    assert _client(uri).get_run(t.run_id).data.metrics["reward_mean"] == 0.75


def _with_calls(ts: list, workers: list[str]) -> list:
    """Give each trajectory one root call of the named worker (as the executor records it)."""
    for t, w in zip(ts, workers):
        t.calls = [CallRecord("0.0", None, 0, 0, 0, w, "local", "m", "Answer.", latency_s=1.5, cache_hit=w == "python")]
        t.wall_s = 2.0
    return ts


def test_trainer_logs_every_iteration_with_kl_to_the_start_and_entropy(tiny, tmp_path):
    from conductor.learning.grpo.tracking import MetricsTracker, plot_curves
    from conductor.learning.grpo.trainer import PolicyTrainer

    uri = (tmp_path / "mlruns").as_uri()
    tracker = MetricsTracker(uri, "grpo", run_name="tiny")
    cfg = GRPOConfig.cpu(learning_rate=1e-2, total_iterations=3, warmup_ratio=0.0, track_kl=True)
    tr = PolicyTrainer(str(tiny), cfg, tracker=tracker)
    m1 = tr.step(_with_calls(rollout("r1", "q1", [1.0, 0.5, 0.0, 1.0]), ["qwen", "python", "qwen", "smol"]))
    m2 = tr.step(_with_calls(rollout("r2", "q1", [1.0, 0.0]), ["qwen", "qwen"]))
    assert m1["kl_ref"] == pytest.approx(0.0, abs=1e-9)          # the first update's forward is the start itself
    assert m2["kl_ref"] > 0 and m1["entropy"] > 0 and m2["entropy"] > 0
    assert m1["reward_std"] == pytest.approx(math.sqrt(0.171875)) and m1["parse_rate"] == 1.0
    assert m1["worker_share"] == {"python": 0.25, "qwen": 0.5, "smol": 0.25}
    assert m1["calls_per_trajectory"] == 1.0 and m1["cache_hit_rate"] == 0.25 and m1["call_seconds"] == 4.5
    hist = {k: _client(uri).get_metric_history(tracker.run_id, k) for k in
            ("reward_mean", "reward_std", "loss", "kl_ref", "entropy", "grad_norm", "parse_rate", "time_s",
             "worker_share/qwen", "calls_per_trajectory", "rollout_s")}
    assert all([m.step for m in v] == [1, 2] for v in hist.values()), {k: len(v) for k, v in hist.items()}
    assert hist["worker_share/qwen"][1].value == 1.0 and hist["reward_mean"][0].value == 0.625
    png = plot_curves(tr.history, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_kl_is_measured_against_a_given_starting_checkpoint(tiny, tmp_path):
    from conductor.learning.grpo.trainer import PolicyTrainer, grpo_step

    cfg = GRPOConfig.cpu(learning_rate=1e-2, total_iterations=3, warmup_ratio=0.0, track_kl=True)
    child, _ = grpo_step(str(tiny), rollout("r1", "q1", [1.0, 0.0]), cfg, out=str(tmp_path / "it1"))
    # a one-step process continuing a chain: KL to the chain's start is already > 0 before its own update
    tr = PolicyTrainer(child, cfg, reference=str(tiny))
    assert tr.step(rollout("r2", "q1", [1.0, 0.0]))["kl_ref"] > 0
    same = PolicyTrainer(child, cfg)                              # default reference: the parent itself
    assert same.step(rollout("r2", "q1", [1.0, 0.0]))["kl_ref"] == pytest.approx(0.0, abs=1e-9)


def test_train_flow_logs_the_step_to_mlflow_once(tiny, tmp_path, monkeypatch):
    pytest.importorskip("prefect")
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from conductor.lake.writer import write_shard
    from conductor.run.config import TrainConfig
    from flows.train import train_flow

    lake = str(tmp_path / "lake")
    write_shard(lake, _with_calls(rollout("roll-1", "q1", [1.0, 0.0, 0.5]), ["a", "b", "a"]), "s0")
    uri = (tmp_path / "mlruns").as_uri()
    cfg = GRPOConfig.cpu(learning_rate=1e-3, total_iterations=2, track_kl=True).to_json()
    kw = dict(base=str(tiny), lake=lake, run_id="roll-1", out=str(tmp_path / "ck1"), checkpoint_id="ck1", grpo=cfg,
              tracking={"uri": uri, "experiment": "nightly", "run_name": "night"}, step=1)
    res = train_flow(TrainConfig(**kw))
    assert not res.resumed and res.loss is not None and math.isfinite(res.loss)
    run_id = res.mlflow_run_id
    hist = _client(uri).get_metric_history(run_id, "loss")
    assert [m.step for m in hist] == [1] and math.isfinite(hist[0].value)
    assert _client(uri).get_run(run_id).data.params["grpo.learning_rate"] == "0.001"
    assert _client(uri).get_run(run_id).data.metrics["worker_share/a"] == pytest.approx(2 / 3, abs=1e-4)
    # the rerun finds the checkpoint saved and logs nothing twice into the same run
    again = train_flow(TrainConfig(**{**kw, "tracking": {"uri": uri, "run_id": run_id}}))
    assert again.resumed and again.mlflow_run_id == run_id and again.metrics == res.metrics
    assert again.to_json() == {"uri": str(tmp_path / "ck1"), "checkpoint_id": "ck1", "metrics": res.metrics,
                               "resumed": True, "mlflow_run_id": run_id}
    assert len(_client(uri).get_metric_history(run_id, "loss")) == 1
