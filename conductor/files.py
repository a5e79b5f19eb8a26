"""Writing a local file so that a reader never sees half of it: the one atomic-write helper and the figure saver.

WHY: reports, summaries, registries and plots are read by other processes (a dashboard, the next nightly run,
a resumed bench) while they are being rewritten, and a run can be killed mid-write. Each write goes to a
temporary file in the same directory (so the rename stays on one file system) and is renamed over the target
with ``os.replace``, which POSIX makes atomic: the target is the old file or the new one, never a mix, and a
failed write leaves no temporary file behind. Object stores need none of this (an upload appears whole); the
lake's writer handles those (``conductor.lake.writer.atomic_output``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that wants a file name (``savefig``, ``torch.save``);
    renamed over ``path`` when the block ends, removed if it raises. ``suffix`` keeps the extension that some
    writers read the format from.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> with atomic_path(d / "x.txt") as tmp:
    ...     _ = tmp.write_text("hello")
    >>> (d / "x.txt").read_text(), sorted(p.name for p in d.iterdir())
    ('hello', ['x.txt'])
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fresh unique name rather than mkstemp: the file is created by the writer with the umask's permissions
    # (mkstemp's 0600 would hide a shared cache's or registry's files from other users).
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (flushed to disk before the rename, so a crash right after the
    rename cannot leave an empty file); the parent directory is created.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "sub" / "a.bin"
    >>> atomic_write_bytes(p, b"\\x00\\x01").read_bytes()
    b'\\x00\\x01'
    """
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see ``atomic_write_bytes``.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "a.md"
    >>> _ = atomic_write_text(p, "one"); atomic_write_text(p, "two").read_text()
    'two'
    """
    return atomic_write_bytes(path, text.encode("utf-8"))


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110, close: bool = True) -> Path:
    """Save a matplotlib figure as PNG atomically and close it (an open figure keeps its memory until the
    process ends, which a long nightly run or bench notices). ``close=False`` for a caller that reuses it."""
    path = Path(path)
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path
