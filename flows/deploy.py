"""Run the scheduled deployments from one long-lived process: ``python -m flows.deploy``.

WHY: the simplest production shape with no work pool and no container: this
process registers the deployments (nightly retraining, scheduled answering) with
the Prefect server named by ``PREFECT_API_URL``, and runs each scheduled flow run
as a subprocess when it is due. Schedules and parameters come from
``flows/deployments.py`` (``CONDUCTOR_*`` variables), overridable here:

    export PREFECT_API_URL=$(bash infra/prefect-server.sh start)
    python -m flows.deploy                                   # both deployments, shipped schedules
    python -m flows.deploy --only scheduled-answering --cron scheduled-answering="*/30 * * * *" \\
        --param scheduled-answering.questions=my_questions.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from conductor.run.deploy_config import DeployStartConfig

REPO = Path(__file__).resolve().parent.parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these deployments")
    p.add_argument("--cron", action="append", default=[], metavar="NAME=EXPR", help="replace a deployment's schedule")
    p.add_argument("--interval", action="append", default=[], metavar="NAME=SECONDS",
                   help="run a deployment every SECONDS instead of on its cron schedule")
    p.add_argument("--param", action="append", default=[], metavar="NAME.key=VALUE",
                   help="set a flow parameter (VALUE parsed as YAML: 2, true, [a, b])")
    p.add_argument("--limit", type=int, default=DeployStartConfig.model_fields["limit"].default,
                   help="flow runs executed at once by this process (default %(default)s)")
    p.add_argument("--workdir", default=str(REPO),
                   help="working directory of the flow runs; relative paths in parameters resolve here (default: the repo)")
    p.add_argument("--skip-missing", action="store_true",
                   help="run the other deployments when a flow module does not exist (instead of failing)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from flows.deployments import DeploymentConfigError, apply_overrides, deployment_specs, to_runner_deployment

    args = build_parser().parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        print("error: PREFECT_API_URL is not set; start a server with `bash infra/prefect-server.sh start` "
              "and export the URL it prints", file=sys.stderr)
        return 2
    try:
        specs = apply_overrides(deployment_specs(), only=args.only, cron=args.cron, interval=args.interval,
                                params=args.param)
        deployments = []
        for spec in specs:
            try:
                deployments.append(to_runner_deployment(spec))
            except DeploymentConfigError as e:
                if not (args.skip_missing and "does not exist" in str(e)):
                    raise
                print(f"warning: {e}; not running it", file=sys.stderr)
    except DeploymentConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not deployments:
        print("error: nothing to run", file=sys.stderr)
        return 2
    os.chdir(args.workdir)
    from prefect import serve  # Prefect's name for "register, then run each due flow run" in this process

    serve(*deployments, limit=args.limit)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
