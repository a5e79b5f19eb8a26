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
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Required, TypeVar, get_args

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from conductor.execution.executor import Budget
from conductor.execution.shared_limits import LimitsField
from conductor.policy.spec import AutoSpec, ChampionSpec, ConductorSpec, ConductorSpecField
from conductor.prompts import FewShotField, FewShotSpec
from conductor.resources import data_path
from conductor.workflow import DEFAULT_MAX_STEPS

if TYPE_CHECKING:
    from conductor.learning.grpo.config import GRPOConfig
    from conductor.workers.pool import Pool

DEFAULT_POOL = str(data_path("pools", "local.yaml"))

C = TypeVar("C", bound="RunConfig")


class MLflowTracking(TypedDict, total=False):
    """Where a training step logs its metrics: ``uri``, ``experiment``, and ``run_id`` (continue a run) or
    ``run_name`` (start one)."""

    uri: Required[str]
    experiment: str
    run_id: str | None
    run_name: str

CONDUCTOR_MAX_TOKENS = 768     # the conductor's completion limit when answering (rollouts: the paper's 1024)
MaxSteps = Annotated[int, Field(ge=1)]     # default conductor.workflow.DEFAULT_MAX_STEPS (the paper: 5)

# Dollars per question, named as the executor's ``Budget.max_dollars`` from the configuration down; the command
# line keeps ``--max-cost`` and a YAML file may still say ``max_cost:`` (its first name).
MaxDollars = Annotated[float | None, Field(gt=0, validation_alias=AliasChoices("max_dollars", "max_cost"))]


class TextOption:
    """Marks a list or mapping field that is a command-line option all the same: its text (comma-separated
    names, a JSON object) is parsed by the field's validator (``cli/run_options.py: cli_type``)."""


TEXT_OPTION = TextOption()


def _comma_list(value: Any) -> Any:
    """``a, b`` -> ``["a", "b"]`` (an empty text: unset); a list (from a file) as it is."""
    if isinstance(value, str):
        return [w.strip() for w in value.split(",") if w.strip()] if value else None
    return value


def _json_object(value: Any) -> Any:
    """A JSON object's text -> its mapping (an empty text: unset); a mapping (from a file) as it is."""
    if not isinstance(value, str):
        return value
    if not value:
        return None
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise PydanticCustomError("json_text", "not JSON: {msg} at column {column}",
                                  {"msg": e.msg, "column": e.colno}) from None
    if not isinstance(data, dict):
        raise PydanticCustomError("json_object", "must be a JSON object of GRPOConfig fields")
    return data


# A list of names: comma-separated on the command line (`--heldout-workers a,b`), a list in a file.
CommaList = Annotated[list[str], BeforeValidator(_comma_list), TEXT_OPTION]
# GRPOConfig fields (conductor.learning.grpo.config): a JSON object on the command line, a mapping in a file.
GRPOOverrides = Annotated[dict[str, Any], BeforeValidator(_json_object), TEXT_OPTION]
GRPOPreset = Literal["cpu", "paper"]     # GRPOConfig.cpu() and GRPOConfig.paper() (tests/test_cli_options_train.py)


