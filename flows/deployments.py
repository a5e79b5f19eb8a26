"""The scheduled deployments, defined once: nightly retraining and scheduled bulk answering.

WHY one place: ``python -m flows.deploy`` (a long-lived process running the
deployments itself), ``conductor deploy ...`` and ``infra/prefect.yaml`` (for
``prefect deploy`` onto work pools) must agree on names, entrypoints, schedules and
parameters. They all come from ``deployment_specs()``; ``infra/prefect.yaml`` is
rendered from it (``conductor deploy yaml``) and a test keeps the shipped file in sync.

Defaults come from the environment (``CONDUCTOR_*`` variables below) so an operator
changes a schedule or a pool without editing code; CLI overrides win over both.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import JsonValue

from conductor.run.config import RunConfig

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.deployments.runner import RunnerDeployment

NIGHTLY = "nightly-retraining"
ANSWER = "scheduled-answering"

# name -> (environment variable, default); documented in docs/deployments.md. Defaults that are paths under
# CONDUCTOR_HOME are filled in by settings(), so that the registry the nightly flow promotes into is the one
# `conductor answer --conductor auto` reads (conductor.run.runtime.registry_uri).
SETTINGS: dict[str, tuple[str, str]] = {
    "timezone": ("CONDUCTOR_TIMEZONE", "UTC"),
    "nightly_cron": ("CONDUCTOR_NIGHTLY_CRON", "0 2 * * *"),
    "answer_cron": ("CONDUCTOR_ANSWER_CRON", "0 6 * * *"),
    "pool": ("CONDUCTOR_POOL", "data/pools/local.yaml"),
    "conductor": ("CONDUCTOR_CONDUCTOR", "auto"),
    "answer_questions": ("CONDUCTOR_ANSWER_QUESTIONS", "gsm8k_test:10,mmlu_stem:10"),
    "answer_out": ("CONDUCTOR_ANSWER_OUT", "runs/scheduled-answering"),
    "registry": ("CONDUCTOR_REGISTRY", "{home}/registry"),
    "nightly_base": ("CONDUCTOR_NIGHTLY_BASE", "{home}/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    "nightly_train": ("CONDUCTOR_NIGHTLY_TRAIN", "gsm8k_train,math500"),
    "nightly_eval": ("CONDUCTOR_NIGHTLY_EVAL", "gsm8k_test:100,mmlu_stem:100"),
    "nightly_work_dir": ("CONDUCTOR_NIGHTLY_WORK_DIR", "runs/nightly"),
    "nightly_params": ("CONDUCTOR_NIGHTLY_PARAMS", "{}"),      # a JSON/YAML mapping of further nightly_flow parameters
    "work_pool": ("CONDUCTOR_WORK_POOL", "conductor-cpu"),     # answering: process or Docker work pool
    "gpu_work_pool": ("CONDUCTOR_GPU_WORK_POOL", "conductor-gpu"),  # rollouts + GRPO: a pool with GPU nodes
}

# The environment inside our images (infra/Dockerfile.*): infra/prefect.yaml is rendered with it, because the
# work pools it targets run those images.
IMAGE_ENV = {"CONDUCTOR_HOME": "/var/lib/conductor", "CONDUCTOR_ANSWER_OUT": "/var/lib/conductor/runs/scheduled-answering",
             "CONDUCTOR_NIGHTLY_WORK_DIR": "/var/lib/conductor/runs/nightly"}


class DeploymentConfigError(ValueError):
    """A bad schedule, parameter or override; the message is one line naming the deployment and field."""


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    entrypoint: str                         # "flows/<file>.py:<flow function>" (prefect.yaml form)
    description: str
    parameters: dict[str, JsonValue] = field(default_factory=dict)
    cron: str | None = None
    interval_s: float | None = None         # instead of cron (tests, or "every N seconds" jobs)
    timezone: str = "UTC"
    tags: tuple[str, ...] = ()
    work_pool: str = "conductor-cpu"
    job_variables: dict[str, JsonValue] = field(default_factory=dict)

    @property
    def module(self) -> str:
        """``flows/nightly.py:nightly_flow`` -> ``flows.nightly``.

        >>> DeploymentSpec("x", "flows/nightly.py:nightly_flow", "").module
        'flows.nightly'
        """
        path = self.entrypoint.partition(":")[0]
        return path.removesuffix(".py").replace("/", ".")

    @property
    def function(self) -> str:
        return self.entrypoint.partition(":")[2]


def settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The effective settings: each ``CONDUCTOR_*`` variable when set and non-empty, else its default.

    >>> settings({"CONDUCTOR_NIGHTLY_CRON": "30 1 * * *"})["nightly_cron"]
    '30 1 * * *'
    >>> settings({"CONDUCTOR_HOME": "/data/c"})["registry"]
    '/data/c/registry'
    """
    env = os.environ if env is None else env
    home = env.get("CONDUCTOR_HOME") or str(Path.home() / ".cache" / "conductor")
    return {key: (env.get(var) or default.replace("{home}", home)) for key, (var, default) in SETTINGS.items()}


