"""Several processes opening one new SQLite file at the same moment all get a WAL connection.

The race this guards against failed CI once: ``PRAGMA journal_mode=WAL`` returns "database is locked"
at once (no busy handler) while another process is creating the same file.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent('''
    import json, sys, time
    from conductor.execution.sqlite_wal import connect_wal

    cfg = json.loads(sys.argv[1])
    errors, modes = [], set()
    for r in range(cfg["rounds"]):
        time.sleep(max(0.0, cfg["start"] + r * cfg["gap"] - time.time()))   # every child opens round r together
        try:
            conn = connect_wal(f'{cfg["dir"]}/db{r}.sqlite', busy_timeout_s=10.0)
            conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            conn.execute("INSERT INTO t VALUES (?)", (cfg["i"],))
            modes.add(conn.execute("PRAGMA journal_mode").fetchone()[0])
            conn.close()
        except Exception as e:
            errors.append(f"round {r}: {e}")
    print(json.dumps({"errors": errors, "modes": sorted(modes)}))
''')


def test_processes_creating_one_file_together_all_get_wal(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD, encoding="utf-8")
    n, rounds = 6, 25
    start = time.time() + 3.0                     # after every interpreter has started
    procs = [subprocess.Popen([sys.executable, str(script),
                               json.dumps({"dir": str(tmp_path), "rounds": rounds, "gap": 0.15,
                                           "start": start, "i": i})],
                              cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert [e for o in outs for e in o["errors"]] == []
    assert all(o["modes"] == ["wal"] for o in outs)
    for r in range(rounds):
        with sqlite3.connect(tmp_path / f"db{r}.sqlite") as c:
            assert sorted(x for (x,) in c.execute("SELECT x FROM t")) == list(range(n))