def one_of(value: Any, choices: Collection[str]) -> Any:
    """``value`` if it is one of ``choices``, else the error ``must be a, b or c, not 'x'`` (a field validator's)."""
    if value is None or value in choices:
        return value
    names = [str(c) for c in choices]
    raise PydanticCustomError("choice", "must be {expected}, not {given}",
                              {"expected": " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names),
                               "given": repr(value)})


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
        at = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{file}{at}: not valid YAML: {getattr(e, 'problem', None) or str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping of field names to values, got {type(data).__name__}")
    return data


class AnswerSettings(RunConfig):
    """What every run of the answer pipeline is set with: ``conductor answer``, ``compare`` and ``headroom``
    (each strategy or worker of those two is one answer run with these settings)."""

    pool: str = Field(DEFAULT_POOL, description="Worker pool manifest (default: the embedded local pool).")
    conductor: ConductorSpecField = Field(AutoSpec(), description=(
        "Conductor policy: auto (the champion if one was promoted, else embedded), embedded, "
        "transformers:DIR[#FILE.gguf], llamacpp:FILE.gguf, vllm:MODEL, openai:MODEL@URL, or champion (the "
        "registry's); or a baseline strategy (docs/strategies.md): fixed:I, sc:I:K, moa:P1+P2+...:AGG, "
        "vote:P1+P2+..., pot:I, chain:I:R, cascade:A+B+...:J, random[:SEED[:MAX_STEPS]]; or menu:E1,E2,... (the "
        "embedded model picks one of these fixed workflows per question; docs/default-conductor.md)."))
    limit: int | None = Field(None, ge=1, description="Answer only the first N questions.")
    shard_size: int = Field(5, ge=1, description="Questions per shard (the unit of resume).")
    seed: int = Field(0, description="Seed of the sub-pool draws and the conductor's sampling.")
    temperature: float | None = Field(None, ge=0, description="Conductor sampling temperature (default: 0, greedy, "
                                      "for the untrained embedded conductor; 0.7 otherwise).")
    max_tokens: int = Field(CONDUCTOR_MAX_TOKENS, ge=16, description="Conductor completion limit.")
    cache: str | None = Field(None, description="Response cache (SQLite); default OUT/cache.sqlite.")
    replay: bool = Field(False, description="Answer only from the cache; never call a provider.")
    lake: str | None = Field(None, description="Lake root for the trajectories: a local path or s3://bucket/prefix "
                             "(default OUT/lake; S3 credentials from AWS_* variables).")
    fewshot: FewShotField = Field(FewShotSpec(policy="auto"), description=(
        "Conductor prompt and examples: auto (informed for the untrained embedded conductor, else ood), informed "
        "(worker notes, examples on this pool's roles), ood (the paper's default), in_domain, mixed, none; "
        "optionally :k."))
    constrained: bool | None = Field(None, description="Decode the conductor under the workflow grammar (default: "
                                     "on for the embedded conductor, off otherwise).")
    max_steps: MaxSteps = Field(DEFAULT_MAX_STEPS, description="Most steps a workflow may have (the paper: 5).")

    _setting_paths = field_validator("pool", "cache", "lake", mode="before")(
        classmethod(lambda cls, v: expand_path(v)))

    def answer_settings(self) -> dict[str, Any]:
        """These settings as ``AnswerConfig`` fields (a compare or headroom run hands them to each answer run)."""
        return {name: getattr(self, name) for name in AnswerSettings.model_fields}


class AnswerConfig(AnswerSettings):
    """``conductor answer``: a question set through the conductor and a worker pool, into the lake."""

    kind: ClassVar[Literal["answer"]] = "answer"

    questions: str = Field(description="A JSONL/CSV/Parquet file (local or s3://) with id, question and optional "
                           "answer; or dataset names with optional limits, e.g. gsm8k_test:10,mmlu_stem:10.")
    out: str = Field(description="Output directory: lake/, answers.jsonl, summary.json, report/.")
    samples: int = Field(1, ge=1, description="Conductor samples per question.")
    recursion_depth: int = Field(0, ge=0, description="Extra conductor rounds over its own answer.")
    k: int | None = Field(None, ge=1, description="Show the conductor a random k-of-n sub-pool per question.")
    run_id: str | None = Field(None, description="Name the run (default: derived from the inputs, so reruns resume).")
    max_dollars: MaxDollars = Field(None, description="Dollars per question: a step that would start once "
                                    "they are spent is not run, and the answer is the last step that ran.")
    retry_failed: bool = Field(True, description="Redo questions an earlier run of this command lost to "
                               "infrastructure failures (default), or keep them as they are.")
    batch: bool = Field(False, description="Send the OpenAI, Anthropic and Gemini workers' calls through their batch "
                        "APIs: half price, answers within hours (docs/operations.md).")
    batch_poll_s: float = Field(60.0, gt=0, description="Seconds between polls of a batch.")
    limits: LimitsField | None = Field(None, description="Share provider limits with other processes: sqlite:PATH (one "
                               "machine) or prefect (a Prefect server); default: this process alone.")
    compact: bool = Field(False, description="Merge the run's shard files into a few large ones at the end "
                          "(conductor lake compact).")
    show_progress: bool | None = Field(None, description="A progress bar (default: when the terminal is "
                                       "interactive); not a command-line option.")

    _out_path = field_validator("out", mode="before")(classmethod(lambda cls, v: expand_path(v)))

    # The settings that change answers, in the order the settings key has always hashed them (so run ids and
    # trajectory ids stay what they were); the pool's identity and the checkpoint come first.
    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("samples", "recursion_depth", "k", "seed", "temperature", "max_tokens",
                                   "fewshot", "constrained", "max_steps")

    def settings_key(self, pool: Pool, checkpoint: str) -> str:
        """Hash of what defines the run's answers: the pool, the checkpoint and ``RUN_FIELDS`` (resolved:
        call it on the configuration ``prepare_answer`` returns). Not the limit, shard size, paths or modes."""
        settings = [pool.id, pool.fingerprint, checkpoint, *(getattr(self, f) for f in self.RUN_FIELDS)]
        if self.max_dollars is not None:   # appended only when set (under its first name, max_cost), so
            settings.append(["max_cost", self.max_dollars])   # earlier run ids stay what they were
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
                "budget": Budget(max_dollars=self.max_dollars)}


