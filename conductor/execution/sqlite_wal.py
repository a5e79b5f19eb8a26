"""Open a SQLite file in WAL mode when several processes may create it at the same moment.

WHY: switching a database to WAL takes an exclusive lock, and SQLite does not call the busy
handler for that switch while another connection is creating or recovering the same file:
``PRAGMA journal_mode=WAL`` then fails at once with "database is locked", whatever the busy
timeout. Six processes opening one new file together hit it in about one start in five
(the shared rate-limit store, the response cache and the batch store are all opened that
way by fanned-out workers). WAL is a property of the file, so once any opener has set it
the others only have to see it; until then they retry within the busy timeout.
"""

from __future__ import annotations

import os
import sqlite3
import time


def connect(path: str | os.PathLike[str], busy_timeout_s: float) -> sqlite3.Connection:
    """Autocommit connection to ``path`` that waits up to ``busy_timeout_s`` on another writer's lock."""
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
    return conn


def connect_wal(path: str | os.PathLike[str], busy_timeout_s: float, retry_s: float = 0.02) -> sqlite3.Connection:
    """Autocommit connection to ``path`` with a busy timeout, WAL journal and ``synchronous=NORMAL``.

    Raises the last ``sqlite3.OperationalError`` if the file stays locked past ``busy_timeout_s``.

    >>> import tempfile, os
    >>> conn = connect_wal(os.path.join(tempfile.mkdtemp(), "x.sqlite"), 1.0)
    >>> conn.execute("PRAGMA journal_mode").fetchone()[0]
    'wal'
    """
    conn = connect(path, busy_timeout_s)
    try:
        deadline = time.monotonic() + busy_timeout_s
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL").fetchone()
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(retry_s)
        conn.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn
