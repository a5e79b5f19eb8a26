"""Training observability: per-iteration metrics to MLflow tracking, rollout statistics, PNG curves.

WHY MLflow: it is what TRL users read their GRPO curves in (``report_to="mlflow"``), it needs no server
(a local store by default; any tracking URI by configuration: a server, Databricks, SQLite), and the
project's registry already speaks it. ``MetricsTracker`` wraps ``MlflowClient`` with an explicit run id
(no global "active run", so a flow, a bench and tests can log side by side), and resumes: a rerun of the
same run skips iterations already logged instead of duplicating their points.

Default store: ``file:<work dir>/mlruns``. MLflow 3 keeps its file store "in maintenance mode" and refuses
it unless ``MLFLOW_ALLOW_FILE_STORE=true``; a ``file:`` URI chosen here sets that opt-out for this process
(``sqlite:///path/mlflow.db`` is the maintained local alternative and works the same). View the runs with
``mlflow ui --backend-store-uri <uri>``.

``rollout_metrics`` (pure) summarises a rollout batch: reward mean/std, accuracy, parse rate, worker
shares, calls and seconds per trajectory, workflow length. ``plot_curves`` draws the history as PNG.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.files import save_figure

if TYPE_CHECKING:
    from conductor.trajectory import Trajectory

DEFAULT_EXPERIMENT = "conductor-grpo"
STEP_KEY = "iteration"
# The curves drawn by ``plot_curves`` (when present in the history), in this order.
CURVES = ("reward_mean", "reward_std", "accuracy", "parse_rate", "loss", "kl_ref", "entropy", "grad_norm",
          "lr", "clip_fraction", "calls_per_trajectory", "steps_per_workflow", "time_s", "rollout_s")


def default_tracking_uri(work_dir: str | Path) -> str:
    """``$MLFLOW_TRACKING_URI`` when set, else a file store under ``work_dir`` (``file:///abs/path/mlruns``)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return Path(work_dir, "mlruns").resolve().as_uri()


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a (nested) metrics dict as ``a/b`` keys; None, strings and non-finite values dropped.

    >>> flatten({"loss": 0.5, "kl_ref": None, "share": {"w1": 0.25}, "ok": True, "name": "x", "n": float("nan")})
    {'loss': 0.5, 'share/w1': 0.25, 'ok': 1.0}
    """
    out: dict[str, float] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[key] = float(v)
    return out


def _metric_name(key: str) -> str:
    """MLflow metric names allow alphanumerics, ``_ - . / space``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


class MetricsTracker:
    """One MLflow run that per-iteration metrics go to.

    ``run_id``: continue that run (a resumed flow or bench); otherwise a new run named ``run_name`` is
    created in ``experiment`` (created when missing). ``log`` skips a step already logged in this run.
    """

    def __init__(self, tracking_uri: str, experiment: str = DEFAULT_EXPERIMENT, *, run_name: str | None = None,
                 run_id: str | None = None, tags: Mapping[str, str] | None = None):
        if tracking_uri.startswith("file:") or "://" not in tracking_uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3: the file store is opt-in
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        if run_id:
            run = self.client.get_run(run_id)
            self.run_id = run.info.run_id
            self.experiment_id = run.info.experiment_id
            if run.info.status != "RUNNING":
                self.client.update_run(self.run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(experiment)
            self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
            self.run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=dict(tags or {})).info.run_id
        self._logged = {int(m.step) for m in self.client.get_metric_history(self.run_id, STEP_KEY)}

    @property
    def logged_steps(self) -> set[int]:
        return set(self._logged)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Hyper-parameters (flattened; values as text, MLflow's limit of 6,000 characters each)."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        items = [Param(_metric_name(k), str(v)[:6000]) for k, v in _flat_params(params).items() if k not in existing]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log(self, metrics: Mapping[str, Any], step: int) -> bool:
        """Log one iteration's numeric metrics at ``step``; False (nothing written) if that step is already in."""
        from mlflow.entities import Metric

        step = int(step)
        if step in self._logged:
            return False
        now = int(time.time() * 1000)
        flat = {**flatten(metrics), STEP_KEY: float(step)}
        items = [Metric(_metric_name(k), v, now, step) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i:i + 1000])
        self._logged.add(step)
        return True

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def history(self, key: str) -> list[tuple[int, float]]:
        """(step, value) pairs of one metric, by step."""
        return sorted((int(m.step), float(m.value)) for m in self.client.get_metric_history(self.run_id, _metric_name(key)))

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def _flat_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, Mapping):
            out.update(_flat_params(v, f"{prefix}{k}."))
        elif v is not None:
            out[f"{prefix}{k}"] = v
    return out