def _mapping(text: str, what: str) -> dict[str, JsonValue]:
    try:
        value = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise DeploymentConfigError(f"{what}: not valid YAML/JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(value, dict):
        raise DeploymentConfigError(f"{what}: expected a mapping of parameter names to values, got {type(value).__name__}")
    return value


def deployment_specs(env: Mapping[str, str] | None = None) -> list[DeploymentSpec]:
    """The shipped deployments with their schedules and parameters.

    >>> [(s.name, s.cron, s.work_pool) for s in deployment_specs({})]
    [('nightly-retraining', '0 2 * * *', 'conductor-gpu'), ('scheduled-answering', '0 6 * * *', 'conductor-cpu')]
    """
    s = settings(env)
    nightly_params = {"pool": s["pool"], "train_questions": s["nightly_train"], "eval_questions": s["nightly_eval"],
                      "work_dir": s["nightly_work_dir"], "base": s["nightly_base"], "registry": s["registry"],
                      **_mapping(s["nightly_params"], SETTINGS["nightly_params"][0])}
    return [
        DeploymentSpec(
            name=NIGHTLY, entrypoint="flows/nightly.py:nightly_flow",
            description="Retrain the conductor when the worker pool changed: K x (rollouts -> GRPO), then "
                        "evaluation against the champion and promotion; stops cleanly at its budget.",
            parameters=nightly_params, cron=s["nightly_cron"], timezone=s["timezone"],
            tags=("conductor", "nightly", "gpu"), work_pool=s["gpu_work_pool"]),
        DeploymentSpec(
            name=ANSWER, entrypoint="flows/scheduled_answer.py:scheduled_answer_flow",
            description="Bulk answering of a question set with the champion conductor, one dated output "
                        "directory per scheduled run.",
            parameters={"questions": s["answer_questions"], "out_root": s["answer_out"], "pool": s["pool"],
                        "conductor": s["conductor"]},
            cron=s["answer_cron"], timezone=s["timezone"], tags=("conductor", "answer"), work_pool=s["work_pool"]),
    ]


def apply_overrides(specs: Sequence[DeploymentSpec], *, only: Sequence[str] = (), cron: Sequence[str] = (),
                    interval: Sequence[str] = (), params: Sequence[str] = ()) -> list[DeploymentSpec]:
    """CLI overrides: ``cron``/``interval`` as ``NAME=VALUE``, ``params`` as ``NAME.key=YAML value``.

    >>> s = apply_overrides(deployment_specs({}), only=["scheduled-answering"],
    ...                     interval=["scheduled-answering=15"], params=["scheduled-answering.limit=2"])
    >>> [(x.name, x.cron, x.interval_s, x.parameters["limit"]) for x in s]
    [('scheduled-answering', None, 15.0, 2)]
    >>> apply_overrides(deployment_specs({}), params=["nope.limit=2"])
    Traceback (most recent call last):
    ...
    flows.deployments.DeploymentConfigError: --param nope.limit=2: unknown deployment 'nope' (known: nightly-retraining, scheduled-answering)
    """
    by_name = {s.name: s for s in specs}
    known = ", ".join(by_name)

    def target(flag: str, item: str, sep: str) -> tuple[str, str]:
        name, ok, rest = item.partition(sep)
        if not ok or not rest:
            want = "NAME.key=VALUE" if sep == "." else "NAME=VALUE"
            raise DeploymentConfigError(f"{flag} {item}: expected {want}")
        if name not in by_name:
            raise DeploymentConfigError(f"{flag} {item}: unknown deployment {name!r} (known: {known})")
        return name, rest

    for item in cron:
        name, value = target("--cron", item, "=")
        by_name[name] = replace(by_name[name], cron=value, interval_s=None)
    for item in interval:
        name, value = target("--interval", item, "=")
        try:
            seconds = float(value)
        except ValueError:
            raise DeploymentConfigError(f"--interval {item}: seconds must be a number") from None
        if seconds <= 0:
            raise DeploymentConfigError(f"--interval {item}: seconds must be > 0")
        by_name[name] = replace(by_name[name], interval_s=seconds, cron=None)
    for item in params:
        name, rest = target("--param", item, ".")
        key, ok, raw = rest.partition("=")
        if not ok or not key:
            raise DeploymentConfigError(f"--param {item}: expected NAME.key=VALUE")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        by_name[name] = replace(by_name[name], parameters={**by_name[name].parameters, key: value})
    for name in only:
        if name not in by_name:
            raise DeploymentConfigError(f"--only {name}: unknown deployment (known: {known})")
    return [by_name[s.name] for s in specs if not only or s.name in only]


def load_flow(spec: DeploymentSpec) -> Flow[..., object]:
    """Import the flow object behind a spec; a one-line error when its module is missing."""
    try:
        module = importlib.import_module(spec.module)
    except ModuleNotFoundError as e:
        if e.name == spec.module:
            raise DeploymentConfigError(f"deployment {spec.name}: {spec.entrypoint} does not exist yet") from None
        raise
    obj = getattr(module, spec.function, None)
    if obj is None:
        raise DeploymentConfigError(f"deployment {spec.name}: {spec.module} has no flow {spec.function!r}")
    return obj


def config_model(flow_obj: Flow[..., object]) -> type[RunConfig] | None:
    """The run configuration class a flow takes as its one ``config`` parameter (conductor/run/config.py), or
    None for a flow with plain parameters. A deployment's parameters stay flat either way: they are the
    configuration's fields, validated here and passed as ``config``."""
    import typing

    sig = inspect.signature(flow_obj.fn)
    if list(sig.parameters) != ["config"]:
        return None
    hint = typing.get_type_hints(flow_obj.fn).get("config")
    return hint if isinstance(hint, type) and issubclass(hint, RunConfig) else None


def flow_parameters(spec: DeploymentSpec) -> dict[str, JsonValue]:
    """The parameters as the flow takes them: nested under ``config`` for a flow that takes a run configuration."""
    return {"config": dict(spec.parameters)} if config_model(load_flow(spec)) is not None else dict(spec.parameters)


def check_parameters(spec: DeploymentSpec, flow_obj: Flow[..., object]) -> None:
    """Fail early, naming the parameter, instead of at the first scheduled run in the night."""
    model = config_model(flow_obj)
    if model is not None:
        from conductor.run.config import ConfigError

        flags = {name: f"parameter {name!r}" for name in spec.parameters}
        try:
            model.build(given=spec.parameters, flags=flags)
        except ConfigError as e:
            raise DeploymentConfigError(f"deployment {spec.name}: {e} (set it with --param "
                                        f"{spec.name}.NAME=VALUE)") from None
        return
    sig = inspect.signature(flow_obj.fn)
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [k for k in spec.parameters if k not in sig.parameters and not accepts_any]
    if unknown:
        raise DeploymentConfigError(f"deployment {spec.name}: {spec.entrypoint} has no parameter {unknown[0]!r} "
                                    f"(it takes: {', '.join(sig.parameters)})")
    missing = [n for n, p in sig.parameters.items()
               if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and n not in spec.parameters]
    if missing:
        raise DeploymentConfigError(f"deployment {spec.name}: parameter {missing[0]!r} is required; "
                                    f"set it with --param {spec.name}.{missing[0]}=VALUE")


def to_runner_deployment(spec: DeploymentSpec) -> RunnerDeployment:
    """A RunnerDeployment that ``prefect.serve`` can run (module entrypoint: independent of the working directory)."""
    from prefect.deployments.runner import EntrypointType, RunnerDeployment

    flow_obj = load_flow(spec)
    check_parameters(spec, flow_obj)
    schedules = None
    if spec.interval_s is None and spec.cron:
        from prefect.schedules import Cron

        schedules = [Cron(spec.cron, timezone=spec.timezone)]
    try:
        deployment = flow_obj.to_deployment(name=spec.name, description=spec.description,
                                            parameters=flow_parameters(spec), tags=list(spec.tags),
                                            entrypoint_type=EntrypointType.MODULE_PATH, interval=spec.interval_s,
                                            schedules=schedules)
    except ValueError as e:
        raise DeploymentConfigError(f"deployment {spec.name}: {str(e).splitlines()[0]}") from None
    if not isinstance(deployment, RunnerDeployment):   # to_deployment is awaitable only when called from async code
        raise TypeError("to_runner_deployment: call it from synchronous code")
    return deployment


def runner_deployments(specs: Sequence[DeploymentSpec]) -> list[RunnerDeployment]:
    return [to_runner_deployment(s) for s in specs]


PREFECT_YAML_HEADER = """\
# GENERATED by `conductor deploy yaml --image-env > infra/prefect.yaml` from flows/deployments.py (the one place
# where deployments are defined), with the paths of our images (infra/Dockerfile.*, CONDUCTOR_HOME=/var/lib/conductor);
# tests/test_deployments.py checks this file is in sync. Edit the Python (or the CONDUCTOR_* variables), not this.
#
# Deploy onto work pools (see docs/deployments.md and infra/workpools.md):
#   export PREFECT_API_URL=http://127.0.0.1:4200/api          # or the compose server
#   export CONDUCTOR_REPO=/path/to/conductor                    # where workers find the code (/app in our images)
#   prefect work-pool create conductor-cpu --type process       # answering (CPU)
#   prefect work-pool create conductor-gpu --type process       # rollouts + GRPO: a host with a GPU
#                                                               # (or --type docker / kubernetes, infra/workpools.md)
#   prefect deploy --all --prefect-file infra/prefect.yaml
#   prefect worker start --pool conductor-cpu                   # on each CPU host
#   prefect worker start --pool conductor-gpu                   # on each GPU host
# Without work pools, `python -m flows.deploy` runs the same deployments from one process.
"""


def prefect_yaml(specs: Sequence[DeploymentSpec]) -> str:
    """The ``prefect.yaml`` for ``prefect deploy`` with the same deployments as ``python -m flows.deploy``."""
    deployments = []
    for s in specs:
        sched: dict[str, JsonValue] = ({"interval": s.interval_s} if s.interval_s is not None
                                 else {"cron": s.cron, "timezone": s.timezone})
        deployments.append({
            "name": s.name, "entrypoint": s.entrypoint, "description": s.description, "tags": list(s.tags),
            "parameters": flow_parameters(s), "schedules": [sched] if (s.cron or s.interval_s) else [],
            "work_pool": {"name": s.work_pool, "work_queue_name": "default", "job_variables": dict(s.job_variables)},
        })
    doc = {
        "name": "conductor",
        "prefect-version": "3.8.8",
        "build": None,
        "push": None,
        "pull": [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $CONDUCTOR_REPO }}"}}],
        "deployments": deployments,
    }
    return PREFECT_YAML_HEADER + yaml.safe_dump(doc, sort_keys=False, width=110)


def describe(specs: Sequence[DeploymentSpec]) -> list[dict[str, JsonValue]]:
    """One JSON-able row per deployment (``conductor deploy list``)."""
    return [{"name": s.name, "entrypoint": s.entrypoint,
             "schedule": (f"every {s.interval_s:g}s" if s.interval_s is not None else f"cron {s.cron} ({s.timezone})"),
             "work_pool": s.work_pool, "parameters": json.loads(json.dumps(s.parameters, default=str))}
            for s in specs]
