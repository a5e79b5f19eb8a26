"""The wheel's package list, the one thing pyproject.toml cannot say: ``conductor``'s own packages as found on
disk, plus the project files the code reads, carried inside the package in the repository's layout under
``conductor/_project/`` (``data/``, and the Prefect project ``flows/`` and ``tasks/``; see conductor/resources.py
and docs/architecture.md, "Packaging"). A directory that is absent (a Docker dependency layer that copies only
``pyproject.toml`` and ``__init__`` files) is left out rather than failing the install."""

from pathlib import Path

from setuptools import find_packages, setup

PROJECT = {"conductor._project.data": "data", "conductor._project.flows": "flows", "conductor._project.tasks": "tasks"}
here = Path(__file__).resolve().parent
project = {pkg: src for pkg, src in PROJECT.items() if (here / src).is_dir()}
setup(packages=find_packages(include=["conductor", "conductor.*"]) + list(project), package_dir=project)