class ScheduledAnswerConfig(AnswerConfig):
    """The scheduled-answering deployment (flows/scheduled_answer.py): ``conductor answer`` into
    ``OUT_ROOT/<scheduled date>/``, one directory per scheduled run, so each night is a run of its own."""

    out_root: str = Field(description="Each scheduled run answers into OUT_ROOT/<scheduled date>/.")
    out: str = Field("", description="Not set here: each run answers into OUT_ROOT/<scheduled date>/.")
    # A deployment's runs sample at 0.7 whatever the conductor (as they always have): not answer's per-conductor
    # default.
    temperature: float | None = Field(0.7, ge=0, description="Conductor sampling temperature.")
    secret_blocks: dict[str, str] | None = Field(None, description=(
        "Provider key variables -> Prefect Secret block names, e.g. {OPENAI_API_KEY: openai-api-key} "
        "(docs/operations.md: rotating keys)."))

    _root_path = field_validator("out_root", mode="before")(classmethod(lambda cls, v: expand_path(v)))

    def answer_config(self, out: str) -> AnswerConfig:
        """The answer run of one scheduled night, into ``out``."""
        fields = {name: getattr(self, name) for name in AnswerConfig.model_fields}
        return AnswerConfig(**{**fields, "out": out, "show_progress": False})


class _ReadOrRun(AnswerSettings):
    """A command that runs strategies (each one answer run into a shared lake) or reads their runs back."""

    out: str = Field(description="Output directory.")
    lake: str | None = Field(None, description="Lake holding the runs (default OUT/lake); without QUESTIONS, "
                             "the runs are read from it instead of run.")
    runs: str | None = Field(None, description="Read mode: which runs, as LABEL=RUN_ID or RUN_ID, comma-separated "
                             "(default: every answer run in --lake).")
    cache: str | None = Field(None, description="One response cache for every run (default: one per run under "
                              "OUT/runs/, so seconds per question are not flattered by another run's cached calls).")
    seed: int = Field(0, description="Seeds the runs (sub-pools, sampling) and the bootstrap.")

    _out_path = field_validator("out", mode="before")(classmethod(lambda cls, v: expand_path(v)))


class CompareConfig(_ReadOrRun):
    """``conductor compare``: the conductor and the baselines on one question set and pool, as the paper's table."""

    questions: str | None = Field(None, description="Question set to run every strategy on (as for `conductor "
                                  "answer`); leave out to read existing runs from --lake.")
    out: str = Field(description="Output directory: compare.md, compare.json, compare.png, runs/, lake/.")
    strategies: str = Field("conductor,fixed:*,random", description=(
        "Comma-separated: conductor (the --conductor policy), fixed:I (fixed:* = every worker), sc:I:K, "
        "moa:P1+P2+...:AGG, vote:P1+P2+..., random[:SEED[:MAX_STEPS]]."))
    n_boot: int = Field(10_000, ge=100, description="Bootstrap resamples for the paired test.")


