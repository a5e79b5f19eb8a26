"""The typed configuration of a run: answer, rollout (and eval) and nightly runs.

WHY one model per kind of run: the command line builds it from its options or reads it from a YAML file
(``--config run.yaml``; options given on the command line override the file), it is validated once, passed
to the flow as its one parameter (Prefect validates pydantic parameters), and the fields that define the
run are what its id hashes (``AnswerConfig.settings_key``), so the same settings always give the same run id
and a rerun resumes. The format is documented in docs/run-config.md; data/run-configs/ holds examples.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conductor.resources import data_path

if TYPE_CHECKING:
    from conductor.workers.pool import Pool

DEFAULT_POOL = str(data_path("pools", "local.yaml"))

C = TypeVar("C", bound="RunConfig")


class ConfigError(ValueError):
    """A configuration that does not validate; the message is one line naming the file (or flag) and field."""


class RunConfig(BaseModel):
    """Common behaviour: unknown fields are mistakes, values are checked on construction, never changed after."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @classmethod
    def build(cls: type[C], file: str | os.PathLike[str] | None = None, given: Mapping[str, Any] | None = None,
              flags: Mapping[str, str] | None = None) -> C:
        """The configuration from a YAML ``file`` (optional) with the ``given`` values over it.

        ``flags`` names the command-line option of each given field, so an error says ``--samples`` for a value
        typed on the command line and ``run.yaml: field samples`` for one read from the file."""
        values = read_yaml(file) if file is not None else {}
        given = dict(given or {})
        try:
            return cls.model_validate({**values, **given})
        except ValidationError as e:
            err = e.errors()[0]
            name = ".".join(str(p) for p in err["loc"]) or "(top level)"
            top = str(err["loc"][0]) if err["loc"] else ""
            if top in given or file is None:
                where = (flags or {}).get(top, f"--{top.replace('_', '-')}") if top else "options"
                raise ConfigError(f"{where}: {err['msg']}") from None
            raise ConfigError(f"{file}: field {name}: {err['msg']}") from None


def expand_path(value: Any) -> Any:
    """A path as the user meant it: ``~`` and ``$VAR``/``${VAR}`` expanded, once, for every path of a run (a
    configuration file is not a shell). URLs (``s3://...``) keep their text; an empty path is a mistake."""
    if not isinstance(value, (str, os.PathLike)):
        return value
    text = str(value)
    if not text.strip():
        raise ValueError("must be a non-empty path (an empty one would mean the current directory)")
    if "://" in text:
        return text
    return os.path.expanduser(os.path.expandvars(text))


def eval_run_id(checkpoint_id: str, *config: Any) -> str:
    """Deterministic: re-evaluating the same checkpoint on the same config resumes (and the champion's
    evaluation is reused across nights)."""
    digest = hashlib.sha256(json.dumps([checkpoint_id, *config], default=str).encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in checkpoint_id)[-40:]
    return f"eval-{safe}-{digest}"


