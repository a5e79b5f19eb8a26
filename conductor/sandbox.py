"""Run untrusted generated code in a separate, locked-down process.

A shared leaf (it imports nothing of the project but ``conductor.resources``): the ``python`` tool worker runs
programs with it during execution (``workers/providers/python_tool.py``), the code grader after it.

Why each guard exists (see docs/grading.md for what is and is not enforced):
- ``unshare --net --pid --mount``: no network (a fresh namespace with only a
  downed loopback), a private PID namespace (when the run ends, every process it
  forked dies with it, which contains fork bombs), and a private mount table in
  which the home directory, the project, the shared data, caches and every
  world-writable directory (/tmp, /var/tmp, /dev/shm, /run) are covered by empty
  root-owned tmpfs, with only the interpreter and the run's own empty working
  directory mapped back in.
- A fresh unprivileged uid per run: root ignores RLIMIT_NPROC and file
  permissions, an unused uid obeys both, and two runs cannot touch each other.
- RLIMIT_CPU / AS / FSIZE / NPROC / NOFILE / CORE, plus a wall-clock timeout
  that kills the whole process group (and, with it, the PID namespace).
- A clean environment and ``python -I`` (no PYTHONPATH, no user site, no cwd on sys.path).
- A process-wide semaphore so many runs share the machine (default: one per core).

As a normal user (no root) the same launcher runs inside **bubblewrap** (``bwrap``,
unprivileged user namespaces): a fresh root holding only read-only ``/usr``, the system
library dirs and the interpreter's install, no network, a private PID namespace and
``/proc``, the same size- and inode-capped work dir, the same rlimits; the program runs
with no capabilities and cannot signal, trace or read the launcher (PID 1, non-dumpable).

Where neither is available the run falls back to rlimits + a Python audit hook that
refuses sockets, and ``SandboxResult.isolation`` says so.
"""

from __future__ import annotations