class HeadroomConfig(_ReadOrRun):
    """``conductor headroom``: can this pool be won at all (pool-bound), or did the router fail (router-bound)?
    Each worker (or option) runs as an answer run with the ``AnswerSettings`` defaults."""

    questions: str | None = Field(None, description="Question set to run every worker alone on (as for "
                                  "`conductor answer`); leave out to read the single-worker runs from --lake.")
    out: str = Field(description="Output directory: headroom.json, headroom.md, headroom.png (and runs/, lake/ "
                     "when QUESTIONS is given).")
    lake: str | None = Field(None, description="Lake holding the single-worker runs (fixed:i, as written by "
                             "`conductor compare --strategies fixed:*`); default OUT/lake with QUESTIONS.")
    runs: str | None = Field(None, description="Read mode: which runs, as LABEL=RUN_ID or RUN_ID, comma-separated "
                             "(default: every answer run in --lake; the fixed:i ones are the workers).")
    policy: str | None = Field(None, description="A run in the lake to place between the best single worker and "
                               "the cross-fit oracle: its label (e.g. conductor) or run id.")
    folds: int = Field(5, ge=2, description="Cross-fit folds.")
    n_boot: int = Field(2000, ge=100, description="Bootstrap resamples over questions.")
    seed: int = Field(0, description="Seeds the runs, the fold split and the bootstrap.")
    margin: float = Field(0.01, ge=0, le=1, description="Any-correct gains whose 95% CI lower bound is at most "
                          "this (accuracy, 0.01 = 1 point) are noise: pool-bound.")
    alpha: float = Field(0.05, ge=0.0001, le=0.5, description="Significance level of the paired tests.")
    # inf passes the model so the command names it (`--cost-weight inf: must be a finite number >= 0`)
    cost_weight: float = Field(0.0, ge=0, allow_inf_nan=True, description="The cross-fit router's objective: "
                               "accuracy minus this times dollars per question.")
    options: str = Field("fixed:*", description="The options the router picks between: strategy specs, "
                         "comma-separated (default fixed:*, every worker alone; e.g. a menu of workflows "
                         "fixed:0,pot:0,chain:0:1,cascade:0+pot-0:0).")


class RolloutConfig(RunConfig):
    """``conductor rollout`` (and the evaluation runs, ``kind: eval``): GRPO groups written to the lake."""

    questions: str = Field(description="Training questions: dataset names with limits or a file.")
    lake: str = Field(description="Lake root (local path or s3://).")
    pool: str = Field(description="Worker pool manifest.")
    conductor: ConductorSpecField = Field(description=(
        "Policy spec, e.g. transformers:CKPT_DIR or vllm:CKPT_DIR, or a baseline strategy."))
    run_id: str = Field(description="Rollout run id (rerunning it resumes: committed shards are skipped).")
    group_size: int = Field(8, ge=1, description="GRPO group size G (samples per question).")
    k: int | None = Field(None, ge=1, description="Randomized k-of-n sub-pools per question.")
    seed: int = Field(0, description="Seed of the sub-pool draws and the conductor's sampling.")
    temperature: float = Field(1.0, ge=0, description="Conductor sampling temperature.")
    max_tokens: int = Field(1024, ge=16, description="Conductor completion limit.")
    recursion_depth: int = Field(0, ge=0, description="Extra conductor rounds over its own answer.")
    limit: int | None = Field(None, ge=1, description="Roll out only N questions.")
    offset: int = Field(0, ge=0, description=(
        "Start the window of questions here, wrapping around (iteration i of a training mix)."))
    shard_size: int = Field(4, ge=1, description="Questions per shard (the unit of resume).")
    cache: str | None = Field(None, description="Response cache (SQLite).")
    kind: Literal["rollout", "eval"] = Field("rollout", description="rollout, or eval for an evaluation run.")
    checkpoint_id: str | None = Field(None, description=(
        "The policy's checkpoint id (default: derived from the conductor spec)."))
    fewshot: FewShotField = Field(FewShotSpec(policy="ood"), description=(
        "Conductor prompt and examples (as `conductor answer --fewshot`)."))
    limits: LimitsField | None = Field(None, description=(
        "Share provider limits with other processes: sqlite:PATH or prefect."))
    max_dollars: MaxDollars = Field(None, description="Dollars per question: steps past it are not run.")

    _paths = field_validator("pool", "lake", mode="before")(classmethod(lambda cls, v: expand_path(v)))

    def pipeline_settings(self) -> dict[str, Any]:
        """The ``RunSpec`` fields this configuration decides."""
        return {"samples": self.group_size, "subpool_k": self.k, "seed": self.seed, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "recursion_depth": self.recursion_depth, "fewshot": self.fewshot,
                "budget": Budget(max_dollars=self.max_dollars)}


