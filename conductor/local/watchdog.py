"""Stop what a command started when the command is killed outright.

Prefect's temporary API server and the embedded model servers are child processes; they are stopped at
normal exit and on Ctrl-C, but a ``kill -9`` of the command skips every handler and leaves them running.
``watch_children()`` starts one small watcher process (``python -m conductor.local.watchdog``) that holds the
read end of a pipe whose write end only the command holds: when the command dies, however it dies, the
kernel closes the pipe, and the watcher terminates the children it saw (it notes them every second,
checking start times so a reused pid is never hit).
"""

from __future__ import annotations

import os
import subprocess
import sys

POLL_S = 1.0
_started: list[int] = []   # the write end of the pipe; kept open for the life of the process


def watch_children() -> None:
    """Start the watcher for this process (once). Linux and macOS; a no-op where psutil is missing."""
    if _started:
        return
    try:
        import psutil  # noqa: F401
    except ImportError:
        return
    read_fd, write_fd = os.pipe()
    subprocess.Popen([sys.executable, "-m", "conductor.local.watchdog", str(os.getpid()), str(read_fd)],
                     pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    os.close(read_fd)
    os.set_inheritable(write_fd, False)   # only this process may hold it, or the watcher never wakes
    _started.append(write_fd)


def _watch(parent_pid: int, read_fd: int) -> None:
    import select

    import psutil

    me = os.getpid()
    seen: dict[int, float] = {}
    while True:
        ready, _, _ = select.select([read_fd], [], [], POLL_S)
        if ready and not os.read(read_fd, 1):
            break   # the parent is gone: EOF
        try:
            for child in psutil.Process(parent_pid).children(recursive=True):
                if child.pid != me:
                    seen.setdefault(child.pid, child.create_time())
        except psutil.Error:
            break
    _stop(seen)


def _stop(seen: dict[int, float]) -> None:
    import psutil

    alive = []
    for pid, started in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - started) < 0.01:
                p.terminate()
                alive.append(p)
        except psutil.Error:
            continue
    _, rest = psutil.wait_procs(alive, timeout=5)
    for p in rest:
        try:
            p.kill()
        except psutil.Error:
            pass


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]))
