"""Where a named benchmark's rows come from, so ``gsm8k_test:10`` works in any checkout, any clone and the wheel.

A named dataset (``gsm8k_test``, ``mmlu_stem``, ...) is one file of the shared benchmark folder
(``/work/shared/data/README.md`` in this workplace). Its rows are read from the first of:

1. an explicit ``path``, else ``$CONDUCTOR_SHARED_DATA/<file>``;
2. the shared folder beside a checkout, ``<checkout>/../shared/data/<file>``;
3. the rows shipped in the package (``conductor/data/bundled/``: the first 100 rows of ``gsm8k_test`` and
   ``mmlu_stem``, with their MIT licences) when the request fits in them (a ``limit`` no larger);
4. the Hugging Face hub through ``datasets`` (the field's loader: ``openai/gsm8k`` config ``main``, ``cais/mmlu``
   one config per STEM subject, ``HuggingFaceH4/MATH-500``), which keeps its own cache and reads only that cache
   when ``HF_DATASETS_OFFLINE=1``;

and when none is reachable, one ``DatasetError`` line names all of them and why each failed. The hub's rows are
mapped to the shared file's fields (``cais/mmlu``'s ``subject`` is the file's ``type``) and keep its order, so a
question's id (``gsm8k/test/17``) is the same whichever source served it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from conductor.resources import project_root

Rows = Iterator[tuple[int, dict[str, Any]]]

BUNDLED_ROWS = 100   # rows of each bundled file (conductor/data/bundled/README.md)
# The STEM subjects of MMLU in the order the shared mmlu_stem.jsonl holds them (3,018 test questions).
MMLU_STEM_SUBJECTS = (
    "college_biology", "astronomy", "electrical_engineering", "high_school_biology", "machine_learning",
    "abstract_algebra", "high_school_mathematics", "high_school_computer_science", "college_chemistry",
    "high_school_chemistry", "computer_security", "conceptual_physics", "high_school_physics", "college_physics",
    "high_school_statistics", "elementary_mathematics", "college_mathematics", "college_computer_science",
)


@dataclass(frozen=True)
class HubSplit:
    """A shared file's rows on the Hugging Face hub: ``configs`` are read in order and concatenated."""

    repo: str
    configs: tuple[str | None, ...]
    split: str
    rename: dict[str, str] = field(default_factory=dict)   # hub column -> the shared file's column

    def label(self) -> str:
        """How the error line and the rows' ``where`` name it.

        >>> HubSplit("openai/gsm8k", ("main",), "test").label()
        'openai/gsm8k (main, test)'
        """
        configs = ", ".join(c for c in self.configs[:2] if c) + (", ..." if len(self.configs) > 2 else "")
        return f"{self.repo} ({configs + ', ' if configs else ''}{self.split})"


HUB: dict[str, HubSplit] = {
    "gsm8k_test.jsonl": HubSplit("openai/gsm8k", ("main",), "test"),
    "gsm8k_train.jsonl": HubSplit("openai/gsm8k", ("main",), "train"),
    "mmlu_stem.jsonl": HubSplit("cais/mmlu", MMLU_STEM_SUBJECTS, "test", {"subject": "type"}),
    "math500.jsonl": HubSplit("HuggingFaceH4/MATH-500", (None,), "test"),
}


def shared_dirs() -> list[tuple[str, Path | None]]:
    """(how an error names it, directory or None when unset) for sources 1 and 2."""
    env = os.environ.get("CONDUCTOR_SHARED_DATA")
    return [("$CONDUCTOR_SHARED_DATA", Path(env) if env else None),
            ("the checkout's shared folder", project_root().parent / "shared" / "data")]


def bundled_file(file_name: str) -> Path | None:
    """The package's copy of a shared file's first rows, or None."""
    path = Path(str(files("conductor.data").joinpath("bundled", file_name)))
    return path if path.is_file() else None


@dataclass(frozen=True)
class HubRows:
    """Rows loaded from the hub: ``where`` names them in errors (``hf:openai/gsm8k``)."""

    where: str
    rows: Rows


class Unreachable(Exception):
    """No source holds the file (the message, one line, names every source tried and why it failed)."""


def locate(file_name: str, limit: int | None = None) -> Path | HubRows:
    """The first source of a shared benchmark file (a JSONL file to read, or the hub's rows).

    ``limit`` is how many rows the caller will take at most: the bundled rows serve a request that fits in them."""
    tried: list[str] = []
    for name, directory in shared_dirs():
        if directory is None:
            tried.append(f"{name} (unset)")
        elif (directory / file_name).is_file():
            return directory / file_name
        else:
            tried.append(f"{name} {directory / file_name} (no such file)")
    bundled = bundled_file(file_name)
    if bundled is not None and limit is not None and limit <= BUNDLED_ROWS:
        return bundled
    hub = HUB.get(file_name)
    if hub is None:
        tried.append("the Hugging Face hub (no known copy of this file)")
    else:
        try:
            return HubRows(f"hf:{hub.repo}", _hub_rows(hub, limit))
        except _HubUnavailable as e:
            tried.append(f"Hugging Face {hub.label()}: {e}")
    shipped = (f"; the package ships its first {BUNDLED_ROWS} rows (ask for :{BUNDLED_ROWS} or fewer)"
               if bundled is not None else "")
    raise Unreachable(f"{file_name}: not found in {'; '.join(tried)}{shipped}")


class _HubUnavailable(Exception):
    pass


def _hub_rows(hub: HubSplit, limit: int | None) -> Rows:
    """Load the split (every config up to ``limit`` rows) now, so an unreachable hub fails here; yield later."""
    try:
        import datasets
    except ImportError:
        raise _HubUnavailable("the datasets package is not installed (pip install 'conductor-orchestra[hub]')") from None
    tables: list[Any] = []
    n = 0
    for config in hub.configs:
        if limit is not None and n >= limit:
            break
        try:
            table = datasets.load_dataset(hub.repo, config, split=hub.split)
        except Exception as e:  # noqa: BLE001 - offline with no cache, no such repo, a broken cache: all say "not here"
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            offline = " (HF_DATASETS_OFFLINE is set: the cache only)" if os.environ.get("HF_DATASETS_OFFLINE") else ""
            raise _HubUnavailable(f"{type(e).__name__}: {first[:200]}{offline}") from None
        tables.append(table)
        n += len(table)
    return _hub_iter(tables, hub, limit)


def _hub_iter(tables: list[Any], hub: HubSplit, limit: int | None) -> Rows:
    i = 0
    for table in tables:
        for row in table:
            if limit is not None and i >= limit:
                return
            i += 1
            yield i, {hub.rename.get(k, k): v for k, v in row.items()}