import marshal
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "infra"]
Mode = Literal["namespaces", "bwrap", "fallback"]
INFRA_EXIT = 125
BWRAP_WORKDIR = "/work"
BWRAP_UID = 1000                      # the program's uid in its own (nested) user namespace


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits."""

    wall_s: float = 10.0
    cpu_s: int | None = None          # default: ceil(wall_s) + 1
    memory_mb: int = 1024             # RLIMIT_AS (address space)
    file_mb: int = 16                 # RLIMIT_FSIZE: largest file (also caps stdout/stderr)
    disk_mb: int = 64                 # size of the work dir's tmpfs (namespace mode)
    inodes: int = 4096                # files + dirs in the work dir (namespace mode)
    nproc: int = 64                   # processes of the run's uid
    nofile: int = 256
    output_chars: int = 1_000_000     # how much stdout/stderr is read back

    @property
    def cpu(self) -> int:
        return self.cpu_s if self.cpu_s is not None else int(self.wall_s) + 2


@dataclass
class SandboxResult:
    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: str = ""
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# --------------------------------------------------------------------------- the in-namespace launcher

# Runs as root inside the new namespaces (PID 1 there): hides paths, maps the
# interpreter and the work dir back, then forks the user program under a fresh
# uid with rlimits, waits for it and reports its wait status on fd ``status_fd``.
_LAUNCHER = r'''
import marshal, os, resource, sys
spec = marshal.loads(bytes.fromhex(sys.argv[1]))
status_fd = spec["status_fd"]
os.set_inheritable(status_fd, False)
def report(kind, value):
    os.write(status_fd, ("%s %s\n" % (kind, value)).replace("\n", " ").encode() + b"\n")
try:
    if spec["namespaces"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
        def mount(src, dst, fstype, flags, data):
            if libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags, data and data.encode()) != 0:
                err = ctypes.get_errno()
                raise OSError(err, "mount %s: %s" % (dst, os.strerror(err)))
        mount(None, "/", None, MS_REC | MS_PRIVATE, None)
        work = spec["workdir"]
        keep = {p: os.open(p, os.O_PATH) for p in spec["expose_ro"]}
        src = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        for path in spec["hide"]:
            if os.path.isdir(path) and not os.path.islink(path):
                mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
        for path, fd in keep.items():
            if any(path == h or path.startswith(h.rstrip("/") + "/") for h in spec["hide"]):
                os.makedirs(path, mode=0o755, exist_ok=True)
                mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC, None)
                mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
            os.close(fd)
        # the work dir: a size-capped tmpfs owned by the run's uid, filled with a copy of the prepared files
        os.makedirs(work, mode=0o755, exist_ok=True)
        owner = spec["uid"] if spec["uid"] is not None else 0
        mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
              "mode=700,uid=%d,gid=%d,size=%dm,nr_inodes=%d" % (owner, owner, spec["disk_mb"], spec["inodes"]))
        def copy_tree(src_fd, dst):
            for name in os.listdir(src_fd):
                st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
                target = os.path.join(dst, name)
                if (st.st_mode & 0o170000) == 0o040000:
                    os.mkdir(target, 0o700)
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=src_fd)
                    copy_tree(sub, target)
                    os.close(sub)
                elif (st.st_mode & 0o170000) == 0o100000:
                    fin = os.open(name, os.O_RDONLY, dir_fd=src_fd)
                    fout = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    while True:
                        chunk = os.read(fin, 1 << 20)
                        if not chunk:
                            break
                        os.write(fout, chunk)
                    os.close(fin)
                    os.close(fout)
                else:
                    continue
                os.chown(target, owner, owner, follow_symlinks=False)
        copy_tree(src, work)
        os.close(src)
    pid = os.fork()
    if pid == 0:
        try:
            if spec["nest_uid"] is not None:
                # bubblewrap: we are uid 0 of the sandbox's user namespace and hold CAP_SYS_ADMIN there (the
                # mounts above). The program goes into a nested user namespace as uid nest_uid: its exec then
                # grants no capabilities, and it has none over the namespace that owns the mounts.
                import ctypes
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.unshare(0x10000000) != 0:                       # CLONE_NEWUSER
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
                for name, text in (("setgroups", "deny"), ("uid_map", "%d 0 1" % spec["nest_uid"]),
                                   ("gid_map", "%d 0 1" % spec["nest_uid"])):
                    with open("/proc/self/" + name, "w") as fh:
                        fh.write(text)
                for args in ((47, 4, 0, 0, 0), (38, 1, 0, 0, 0)):   # PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_NO_NEW_PRIVS
                    if libc.prctl(*args) != 0:
                        raise OSError(ctypes.get_errno(), "prctl%r" % (args,))
            lim = spec["limits"]
            for name, value in lim.items():
                soft, hard = value
                resource.setrlimit(getattr(resource, name), (soft, hard))
            uid = spec["uid"]
            if uid is not None and spec["setuid"]:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            os.chdir(spec["workdir"])
            os.execve(spec["argv"][0], spec["argv"], spec["env"])
        except BaseException as exc:
            report("infra", "child setup: %r" % (exc,))
            os._exit(125)
    if spec["nest_uid"] is not None:
        # same kernel uid as the program: non-dumpable, so it cannot ptrace us or read our memory or fds
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)                    # PR_SET_DUMPABLE = 0
    # backstop for a parent that died before its wall-clock timeout: end the run ourselves
    import signal
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.alarm(spec["backstop_s"])
    # the grading process gone (kill -9): the status pipe loses its only reader (POLLERR on this write end),
    # so the program is killed now instead of running on, orphaned, until the backstop
    import select
    try:
        pidfd = os.pidfd_open(pid)
        watch = select.poll()
        watch.register(pidfd, select.POLLIN)
        watch.register(spec["status_fd"], 0)
        done = False
        while not done:
            for fd, _ev in watch.poll():
                if fd == pidfd:
                    done = True
                else:
                    os.kill(pid, signal.SIGKILL)
                    if not spec["namespaces"]:
                        os.killpg(os.getpgrp(), signal.SIGKILL)
                    done = True
    except (AttributeError, OSError):
        pass
    _, status = os.waitpid(pid, 0)
    report("status", status)
    os._exit(0)
except BaseException as exc:
    report("infra", "launcher: %r" % (exc,))
    os._exit(125)
'''

# Prepended in fallback mode (no network namespace): refuse sockets from Python.
_NO_NET_WRAPPER = r'''
import sys, runpy
def _refuse(event, args):
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname"):
        raise PermissionError("network access is disabled in the sandbox")
sys.addaudithook(_refuse)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """True when we are root and a full trial run (unshare net+pid+mount, the tmpfs mounts,
    the uid drop) works here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return _trial("namespaces")


@lru_cache(maxsize=1)
def bwrap_available() -> bool:
    """True when we are not root, bubblewrap is installed and a full trial run works for this user
    (unprivileged user namespaces enabled)."""
    return os.geteuid() != 0 and shutil.which("bwrap") is not None and _trial("bwrap")