def read_yaml(file: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML mapping of field names to values; ConfigError (one line) when it cannot be read or is not one."""
    import yaml

    try:
        text = Path(file).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{file}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = Path(file).read_bytes()[:e.start].count(b"\n") + 1
        raise ConfigError(f"{file}:{line}: not UTF-8 text (byte {e.start + 1}); save the file as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{file}{line}: not valid YAML: {getattr(e, 'problem', None) or str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping of field names to values, got {type(data).__name__}")
    return data


class AnswerConfig(RunConfig):
    """``conductor answer``: a question set through the conductor and a worker pool, into the lake."""

    kind: ClassVar[Literal["answer"]] = "answer"

    questions: str                         # a file (local or s3://) or dataset names with limits
    out: str                               # output directory: lake/, answers.jsonl, summary.json, report/
    pool: str = DEFAULT_POOL
    conductor: str = "auto"
    samples: int = Field(1, ge=1)
    recursion_depth: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)
    shard_size: int = Field(5, ge=1)
    k: int | None = Field(None, ge=1)
    seed: int = 0
    temperature: float | None = Field(None, ge=0)   # None: greedy for the untrained embedded conductor, else 0.7
    max_tokens: int = Field(768, ge=16)
    run_id: str | None = None              # None: derived from the questions and the settings (reruns resume)
    cache: str | None = None               # None: OUT/cache.sqlite
    replay: bool = False
    lake: str | None = None                # None: OUT/lake
    fewshot: str = "auto"
    constrained: bool | None = None        # None: on for the embedded conductor
    max_steps: int = Field(5, ge=1)
    max_cost: float | None = Field(None, gt=0)   # dollars per question; steps past it are not run (executor)
    retry_failed: bool = True
    batch: bool = False
    batch_poll_s: float = Field(60.0, gt=0)
    limits: str | None = None
    compact: bool = False
    show_progress: bool | None = None      # a progress bar (None: when the terminal is interactive)

    _paths = field_validator("out", "pool", "cache", "lake", mode="before")(
        classmethod(lambda cls, v: expand_path(v)))

    # The settings that change answers, in the order the settings key has always hashed them (so run ids and
    # trajectory ids stay what they were); the pool's identity and the checkpoint come first.
    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("samples", "recursion_depth", "k", "seed", "temperature", "max_tokens",
                                   "fewshot", "constrained", "max_steps")

    def settings_key(self, pool: Pool, checkpoint: str) -> str:
        """Hash of what defines the run's answers: the pool, the checkpoint and ``RUN_FIELDS`` (resolved:
        call it on the configuration ``prepare_answer`` returns). Not the limit, shard size, paths or modes."""
        settings = [pool.id, pool.fingerprint, checkpoint, *(getattr(self, f) for f in self.RUN_FIELDS)]
        if self.max_cost is not None:    # appended only when set, so earlier run ids stay what they were
            settings.append(["max_cost", self.max_cost])
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def derive_run_id(self, key: str) -> str:
        """Same question set and settings, same run id: that is what makes a rerun resume instead of starting
        over. The limit is not part of it (a larger ``--limit`` adds to the run), nor is the shard size."""
        return "answer-" + hashlib.sha256(json.dumps([self.questions.strip(), key]).encode()).hexdigest()[:12]

    def pipeline_settings(self) -> dict[str, Any]:
        """The ``RunSpec`` fields this configuration decides."""
        return {"samples": self.samples, "subpool_k": self.k, "seed": self.seed, "recursion_depth": self.recursion_depth,
                "temperature": self.temperature, "max_tokens": self.max_tokens, "fewshot": self.fewshot,
                "constrained": bool(self.constrained), "max_steps": self.max_steps,
                "max_dollars_per_question": self.max_cost}


class RolloutConfig(RunConfig):
    """``conductor rollout`` (and the evaluation runs, ``kind: eval``): GRPO groups written to the lake."""

    questions: str
    lake: str
    pool: str
    conductor: str                         # a policy spec, e.g. transformers:CKPT_DIR, or a baseline strategy
    run_id: str                            # rerunning it resumes (committed shards are skipped)
    group_size: int = Field(8, ge=1)       # GRPO group size G: samples per question
    k: int | None = Field(None, ge=1)
    seed: int = 0
    temperature: float = Field(1.0, ge=0)
    max_tokens: int = Field(1024, ge=16)
    recursion_depth: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)
    offset: int = Field(0, ge=0)           # a window over the set, wrapping around (iteration i of a training mix)
    shard_size: int = Field(4, ge=1)
    cache: str | None = None
    kind: Literal["rollout", "eval"] = "rollout"
    checkpoint_id: str | None = None       # None: derived from the conductor spec
    fewshot: str = "ood"
    limits: str | None = None
    max_cost: float | None = Field(None, gt=0)   # dollars per question; steps past it are not run (executor)

    _paths = field_validator("pool", "lake", mode="before")(classmethod(lambda cls, v: expand_path(v)))

    def pipeline_settings(self) -> dict[str, Any]:
        """The ``RunSpec`` fields this configuration decides."""
        return {"samples": self.group_size, "subpool_k": self.k, "seed": self.seed, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "recursion_depth": self.recursion_depth, "fewshot": self.fewshot,
                "max_dollars_per_question": self.max_cost}


class NightlyConfig(RunConfig):
    """``conductor nightly``: retrain when the pool changed, evaluate, promote if significantly better."""

    pool: str
    train_questions: str
    eval_questions: str
    work_dir: str                          # lake, checkpoints, cache, registry and reports live here
    base: str                              # the checkpoint to start from when there is no champion
    registry: str | None = None            # None: WORK_DIR/registry
    night: str | None = None               # None: today (UTC); rerunning a night resumes it
    iterations: int = Field(2, ge=1)
    questions_per_iteration: int = Field(4, ge=1)
    group_size: int = Field(8, ge=2)
    k: int | None = Field(None, ge=1)
    seed: int = 0
    eval_samples: int = Field(2, ge=1)
    eval_limit: int | None = Field(None, ge=1)
    max_tokens: int = Field(1024, ge=16)
    grpo: dict[str, Any] | None = None     # GRPO config overrides (conductor.learning.grpo.config)
    heldout_workers: list[str] | None = None
    baselines: bool = True                 # also evaluate every single worker, for the report's plot
    headroom: bool = True                  # before training on a new pool: the headroom check (conductor/stats)
    force: bool = False                    # retrain even if the pool is unchanged
    max_calls: int | None = Field(None, ge=1)
    max_dollars: float | None = Field(None, ge=0)
    max_hours: float | None = Field(None, ge=0)
    promotion: dict[str, Any] | None = None   # PromotionPolicy fields (conductor.learning.registry)
    shard_size: int = Field(4, ge=1)
    backend: str = "transformers"          # the policy backend that samples rollouts from a checkpoint
    lake: str | None = None                # None: WORK_DIR/lake
    fewshot: str = "ood"
    tracking_uri: str | None = None        # MLflow; None: $MLFLOW_TRACKING_URI or WORK_DIR/mlruns; "none": off
    conductor_format: dict[str, Any] | None = None   # a decoding contract for the base (conductor.learning.grpo.format)
    limits: str | None = None

    _paths = field_validator("pool", "work_dir", "lake", mode="before")(classmethod(lambda cls, v: expand_path(v)))
