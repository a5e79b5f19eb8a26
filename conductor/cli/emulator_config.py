"""What ``conductor emulator`` is set with: a configuration model (``RunConfig``) whose fields the command's
options are generated from (conductor/cli/run_options.py).

The command hands them on to the emulator's own command line (``python -m conductor.testing.emulator``), which
checks them (one ``error:`` line each) and turns them into its ``EmulatorConfig``; that module is a test double
imported only when the command runs (tests/test_testing_package.py), so this model cannot read its defaults from
there. Not settings, so declared by hand: ``--port`` and ``--config`` (a JSON file of ``EmulatorConfig`` fields,
not a YAML run configuration).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from conductor.run.config import RunConfig


class EmulatorOptions(RunConfig):
    """``conductor emulator``."""

    # nan and inf reach the emulator, which names them: `--latency nan: must be a finite number >= 0`
    model_config = ConfigDict(allow_inf_nan=True)

    latency: float = Field(0.0, description="Seconds added to every reply.")
    jitter: float = Field(0.0, description="Uniform extra latency in [0, jitter].")
    rpm: float | None = Field(None, description="Enforce this requests/min per model (429 beyond it).")