def rollout_metrics(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """Reward mean/std, accuracy, parse rate, worker shares (of root-workflow steps), calls, workflow length and
    seconds per trajectory, cache hits. Infra-failed trajectories are counted, not scored.

    >>> from conductor.trajectory import CallRecord, Round, Trajectory
    >>> def t(reward, worker, status="ok"):
    ...     c = CallRecord("0.0", None, 0, 0, 0, worker, "local", "m", "s", latency_s=2.0)
    ...     return Trajectory("t", "r", "rollout", "q", "d", "math", "?", rounds=[Round(0, "p", "c", parse_status=status)],
    ...                       calls=[c], reward=reward, correct=reward == 1.0, wall_s=3.0)
    >>> m = rollout_metrics([t(1.0, "a"), t(0.5, "b"), t(0.0, "b", "parse_error")])
    >>> m["reward_mean"], round(m["reward_std"], 3), m["parse_rate"], m["worker_share"]
    (0.5, 0.408, 0.6667, {'a': 0.3333, 'b': 0.6667})
    """
    ts = list(trajectories)
    scored = [t for t in ts if not t.infra_failed and t.reward is not None]
    rewards = [float(r) for t in scored if (r := t.reward) is not None]
    n = len(scored)
    mean = sum(rewards) / n if n else float("nan")
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n) if n else float("nan")
    shares: Counter[str] = Counter(c.worker for t in scored for c in t.calls if c.depth == 0)
    total = sum(shares.values())
    calls = [c for t in ts for c in t.calls]
    steps = [len(t.rounds[0].steps) for t in scored if t.rounds and t.rounds[0].parse_status == "ok"]
    return {
        "reward_mean": mean, "reward_std": std,
        "accuracy": sum(bool(t.correct) for t in scored) / n if n else float("nan"),
        "parse_rate": round(sum(bool(t.rounds) and t.rounds[0].parse_status == "ok" for t in scored) / n, 4) if n else float("nan"),
        "worker_share": {w: round(k / total, 4) for w, k in sorted(shares.items())},
        "calls_per_trajectory": len(calls) / len(ts) if ts else 0.0,
        "cache_hit_rate": sum(c.cache_hit for c in calls) / len(calls) if calls else float("nan"),
        "steps_per_workflow": sum(steps) / len(steps) if steps else float("nan"),
        "call_seconds": sum(c.latency_s for c in calls if not c.cache_hit),
        "rollout_s": sum(t.wall_s for t in ts),
        "n_trajectories": len(ts), "n_infra_failed": len(ts) - n,
    }


def plot_curves(history: Sequence[Mapping[str, Any]], out: str | Path, title: str = "GRPO training",
                keys: Iterable[str] = CURVES) -> Path:
    """One small panel per metric against the iteration (plus worker shares, stacked), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flat = [flatten(h) for h in history]
    present = [k for k in keys if any(k in f for f in flat)]
    workers = sorted({k.split("/", 1)[1] for f in flat for k in f if k.startswith("worker_share/")})
    panels = present + (["worker_share"] if workers else [])
    cols = 4
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    its = [f.get(STEP_KEY, i + 1) for i, f in enumerate(flat)]
    for ax, key in zip(axes.flat, panels):
        if key == "worker_share":
            bottom = [0.0] * len(flat)
            for w in workers:
                v = [f.get(f"worker_share/{w}", 0.0) for f in flat]
                ax.bar(its, v, bottom=bottom, label=w, width=0.9)
                bottom = [b + x for b, x in zip(bottom, v)]
            ax.legend(fontsize=6)
        else:
            pts = [(i, f[key]) for i, f in zip(its, flat) if key in f]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=2.5)
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out, dpi=100)
