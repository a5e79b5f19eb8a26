"""infra/install.sh profiles: the quickstart's 'answer' profile never pulls the training or test stack,
the 'all' profile (tests, CI) is a superset of it, and bad arguments fail before anything is installed."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _extras_closure(name: str, extras: dict[str, list[str]]) -> set[str]:
    """Requirement names an extra pulls in, following self-references like ``conductor-orchestra[a,b]``."""
    names: set[str] = set()
    for req in extras[name]:
        self_ref = re.fullmatch(r"conductor-orchestra\[([^\]]+)\]", req.strip())
        if self_ref:
            for sub in self_ref.group(1).split(","):
                names |= _extras_closure(sub.strip(), extras)
        else:
            names.add(re.split(r"[\[<>=!~; ]", req.strip(), maxsplit=1)[0].lower())
    return names


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_answer_profile_has_no_training_or_test_stack():
    answer = _extras_closure("answer", _extras())
    assert {"openai", "math-verify", "duckdb", "prefect", "llama-cpp-python"} <= answer
    assert not answer & {"torch", "transformers", "trl", "peft", "accelerate", "pytest", "hypothesis", "moto"}


def test_all_profile_is_answer_plus_train_mlflow_dev_and_hub():
    extras = _extras()
    everything = _extras_closure("all", extras)
    assert everything == (_extras_closure("answer", extras) | _extras_closure("train", extras)
                          | _extras_closure("mlflow", extras) | _extras_closure("dev", extras)
                          | _extras_closure("hub", extras))
    assert {"torch", "transformers", "pytest", "mlflow-skinny", "datasets", "pytest-xdist"} <= everything
    assert "datasets" not in _extras_closure("answer", extras)   # the quickstart's questions ship with the package


def _install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "infra" / "install.sh"), *args], capture_output=True, text=True,
                          timeout=60)


def test_unknown_profile_is_a_usage_error():
    proc = _install("--profile", "everything")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: install.sh: unknown profile 'everything' (use answer or all)"


def test_unknown_argument_is_a_usage_error():
    proc = _install("--fast")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: install.sh: unknown argument --fast")
    assert len(proc.stderr.strip().splitlines()) == 1
