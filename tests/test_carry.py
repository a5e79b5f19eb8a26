"""bench/carry.py: a learning run's state, carried without its checkpoints, regenerates the state dir elsewhere.

Binary run state is not kept in git (issue #37); this is the command that writes it for another machine. Real
SQLite response cache, a real tar archive, the bench run as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from conductor.execution.cache import ResponseCache, copy_responses
from conductor.workers.pool import Worker
from conductor.workers.providers.base import Completion

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench/carry.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_carry_writes_the_replies_and_the_state_but_no_checkpoint(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cache = ResponseCache(state / "cache.sqlite")
    w = Worker(name="a", provider="openai", model="m")
    for k in ("k1", "k2"):
        cache.store(k, w.provider, w.model, Completion(f"paid {k}", 3, 4, "stop"))
    cache.close()
    (state / "progress.json").write_text(json.dumps({"curve": []}))
    (state / "lake" / "trajectories").mkdir(parents=True)
    (state / "lake" / "trajectories" / "part-0.parquet").write_bytes(b"PAR1")
    (state / "checkpoints" / "iter-5").mkdir(parents=True)
    (state / "checkpoints" / "iter-5" / "model.safetensors").write_bytes(b"\0" * 1024)

    r = _run(str(state), str(tmp_path / "carry"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "replies=2 state_files=2"
    with tarfile.open(tmp_path / "carry" / "state.tar.gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
        assert names == ["lake/trajectories/part-0.parquet", "progress.json"]
        tar.extractall(tmp_path / "restored", filter="data")
    assert json.loads((tmp_path / "restored" / "progress.json").read_text()) == {"curve": []}
    assert copy_responses(tmp_path / "carry" / "cache.sqlite.gz", tmp_path / "restored" / "cache.sqlite") == 2
    assert sorted(p.name for p in (tmp_path / "carry").iterdir()) == ["cache.sqlite.gz", "state.tar.gz"]


def test_a_directory_that_is_not_a_state_dir_is_one_error_line(tmp_path: Path) -> None:
    r = _run(str(tmp_path / "nothing"), str(tmp_path / "carry"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {tmp_path / 'nothing'}: no progress.json (not a learning_local "
                                             "state dir)"]
    assert not (tmp_path / "carry").exists()