class NightlyConfig(RunConfig):
    """``conductor nightly``: retrain when the pool changed, evaluate, promote if significantly better."""

    pool: str = Field(description="Worker pool manifest.")
    train_questions: str = Field(description="Training mix, e.g. gsm8k_train:200,mmlu:200.")
    eval_questions: str = Field(description="Held-out evaluation questions.")
    work_dir: str = Field(description="Lake, checkpoints, cache, registry and reports live here.")
    base: str = Field(description="Checkpoint to start from when there is no champion.")
    registry: str | None = Field(None, description="Registry root or mlflow+URI#model (default WORK_DIR/registry).")
    night: str | None = Field(None, description="Night tag (default today, UTC); rerunning a night resumes it.")
    iterations: int = Field(2, ge=1, description="Rollout -> GRPO iterations per night.")
    questions_per_iteration: int = Field(4, ge=1, description="Training questions per iteration.")
    group_size: int = Field(8, ge=2, description="GRPO group size G (samples per question).")
    k: int | None = Field(None, ge=1, description="Randomized k-of-n sub-pools per question.")
    seed: int = Field(0, description="Seed of the sub-pool draws, the sampling and the statistics.")
    eval_samples: int = Field(2, ge=1, description="Repeated samples per evaluation question.")
    eval_limit: int | None = Field(None, ge=1, description="Evaluate on only the first N questions.")
    max_tokens: int = Field(1024, ge=16, description="Conductor completion limit.")
    grpo: GRPOOverrides | None = Field(None, description="GRPO config overrides as JSON, e.g. "
                                       "'{\"learning_rate\": 1e-5}' (conductor.learning.grpo.config).")
    heldout_workers: list[str] | None = Field(None, description=(
        "Workers forming a held-out sub-pool for the evaluation."))
    baselines: bool = Field(True, description="Also evaluate every single worker, for the report's plot.")
    headroom: bool = Field(True, description="Before training on a new pool: the headroom check (conductor/stats).")
    force: bool = Field(False, description="Retrain even if the pool is unchanged.")
    max_calls: int | None = Field(None, ge=1, description="Stop between stages after this many worker calls.")
    max_dollars: float | None = Field(None, ge=0, description="Stop between stages after this many dollars.")
    max_hours: float | None = Field(None, ge=0, description="Stop between stages after this many hours.")
    promotion: dict[str, Any] | None = Field(None, description=(
        "PromotionPolicy fields (conductor.learning.registry)."))
    shard_size: int = Field(4, ge=1, description="Questions per shard (the unit of resume).")
    backend: str = Field("transformers", description="Rollout backend for checkpoints: transformers or vllm.")
    lake: str | None = Field(None, description="Lake root (default WORK_DIR/lake; local path or s3://).")
    fewshot: FewShotField = Field(FewShotSpec(policy="ood"), description=(
        "Conductor prompt and examples (as `conductor answer --fewshot`)."))
    tracking_uri: str | None = Field(None, description=(
        "MLflow tracking URI (default $MLFLOW_TRACKING_URI or WORK_DIR/mlruns; none: off)."))
    conductor_format: dict[str, Any] | None = Field(None, description=(
        "A decoding contract for the base (conductor.decoding.contract)."))
    limits: LimitsField | None = Field(None, description=(
        "Share provider limits with other processes: sqlite:PATH or prefect."))
    served_labels: str | None = Field(None, description=(
        "A labels file: served requests it answers join the training mix."))
    served_lake: str | None = Field(None, description="Where `conductor serve` writes (default: the night's lake).")

    _paths = field_validator("pool", "work_dir", "lake", "served_labels", "served_lake", mode="before")(classmethod(lambda cls, v: expand_path(v)))


