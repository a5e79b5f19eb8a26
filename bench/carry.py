"""Carry a learning run's state to another machine: its paid replies and its lake, without the checkpoints.

Run state is binary and stays out of git (docs/learning.md, "Regenerating a run's state"); rerunning the run's
command regenerates it by paying the same worker calls again. This writes the two files that save those calls
on another machine, from a ``bench/learning_local.py`` state dir:

    python bench/carry.py runs/learning-local-a96 /tmp/carry-a96

- ``cache.sqlite.gz``: a consistent snapshot of the response cache (``export_responses``; safe while the run
  writes to it), read back by ``--seed-cache`` of ``bench/learning_local.py`` and ``bench/workflow_probe.py``.
- ``state.tar.gz``: the lake, ``progress.json``, ``pool.json``, the MLflow store and the log (no checkpoint:
  one is 0.5-1.6 GB, and a resumed run replays the committed iterations from the lake). Unpack it into the
  state dir: ``tar -xzf state.tar.gz -C runs/learning-local-a96``.

Prints ``replies=<n> state_files=<m>``.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conductor.execution.cache import export_responses  # noqa: E402
from conductor.files import atomic_path  # noqa: E402

#: what of a state dir is carried (checkpoints/ and the cache itself are not)
STATE = ("lake", "progress.json", "pool.json", "mlruns", "learning_local.log")


def carry(state_dir: Path, out: Path) -> tuple[int, int]:
    """Write cache.sqlite.gz and state.tar.gz for ``state_dir`` into ``out``; (replies, files in the archive)."""
    if not (state_dir / "progress.json").is_file():
        raise ValueError(f"{state_dir}: no progress.json (not a learning_local state dir)")
    replies = export_responses(state_dir / "cache.sqlite", out / "cache.sqlite.gz")
    files = 0
    with atomic_path(out / "state.tar.gz", suffix=".part") as part, tarfile.open(part, "w:gz") as tar:
        for name in STATE:
            if (state_dir / name).exists():
                tar.add(state_dir / name, arcname=name)
        files = sum(1 for m in tar.getmembers() if m.isfile())
    return replies, files


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state_dir", type=Path, help="a bench/learning_local.py --state-dir")
    ap.add_argument("out", type=Path, help="where cache.sqlite.gz and state.tar.gz go")
    a = ap.parse_args(argv)
    try:
        replies, files = carry(a.state_dir, a.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"replies={replies} state_files={files}", flush=True)


if __name__ == "__main__":
    main()
