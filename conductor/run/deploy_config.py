"""What ``conductor deploy list|start|run|yaml`` are set with: run configurations (conductor/run/config.py).

The commands' options are generated from these fields (conductor/cli/run_options.py), and ``--config FILE``
reads the same fields from YAML. The overrides stay in the text the command line takes (``NAME=EXPR``,
``NAME.key=VALUE``): ``flows/deployments.apply_overrides`` reads them, one line per mistake, whichever way they
came. Light on purpose (pydantic only): the command line imports it to build its options.
"""

from __future__ import annotations

from pydantic import Field

from conductor.run.config import RunConfig


class DeployOverrides(RunConfig):
    """Changes to the shipped deployments (flows/deployments.py) for ``deploy list``, ``start`` and ``yaml``."""

    only: list[str] = Field(default_factory=list, description="Only these deployments (repeatable).")
    cron: list[str] = Field(default_factory=list, description="NAME=EXPR: replace a deployment's cron schedule.")
    interval: list[str] = Field(default_factory=list, description="NAME=SECONDS: run every SECONDS instead.")
    param: list[str] = Field(default_factory=list, description="NAME.key=VALUE: set a flow parameter (VALUE parsed "
                             "as YAML).")


OVERRIDES = tuple(DeployOverrides.model_fields)   # the repeatable options of list, start and yaml


class DeployListConfig(DeployOverrides):
    """``conductor deploy list``."""

    server: bool = Field(False, description="Also show what the Prefect server at PREFECT_API_URL has registered, "
                         "with each deployment's last flow run.")


class DeployStartConfig(DeployOverrides):
    """``conductor deploy start`` (and ``python -m flows.deploy``)."""

    limit: int = Field(1, ge=1, description="Flow runs executed at once.")
    skip_missing: bool = Field(False, description="Run the others when a flow module is missing.")


class DeployYamlConfig(DeployOverrides):
    """``conductor deploy yaml``."""

    image_env: bool = Field(False, description="Use the paths inside our images instead of this shell's "
                            "CONDUCTOR_* variables (how infra/prefect.yaml is made).")


class DeployRunConfig(RunConfig):
    """``conductor deploy run NAME``: one flow run of a registered deployment, now."""

    param: list[str] = Field(default_factory=list, description="key=VALUE overrides for this run only (YAML "
                             "values).")
    wait: bool = Field(True, description="Wait for the run to finish (a served or worker process must pick it up).")
    timeout: float = Field(3600, ge=1, description="Seconds to wait.")
