"""Where the project's own files are: the pool manifests and few-shot examples (``data/``) and the Prefect
project (``flows/``, ``tasks/``), in a checkout or inside an installed wheel.

WHY: the code used to find ``data/`` beside the ``conductor`` package or in the working directory, so an
installed wheel could not find its own defaults. A checkout keeps the top-level layout (``data/``, ``flows/``,
``tasks/`` beside ``conductor/``); the wheel carries the same three directories inside the package, under
``conductor/_project/`` (the package mapping in setup.py), found with
``importlib.resources``. Either way ``project_root()`` is the directory that holds them.
"""

from __future__ import annotations

import os
import sys
from importlib.resources import files
from pathlib import Path

_INSTALLED = "_project"


def project_root() -> Path:
    """The directory holding ``data/``, ``flows/`` and ``tasks/``: the copy inside the installed package, or the
    checkout ``conductor`` was imported from."""
    installed = files("conductor").joinpath(_INSTALLED)
    if installed.is_dir():
        return Path(str(installed))
    return Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """``$CONDUCTOR_SHARED_DATA`` or ``<repo>/../shared/data`` (the shared benchmark files, read where they lie)."""
    env = os.environ.get("CONDUCTOR_SHARED_DATA")
    return Path(env) if env else project_root().parent / "shared" / "data"


def cache_dir() -> Path:
    """``$CONDUCTOR_HOME/cache`` or ``~/.cache/conductor``."""
    home = os.environ.get("CONDUCTOR_HOME")
    return Path(home) / "cache" if home else Path.home() / ".cache" / "conductor"


def data_path(*parts: str) -> Path:
    """A file under the project's ``data/``, e.g. ``data_path("pools", "local.yaml")``.

    >>> data_path("pools", "simulated.yaml").is_file()
    True
    """
    return project_root().joinpath("data", *parts)


def use_project() -> Path:
    """Make the Prefect project (``flows``, ``tasks``) importable: its root goes first on ``sys.path``, as Prefect
    itself does with a deployment's working directory. Nothing named ``flows`` or ``tasks`` is installed into
    site-packages; the CLI calls this before it imports a flow. Returns the root."""
    root = project_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root