class EvaluateConfig(RunConfig):
    """``conductor evaluate`` and the nightly evaluation: a candidate and the champion (conductor specs) on the
    same held-out questions, pool and seeds; repeated samples; optionally again on a held-out sub-pool."""

    candidate: ConductorSpecField = Field(description="Candidate policy spec.")
    champion: ConductorSpecField = Field(ChampionSpec(), description="Champion policy spec (default: the registry's).")
    questions: str = Field(description="Held-out questions: dataset names with limits or a file.")
    pool: str = Field(description="Worker pool manifest.")
    lake: str = Field(description="Lake root the evaluation runs go to (local path or s3://).")
    out: str = Field(description="Where evaluation.json goes.")
    samples: int = Field(4, ge=1, description="Repeated samples per question.")
    seed: int = Field(0, description="Seed of the sub-pool draws, the conductor's sampling and the bootstrap.")
    temperature: float = Field(0.7, ge=0, description="Conductor sampling temperature.")
    max_tokens: int = Field(1024, ge=16, description="Conductor completion limit.")
    k: int | None = Field(None, ge=1, description="Randomized k-of-n sub-pools per question (main pool only).")
    heldout_workers: CommaList | None = Field(None, description="Comma-separated workers forming a held-out "
                                              "sub-pool.")
    limit: int | None = Field(None, ge=1, description="Evaluate only the first N questions.")
    cache: str | None = Field(None, description="Response cache (SQLite).")
    shard_size: int = Field(4, ge=1, description="Questions per shard (the unit of resume).")
    candidate_id: str | None = Field(None, description="The candidate's checkpoint id (default: from its spec).")
    champion_id: str | None = Field(None, description="The champion's checkpoint id (default: from its spec).")
    fewshot: FewShotField = Field(FewShotSpec(policy="ood"), description="Conductor prompt and examples (as "
                                  "`conductor answer --fewshot`).")
    limits: LimitsField | None = Field(None, description="Provider limits shared with other processes (sqlite:PATH, "
                               "prefect).")
    objective: dict[str, Any] | None = Field(None, description="CostObjective fields: compare on the cost-aware "
                                             "reward instead of accuracy (conductor/grading/objective.py).")

    _paths = field_validator("pool", "lake", "out", mode="before")(classmethod(lambda cls, v: expand_path(v)))

    def rollout(self, spec: ConductorSpec, checkpoint_id: str, run_id: str, pool: str, k: int | None) -> RolloutConfig:
        """The evaluation run of one policy on one pool (``kind: eval``)."""
        return RolloutConfig(questions=self.questions, lake=self.lake, pool=pool, conductor=spec, run_id=run_id,
                             group_size=self.samples, k=k, seed=self.seed, temperature=self.temperature,
                             max_tokens=self.max_tokens, limit=self.limit, shard_size=self.shard_size,
                             cache=self.cache, kind="eval", checkpoint_id=checkpoint_id, fewshot=self.fewshot,
                             limits=self.limits)


class TrainStepConfig(RunConfig):
    """``conductor train-step``: one GRPO update of ``base`` on a rollout run in the lake, saved as ``out``; its
    GRPO settings are a preset's (or a GRPO config file's) with ``grpo`` over them."""

    run_id: str = Field(description="Rollout run id to train on (read from the lake).")
    lake: str = Field(description="Lake root (local path or s3://).")
    base: str = Field(description="Parent checkpoint (the policy to update): HF dir, .gguf file, or s3:// "
                      "checkpoint.")
    out: str = Field(description="Where the new checkpoint goes (local dir or s3://); must not exist.")
    preset: GRPOPreset | None = Field(None, description="cpu or paper (when no --config).")
    grpo: GRPOOverrides | None = Field(None, description="GRPO config overrides as JSON, e.g. "
                                       "'{\"learning_rate\": 1e-5}' (conductor.learning.grpo.config).")
    registry: str | None = Field(None, description="Also register the checkpoint in this registry (as a candidate).")
    checkpoint_id: str | None = Field(None, description="Checkpoint id (default: the --out directory name).")

    _preset = field_validator("preset", mode="before")(classmethod(lambda cls, v: one_of(v, get_args(GRPOPreset))))

    def grpo_config(self, file: str | os.PathLike[str] | None = None, source: str = "grpo") -> GRPOConfig:
        """The step's GRPOConfig: a GRPO config ``file`` (YAML/JSON), else the preset's, with ``grpo`` over it;
        GRPOConfigError (one line naming ``source`` or the file, and the field) when it does not validate."""
        from conductor.learning.grpo.config import GRPOConfig

        if file is not None:
            base = GRPOConfig.load(Path(file))
        else:
            base = {"cpu": GRPOConfig.cpu, "paper": GRPOConfig.paper}.get(self.preset or "", GRPOConfig)()
        return GRPOConfig.from_dict({**base.to_json(), **(self.grpo or {})}, source if self.grpo else str(file or "config"))


class TrainConfig(TrainStepConfig):
    """One GRPO step (flows/train.py): a rollout run in the lake updates ``base`` into the checkpoint ``out``."""

    checkpoint_id: str = Field(description="The new checkpoint's id.")
    nproc_per_node: int | None = Field(None, ge=1, description="Training processes (GPUs) for `distributed: fsdp` "
                                       "(default: one per visible GPU under fsdp, else 1).")
    reference: str | None = Field(None, description="The policy KL is measured against or penalised to "
                                  "(default: base).")
    tracking: MLflowTracking | None = Field(None, description="MLflow settings: uri, experiment, and run_id or "
                                            "run_name.")
    step: int | None = Field(None, ge=0, description="The MLflow step the metrics are logged at (default: the "
                             "checkpoint's iteration).")
