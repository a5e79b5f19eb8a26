"""The settings of the commands around the runs: `conductor eval-compare`, `registry show|register|promote|rollback`,
`record`, `grade` and `pool sample`.

WHY models for small commands: each setting is named once, as a field (name, default, bounds, description), and
the command's options are generated from it (``cli/run_options.py: config_options``), as for the run
configurations in conductor/run/config.py; what a command acts on (a run id, a file, a checkpoint) stays its
positional argument. Defaults that belong to a library type are read from it (``PromotionPolicy``), not
written again.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from conductor.learning.registry import PromotionPolicy
from conductor.run.config import DEFAULT_POOL, RunConfig, one_of

REGISTRY_HELP = "Registry root (local dir or s3://...) or mlflow+<tracking-uri>#<model>; default $CONDUCTOR_REGISTRY."


Metric = Literal["correct", "reward"]
PromotionTest = Literal["bootstrap", "mcnemar", "both"]


class EvalCompareConfig(RunConfig):
    """``conductor eval-compare``: paired comparison of two evaluation runs in one lake."""

    lake: str = Field(description="Lake root holding both evaluation runs.")
    candidate_run: str = Field(description="Evaluation run of the candidate.")
    champion_run: str = Field(description="Evaluation run of the champion (same questions).")
    metric: Metric = Field("correct", description="correct (accuracy) or reward.")
    n_boot: int = Field(10_000, ge=100, description="Bootstrap resamples for the paired test.")
    seed: int = Field(0, description="Seed of the bootstrap.")
    out: str | None = Field(None, description="Write the EvalReport JSON here.")
    candidate_id: str = Field("", description="The candidate's checkpoint id, as the report names it.")
    champion_id: str = Field("", description="The champion's checkpoint id, as the report names it.")

    _metric = field_validator("metric", mode="before")(classmethod(lambda cls, v: one_of(v, get_args(Metric))))


class RegistryConfig(RunConfig):
    """Every ``conductor registry`` verb: which registry."""

    registry: str | None = Field(None, description=REGISTRY_HELP)


class RegistryShowConfig(RegistryConfig):
    """``conductor registry show``."""

    history: int = Field(10, ge=0, description="How many recent history events to print.")


class RegisterConfig(RegistryConfig):
    """``conductor registry register URI``."""

    checkpoint_id: str | None = Field(None, description="Checkpoint id (default: lineage id or directory name).")


_POLICY = PromotionPolicy()


class PromoteConfig(RegistryConfig):
    """``conductor registry promote CHECKPOINT_ID``: the promotion rule's settings (``PromotionPolicy``'s
    defaults), the report it judges, or ``force``."""

    report: str | None = Field(None, description="EvalReport JSON of this candidate vs the champion.")
    force: bool = Field(False, description="Promote without a report (recorded as manual).")
    alpha: float = Field(_POLICY.alpha, ge=0.0, le=1.0, description="Significance level of the paired test.")
    test: PromotionTest = Field(_POLICY.test, description="bootstrap, mcnemar or both.")
    tolerance: float = Field(_POLICY.max_domain_regression, ge=0.0, description="Largest allowed per-domain drop.")
    reason: str = Field("manual promotion", description="Why, as the registry's history records it.")

    _test = field_validator("test", mode="before")(classmethod(lambda cls, v: one_of(v, get_args(PromotionTest))))

    def policy(self) -> PromotionPolicy:
        return PromotionPolicy(alpha=self.alpha, test=self.test, max_domain_regression=self.tolerance)


class RollbackConfig(RegistryConfig):
    """``conductor registry rollback``."""

    reason: str = Field("manual rollback", description="Why, as the registry's history records it.")


class RecordConfig(RunConfig):
    """``conductor record``: every menu entry's workflow on every question, into a response cache."""

    questions: str = Field(description="Question set, as for `conductor answer` (e.g. gsm8k_test:50).")
    menu: str = Field(description="Strategy specs, comma-separated: the workflows to record "
                      "(e.g. fixed:0,pot:0,chain:0:1,moa:0:0,cascade:0+pot-0:0).")
    cache: str = Field(description="The response cache to record into (SQLite; created).")
    pool: str = Field(DEFAULT_POOL, description="Worker pool manifest.")
    limit: int | None = Field(None, ge=1, description="Only the first N questions.")


class GradeConfig(RunConfig):
    """``conductor grade FILE``; the command checks the bounds (its error lines name them)."""

    workers: int = Field(0, description="lines graded in parallel (0 = number of cores)")
    timeout: float = Field(10.0, allow_inf_nan=True, description="wall-clock seconds per sandboxed code run")


class PoolSampleConfig(RunConfig):
    """``conductor pool sample FILE``: a random k-of-n sub-pool."""

    k: int = Field(ge=1, description="How many workers the sub-pool has.")
    seed: int = Field(0, description="Random seed; the same seed gives the same sub-pool.")
    shuffle: bool = Field(False, description="Random order instead of manifest order.")