def _trial(mode: Mode) -> bool:
    try:
        trial = Sandbox(Limits(wall_s=30), mode=mode, max_parallel=1).run("print('ok')")
    except OSError:
        return False
    return trial.ok and trial.stdout.strip() == "ok"


def default_mode() -> Mode:
    """The strongest isolation that works here: namespaces as root, bubblewrap as a normal user, else the fallback."""
    if namespaces_available():
        return "namespaces"
    if bwrap_available():
        return "bwrap"
    return "fallback"


def _default_hidden() -> list[str]:
    from conductor.resources import cache_dir, project_root, shared_data_dir

    system = {"/", "/usr", "/bin", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev", "/sbin"}
    paths = [Path.home(), project_root(), project_root().parent, shared_data_dir(), cache_dir(),
             Path(os.environ.get("CONDUCTOR_HOME", "/nonexistent")), Path("/home"), Path("/mnt"), Path("/media"),
             Path("/srv"), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/run"), Path("/var/run"),
             Path(tempfile.gettempdir())]
    out: list[str] = []
    for p in paths:
        try:
            rp = str(p.resolve())
        except OSError:
            continue
        if rp not in system and os.path.isdir(rp) and rp not in out:
            out.append(rp)
    # a hidden path that contains another hidden path must come first (outer mount, then inner)
    return sorted(out, key=lambda s: s.count("/"))


def _world_reachable(path: str) -> bool:
    """True when every directory above ``path`` is searchable by any user."""
    parent = os.path.dirname(path)
    while True:
        try:
            if not os.stat(parent).st_mode & 0o001:
                return False
        except OSError:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def _python_roots(python: str | None = None) -> list[str]:
    """Directories the interpreter needs read access to (prefix, libs, site-packages)."""
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
             os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    if python:
        roots.add(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    return sorted(r for r in roots if r != "/")


def _bwrap_command(python: str, host_workdir: str) -> list[str]:
    """bubblewrap's part: new user/net/pid/ipc/uts/cgroup namespaces, a fresh read-only root holding
    /usr, the library dirs and the interpreter's install, new /proc and /dev, the prepared files
    bound at /work (the launcher covers them with the capped tmpfs), and the launcher as PID 1."""
    # --uid 0: any other uid makes bwrap nest a second user namespace that does not own the mount
    # namespace, and the launcher could not mount the work dir; the launcher nests one for the program.
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1",
            "--uid", "0", "--gid", "0", "--cap-add", "CAP_SYS_ADMIN",     # the launcher's mounts
            "--cap-add", "CAP_SETFCAP",                                    # mapping its uid 0 into the nested one
            "--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    for root in _python_roots(python):
        if os.path.isdir(root) and root != "/usr" and not root.startswith("/usr/"):
            argv += ["--ro-bind", root, root]
    argv += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", host_workdir, BWRAP_WORKDIR,
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/"]
    return argv


class Sandbox:
    """A factory of sandboxed runs sharing one semaphore."""

    def __init__(self, limits: Limits | None = None, *, max_parallel: int | None = None,
                 python: str | None = None, hide: Sequence[str] | None = None,
                 use_namespaces: bool | None = None, allow_site_packages: bool = False,
                 mode: Mode | None = None) -> None:
        """``mode`` picks the isolation (default: the strongest that works here, see ``default_mode``);
        ``use_namespaces=False`` is the older spelling of ``mode="fallback"``."""
        self.limits = limits or Limits()
        self.max_parallel = max_parallel or os.cpu_count() or 1
        self._sem = threading.BoundedSemaphore(self.max_parallel)
        self.python = os.path.realpath(python or sys.executable)
        self.hide = list(hide) if hide is not None else _default_hidden()
        if mode == "bwrap" and os.geteuid() == 0:
            # inside bwrap root would stay uid 0 of its namespace, and exec would hand the program every capability
            raise ValueError("sandbox mode 'bwrap' is for normal users; as root use 'namespaces'")
        if mode is None:
            if use_namespaces is None:
                mode = default_mode()
            else:
                mode = ("namespaces" if os.geteuid() == 0 else "bwrap") if use_namespaces else "fallback"
        self.mode: Mode = mode
        self.use_namespaces = mode != "fallback"
        self.allow_site_packages = allow_site_packages
        # An unprivileged uid needs to reach the interpreter: without a mount namespace to map it
        # back in, that only works when every directory above it is world-searchable.
        self.root = os.geteuid() == 0 and (mode == "namespaces" or (mode == "fallback" and _world_reachable(self.python)))

    @property
    def isolation(self) -> str:
        if self.mode == "namespaces":
            return "namespaces(net,pid,mount)+uid+rlimits"
        if self.mode == "bwrap":
            return "bwrap(user,net,pid,mount)+no-caps+rlimits"
        return ("uid+" if self.root else "") + "rlimits+audit-hook(no sockets)"

    # -- one run ---------------------------------------------------------
    def run(self, code: str, *, stdin: str = "", limits: Limits | None = None,
            files: dict[str, str] | None = None, env: dict[str, str] | None = None) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh empty directory; blocks for a free slot."""
        with self._sem:
            return self._run(code, stdin, limits or self.limits, files or {}, env or {})

    def run_many(self, programs: Iterable[tuple[str, str]], *, limits: Limits | None = None) -> list[SandboxResult]:
        """(code, stdin) pairs run in parallel, at most ``max_parallel`` at a time, results in order."""
        items = list(programs)
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(items))) as ex:
            return list(ex.map(lambda cs: self.run(cs[0], stdin=cs[1], limits=limits), items))

    def _run(self, code: str, stdin: str, limits: Limits, files: dict[str, str],
             extra_env: dict[str, str]) -> SandboxResult:
        start = time.monotonic()
        uid = random.randint(200_000, 2_000_000_000) if self.root else None
        private = tempfile.mkdtemp(prefix="conductor-sbx-")           # root-only: status, stdin, stdout, stderr
        try:
            workdir = _prepare_workdir(private, code, files, uid)
            status_r, status_w = os.pipe()
            launcher = self._launcher(workdir, uid, limits, extra_env, status_w)
            in_path, out_path, err_path = (os.path.join(private, n) for n in ("stdin", "stdout", "stderr"))
            with open(in_path, "w") as fh:
                fh.write(stdin)
            timed_out = False
            with open(in_path, "rb") as fin, open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
                try:
                    proc = subprocess.Popen(launcher, stdin=fin, stdout=fout, stderr=ferr, cwd="/",
                                            env={"PATH": _PATH, "LANG": "C.UTF-8"},
                                            pass_fds=(status_w,), start_new_session=True)
                except OSError as exc:
                    os.close(status_r)
                    os.close(status_w)
                    return SandboxResult("infra", None, "", "", time.monotonic() - start, self.isolation,
                                         f"cannot start sandbox: {exc}")
                os.close(status_w)
                with _LIVE_LOCK:
                    _LIVE.add(proc.pid)
                try:
                    timed_out = not _wait_exit(proc, limits.wall_s)
                finally:
                    _kill_group(proc.pid)
                    with _LIVE_LOCK:
                        _LIVE.discard(proc.pid)
                    proc.wait()
                    if uid is not None and self.mode == "fallback":
                        _kill_uid(uid)
            with os.fdopen(status_r, "rb") as fh:
                raw = fh.read().decode(errors="replace")
            stdout = _read_text(out_path, limits.output_chars)
            stderr = _read_text(err_path, limits.output_chars)
            wall = time.monotonic() - start
            return _classify(raw, timed_out, proc.returncode, stdout, stderr, wall, self.isolation)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    def _launcher(self, workdir: str, uid: int | None, limits: Limits, extra_env: dict[str, str],
                  status_fd: int) -> list[str]:
        """The command line that starts the launcher in this sandbox's mode."""
        bwrap = self.mode == "bwrap"
        inside = BWRAP_WORKDIR if bwrap else workdir           # the work dir as the program sees it
        env = {"PATH": _PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": inside, "TMPDIR": inside,
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", **extra_env}
        py_flags = ["-I"] + ([] if self.allow_site_packages else ["-S"])
        if self.use_namespaces:
            argv = [self.python, *py_flags, "main.py"]
        else:
            argv = [self.python, *py_flags, "-c", _NO_NET_WRAPPER, "main.py"]
        mb = 1024 * 1024
        rl = {"RLIMIT_CPU": [limits.cpu, limits.cpu + 1],
              "RLIMIT_AS": [limits.memory_mb * mb] * 2,
              "RLIMIT_FSIZE": [limits.file_mb * mb] * 2,
              "RLIMIT_NPROC": [limits.nproc] * 2,
              "RLIMIT_NOFILE": [limits.nofile] * 2,
              "RLIMIT_CORE": [0, 0]}
        spec = {"namespaces": self.use_namespaces, "workdir": inside, "hide": [] if bwrap else self.hide,
                "expose_ro": [] if bwrap else _python_roots(), "uid": 0 if bwrap else uid,
                "setuid": not bwrap, "nest_uid": BWRAP_UID if bwrap else None, "limits": rl, "argv": argv, "env": env,
                "status_fd": status_fd, "backstop_s": int(limits.wall_s) + 5,
                "disk_mb": limits.disk_mb, "inodes": limits.inodes}
        launcher = [self.python, "-I", "-S", "-c", _LAUNCHER, marshal.dumps(spec).hex()]
        if bwrap:
            return [*_bwrap_command(self.python, workdir), *launcher]
        if self.use_namespaces:
            return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
                    "--propagation", "private", *launcher]
        return launcher


_PATH = "/usr/local/bin:/usr/bin:/bin"


def _prepare_workdir(private: str, code: str, files: dict[str, str], uid: int | None) -> str:
    """``private``/work holding main.py and ``files``; owned by ``uid`` when the run drops to one."""
    workdir = os.path.join(private, "work")
    os.mkdir(workdir, 0o700)
    with open(os.path.join(workdir, "main.py"), "w") as fh:
        fh.write(code)
    for name, content in files.items():
        target = os.path.realpath(os.path.join(workdir, name))
        if not target.startswith(workdir + os.sep):
            raise ValueError(f"sandbox file {name!r} escapes the work dir")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as fh:
            fh.write(content)
    if uid is not None:
        for dirpath, _dirs, names in os.walk(workdir):
            os.chown(dirpath, uid, uid)
            for n in names:
                os.chown(os.path.join(dirpath, n), uid, uid)
        os.chmod(private, 0o711)   # the uid may traverse into work/, nothing else
    return workdir


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to ``timeout`` for ``proc`` to exit; wakes at once through a pidfd (Popen.wait
    with a timeout polls with sleeps of up to 50 ms, a large share of a short run)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)


def _read_text(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


_LIVE: set[int] = set()       # process groups of the sandboxed runs in flight
_LIVE_LOCK = threading.Lock()


def kill_running() -> int:
    """Kill every sandboxed run in flight (an interrupted ``conductor grade``); returns how many."""
    with _LIVE_LOCK:
        groups = list(_LIVE)
    for pgid in groups:
        _kill_group(pgid)
    return len(groups)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """Fallback-mode sweep: kill every process still running as the run's uid
    (catches children that left the process group with setsid)."""
    for _ in range(3):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found = True
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue
        if not found:
            return
        time.sleep(0.05)


def _classify(raw_status: str, timed_out: bool, launcher_rc: int | None, stdout: str, stderr: str,
              wall: float, isolation: str) -> SandboxResult:
    def result(status: Status, rc: int | None, detail: str | None = None) -> SandboxResult:
        return SandboxResult(status, rc, stdout, stderr, wall, isolation, detail)

    if timed_out:
        return result("timeout", None, "wall-clock timeout")
    info: dict[str, str] = {}
    for line in raw_status.splitlines():        # "infra <message>" and/or "status <wait status>"
        kind, _, value = line.partition(" ")
        if kind in ("infra", "status") and kind not in info:
            info[kind] = value
    if "infra" in info:
        return result("infra", None, str(info["infra"]))
    if "status" not in info:
        return result("infra", launcher_rc, f"sandbox launcher exited {launcher_rc} without a status")
    st = int(info["status"])
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        if sig == signal.SIGXCPU:
            return result("timeout", -sig, "CPU time limit")
        if sig == signal.SIGXFSZ:
            return result("output_limit", -sig, "file size limit")
        if sig == signal.SIGKILL:
            return result("timeout", -sig, "killed (CPU hard limit)")
        return result("error", -sig, f"killed by signal {signal.Signals(sig).name}")
    rc = os.WEXITSTATUS(st)
    if rc == 0:
        return result("ok", 0)
    if "MemoryError" in stderr[-2000:]:
        return result("memory", rc, "memory limit")
    return result("error", rc)


_DEFAULT: Sandbox | None = None
_DEFAULT_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox (one semaphore for everything that runs code)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Sandbox()
        return _DEFAULT


def run_code(code: str, *, stdin: str = "", limits: Limits | None = None) -> SandboxResult:
    """Run ``code`` in the process-wide sandbox."""
    return default_sandbox().run(code, stdin=stdin, limits=limits)


__all__ = ["Limits", "Sandbox", "SandboxResult", "default_sandbox", "namespaces_available", "run_code"]
