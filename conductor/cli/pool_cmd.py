"""`conductor pool validate|sample|show`: check manifests and draw randomized sub-pools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from conductor.cli import app, fail
from conductor.cli.run_options import build_config, config_options
from conductor.run.command_config import PoolSampleConfig

if TYPE_CHECKING:
    from conductor.workers.pool import Pool

pool_app = typer.Typer(help="Pool manifests: validate, show, sample k-of-n sub-pools.", no_args_is_help=True)
app.add_typer(pool_app, name="pool")


def _load(file: Path) -> Pool:
    from conductor.run.preflight import UsageError, check_pool

    try:
        return check_pool(file)   # the manifest, and each provider's own options (simulated skills, ...)
    except UsageError as e:
        fail(str(e))


@pool_app.command("validate")
def validate(files: list[Path] = typer.Argument(..., help="One or more pool manifests (YAML).")) -> None:
    """Validate manifests; print 'ok <pool id> <n> workers <fingerprint>' per file, exit 2 on the first error."""
    for f in files:
        p = _load(f)
        typer.echo(f"ok {f} {p.id} {len(p.workers)} workers fingerprint={p.fingerprint}")


@pool_app.command("show")
def show(file: Path = typer.Argument(..., help="Pool manifest (YAML).")) -> None:
    """Print the validated manifest as JSON (defaults filled in; key variables by name only)."""
    from conductor.workers.secrets import mask_url

    data = _load(file).model_dump(mode="json")
    for w in data["workers"]:   # a key in the URL (user:KEY@host, ?api-key=${KEY}) is never printed
        if w.get("base_url"):
            w["base_url"] = mask_url(w["base_url"])
    typer.echo(json.dumps(data, indent=2))


@pool_app.command("sample")
@config_options(PoolSampleConfig)
def sample(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="Pool manifest (YAML)."),
    **options: Any,
) -> None:
    """Draw a random k-of-n sub-pool; print the ordinal -> worker mapping as JSON."""
    from conductor.workers.pool import PoolError

    c = build_config(PoolSampleConfig, ctx, None, options)
    k, seed, shuffle = c.k, c.seed, c.shuffle
    p = _load(file)
    try:
        sub = p.sample(k, seed, shuffle=shuffle)
    except PoolError as e:
        fail(str(e))
    typer.echo(json.dumps({"pool": p.id, "k": k, "seed": seed,
                           "models": [{"ordinal": i, "worker": w.name, "provider": w.provider, "model": w.model}
                                      for i, w in enumerate(sub.workers)]}))
