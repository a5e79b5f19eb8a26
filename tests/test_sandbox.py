"""The sandbox contains hostile programs: each of these would damage or leak on a bare run.

Every containment test runs twice: as root (``namespaces`` mode: unshare + a fresh uid) and as a real
normal user (``bwrap`` mode: bubblewrap on unprivileged user namespaces). Running as root, the tests
reach the normal user through ``setpriv`` to an unused uid, in a private mount namespace where the
interpreter's install is reachable (it may live under a 0700 home such as /root); the sandbox itself
is then driven by a small server process running as that user. Running as a normal user, the
``user`` mode runs in-process and the ``root`` mode is skipped.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from conductor.grading.code import CodeGrader
from conductor.sandbox import Limits, Sandbox, SandboxResult

REPO = Path(__file__).resolve().parent.parent
TEST_UID = int(os.environ.get("CONDUCTOR_SANDBOX_TEST_UID", "64123"))   # an unused uid: the "normal user"
LIMITS = Limits(wall_s=4, memory_mb=512)

# --------------------------------------------------------------------------- running as a normal user

# Runs as root inside `unshare --mount`: makes the interpreter reachable for TEST_UID, then becomes it.
_PRELUDE = r'''
import ctypes, json, os, sys
cfg, argv = json.loads(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
def mount(src, dst, fstype, flags, data=None):
    if libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags, data and data.encode()):
        raise OSError(ctypes.get_errno(), "mount " + dst)
def blocked(path):             # the topmost ancestor a normal user cannot search, or None
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        d = "/" + "/".join(parts[:i])
        if not os.stat(d).st_mode & 0o001:
            return d
    return None
fds = {p: os.open(p, os.O_PATH) for p in cfg["reach"] if blocked(p)}
for cover in sorted({blocked(p) for p in fds}, key=len):
    mount("tmpfs", cover, "tmpfs", 0, "mode=0755")
for path, fd in fds.items():
    os.makedirs(path, exist_ok=True)
    mount("/proc/self/fd/%d" % fd, path, None, 4096 | 16384)          # MS_BIND | MS_REC
os.setgroups([])
os.setgid(cfg["uid"])
os.setuid(cfg["uid"])
os.chdir(cfg["cwd"])
os.execve(argv[0], argv, cfg["env"])
'''

_SERVER = r'''
import dataclasses, json, os, sys
from conductor.sandbox import Limits, Sandbox
boxes = {}
def sandbox(kw):
    key = json.dumps(kw, sort_keys=True)
    if key not in boxes:
        kw = dict(kw)
        lim = kw.pop("limits", None)
        boxes[key] = Sandbox(Limits(**lim) if lim else None, **kw)
    return boxes[key]
for line in sys.stdin:
    req = json.loads(line)
    try:
        sb = sandbox(req["sandbox"])
        lim = Limits(**req["limits"]) if req.get("limits") else None
        if req["op"] == "info":
            out = {"mode": sb.mode, "isolation": sb.isolation, "pid": os.getpid(), "uid": os.getuid()}
        elif req["op"] == "run":
            out = dataclasses.asdict(sb.run(req["code"], stdin=req["stdin"], limits=lim, files=req["files"],
                                            env=req["env"]))
        else:
            out = [dataclasses.asdict(r) for r in sb.run_many([tuple(p) for p in req["programs"]], limits=lim)]
    except Exception as exc:
        out = {"raise": type(exc).__name__, "message": str(exc)}
    print(json.dumps(out), flush=True)
'''


def as_normal_user(argv: list[str], home: str) -> list[str]:
    """``argv`` run as TEST_UID (we are root), with the interpreter and the repo reachable."""
    reach = sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
                    os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))), str(REPO)})
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "CONDUCTOR_HOME": os.path.join(home, "conductor")}
    cfg = {"uid": TEST_UID, "cwd": str(REPO), "reach": reach, "env": env}
    return ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-I", "-S", "-c", _PRELUDE,
            json.dumps(cfg), *argv]


class UserSandbox:
    """The Sandbox API, served by a process running as the normal user (one request at a time)."""

    def __init__(self, server: _Server, limits: Limits | None = None, **kw) -> None:
        self.server = server
        self.kw = {**kw, **({"limits": dataclasses.asdict(limits)} if limits else {})}
        info = self._ask({"op": "info"})
        self.mode, self.isolation, self.pid = info["mode"], info["isolation"], info["pid"]
        self.max_parallel = kw.get("max_parallel") or os.cpu_count() or 1

    def _ask(self, req: dict) -> object:
        out = self.server.ask({**req, "sandbox": self.kw})
        if isinstance(out, dict) and "raise" in out:
            raise {"ValueError": ValueError}.get(out["raise"], RuntimeError)(out["message"])
        return out

    def run(self, code: str, *, stdin: str = "", limits: Limits | None = None, files: dict | None = None,
            env: dict | None = None) -> SandboxResult:
        out = self._ask({"op": "run", "code": code, "stdin": stdin, "files": files, "env": env,
                         "limits": dataclasses.asdict(limits) if limits else None})
        return SandboxResult(**out)  # type: ignore[arg-type]

    def run_many(self, programs, *, limits: Limits | None = None) -> list[SandboxResult]:
        out = self._ask({"op": "run_many", "programs": [list(p) for p in programs],
                         "limits": dataclasses.asdict(limits) if limits else None})
        return [SandboxResult(**r) for r in out]  # type: ignore[union-attr]


class _Server:
    def __init__(self, home: str) -> None:
        self.proc = subprocess.Popen(as_normal_user([sys.executable, "-c", _SERVER], home), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()

    def ask(self, req: dict) -> object:
        with self.lock:
            self.proc.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the normal-user sandbox server exited ({self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module", params=["root", "user"])
def mode(request, tmp_path_factory):
    """Yields (mode name, factory of sandboxes in that mode, runner of a python script in that mode)."""
    root = os.geteuid() == 0
    if request.param == "root":
        if not root:
            pytest.skip("root mode: the tests are not running as root")
        yield "root", Sandbox, lambda argv: argv
        return
    if not root:
        if shutil.which("bwrap") is None:
            pytest.skip("neither mode can run: not root, and bubblewrap is not installed (apt-get install bubblewrap)")
        yield "user", Sandbox, lambda argv: argv
        return
    for tool in ("unshare", "setpriv", "bwrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"normal-user mode: {tool} is not installed (bubblewrap: apt-get install bubblewrap)")
    home = str(tmp_path_factory.mktemp("normal-user-home"))
    os.chown(home, TEST_UID, TEST_UID)
    os.chmod(os.path.dirname(home), 0o755)
    server = _Server(home)
    try:
        yield "user", lambda limits=None, **kw: UserSandbox(server, limits, **kw), \
            lambda argv: as_normal_user(argv, home)
    finally:
        server.close()


@pytest.fixture(scope="module")
def SB(mode):
    return mode[1](LIMITS)


def _marked_pids(marker: str) -> set[int]:
    """Processes whose environment holds ``marker`` (other jobs' sandboxes on this host do not count)."""
    pids = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/environ", "rb") as fh:
                    if marker.encode() in fh.read():
                        pids.add(int(p))
            except OSError:
                pass
    return pids


def _gone(marker: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while _marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _marked_pids(marker)


# --------------------------------------------------------------------------- the containment tests


def test_isolation_is_the_strong_one_for_the_mode(mode, SB):
    want = {"root": "namespaces", "user": "bwrap"}[mode[0]]
    assert SB.mode == want, f"{mode[0]} mode runs with isolation {SB.isolation!r}"
    r = SB.run("import os\nprint(os.getuid())\nprint(open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
    uid, caps = r.stdout.split()
    assert int(uid) != 0 and int(caps, 16) == 0, r      # an unprivileged uid without any capability


def test_ok_program_runs_in_empty_dir_with_clean_env(SB):
    os.environ["CONDUCTOR_TEST_SECRET"] = "s3cr3t-value"
    try:
        r = SB.run("import os, sys\nprint(sorted(os.listdir('.')))\nprint(os.environ.get('CONDUCTOR_TEST_SECRET'))\n"
                   "print(any('work/main' in p for p in sys.path))")
    finally:
        del os.environ["CONDUCTOR_TEST_SECRET"]
    assert r.status == "ok", r
    assert r.stdout.split("\n")[:3] == ["['main.py']", "None", "False"]


def test_stdin_is_passed(SB):
    assert SB.run("print(int(input()) * 2)", stdin="21\n").stdout.strip() == "42"


def test_infinite_loop_times_out(SB):
    r = SB.run("while True:\n    pass\n", limits=Limits(wall_s=1.5))
    assert r.status == "timeout" and r.detail == "wall-clock timeout"


def test_cpu_limit_kills_before_wall_clock(SB):
    r = SB.run("while True:\n    pass\n", limits=Limits(wall_s=60, cpu_s=1))
    assert r.status == "timeout" and r.detail in ("CPU time limit", "killed (CPU hard limit)")


def test_memory_bomb_is_stopped(SB):
    r = SB.run("x = bytearray(8 * 1024**3)\nprint('allocated')")
    assert r.status == "memory" and "allocated" not in r.stdout


def test_fork_bomb_is_contained_and_cleaned_up(SB):
    marker = f"sbx-{uuid.uuid4().hex}"
    r = SB.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
               limits=Limits(wall_s=2, nproc=32), env={"SBX_MARKER": marker})
    assert r.status in ("timeout", "error")
    assert _gone(marker, within=5)


def test_escaped_daemon_is_killed(SB):
    # a child that starts its own session escapes killpg; the PID namespace (or uid sweep) still ends it
    marker = f"sbx-{uuid.uuid4().hex}"
    r = SB.run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')",
               env={"SBX_MARKER": marker})
    assert r.status == "ok"
    assert _gone(marker, within=3)


@pytest.mark.parametrize("target", ["/tmp/conductor-sbx-escape", "/etc/conductor-sbx-escape",
                                    str(REPO / "sbx-escape"), "/var/tmp/conductor-sbx-escape",
                                    "/dev/shm/conductor-sbx-escape"])
def test_writing_outside_the_work_dir_fails(SB, target):
    if os.path.exists(target):
        pytest.fail(f"{target} exists before the run (left by an earlier, escaped run?): remove it")
    try:
        r = SB.run(f"open({target!r}, 'w').write('x')\nprint('wrote')")
        assert r.status == "error" and "wrote" not in r.stdout
        assert not os.path.exists(target)
    finally:
        if os.path.exists(target):           # a weak sandbox wrote it: do not leave it to the next run
            os.unlink(target)


def test_project_files_and_home_are_invisible(SB):
    home = str(Path.home())
    r = SB.run(f"import os\nprint(os.path.exists({str(REPO / 'pyproject.toml')!r}))\n"
               f"import json\nprint(json.dumps(sorted(os.listdir({home!r})) if os.path.isdir({home!r}) else []))")
    assert r.status == "ok", r
    exists, listing = r.stdout.splitlines()
    assert exists == "False"
    # only the way down to the interpreter's install (e.g. /root/.pyenv) may show in the home directory
    needed = {Path(p).relative_to(home).parts[0] for p in (sys.prefix, sys.base_prefix, sys.executable)
              if Path(p).is_relative_to(home)}
    assert set(json.loads(listing)) <= needed, listing


def test_reading_env_secrets_fails(SB):
    os.environ["OPENAI_API_KEY"] = "sk-test-should-not-leak"
    try:
        r = SB.run("import glob, os\nprint(os.environ.get('OPENAI_API_KEY'))\n"
                   "for p in glob.glob('/proc/*/environ'):\n    try:\n        print(open(p, 'rb').read())\n"
                   "    except OSError:\n        pass\n")
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert r.status == "ok", r
    assert "sk-test-should-not-leak" not in r.stdout + r.stderr


class _Listener:
    """A loopback server on the host that records whether anything connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[object] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                self.accepted.append(self.sock.accept())
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.mark.parametrize("how", ["python socket", "ctypes connect", "a subprocess without the audit hook"])
def test_network_is_unreachable_at_every_level(SB, how):
    listener = _Listener()
    port = listener.port
    programs = {
        "python socket": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
        "ctypes connect": "import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                          "fd = libc.socket(2, 1, 0)\n"
                          f"addr = struct.pack('<HH4s8x', 2, socket.htons({port}), bytes([127, 0, 0, 1]))\n"
                          "rc = libc.connect(fd, addr, len(addr))\nassert rc == 0, ctypes.get_errno()\n",
        "a subprocess without the audit hook": "import subprocess, sys\nsubprocess.run([sys.executable, '-I', '-S', '-c', "
                          f"\"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"], "
                          "check=True)\n",
    }
    try:
        r = SB.run(programs[how] + "print('connected')")
        time.sleep(0.3)
    finally:
        listener.close()
    assert "connected" not in r.stdout and r.status == "error", r
    assert not listener.accepted


def test_a_run_cannot_signal_the_process_that_started_it(mode, SB):
    caller = SB.pid if isinstance(SB, UserSandbox) else os.getpid()
    r = SB.run(f"import os, signal\ntry:\n    os.kill({caller}, signal.SIGKILL)\n    print('sent')\n"
               "except OSError as exc:\n    print('refused', exc.errno)\n")
    assert r.status == "ok" and r.stdout.startswith("refused"), r
    assert SB.run("print(1)").stdout.strip() == "1"         # the caller is still alive


def test_output_flood_is_capped(SB):
    r = SB.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits=Limits(wall_s=4, file_mb=1))
    assert r.status in ("output_limit", "error") and len(r.stdout) <= 1024 * 1024 + 65536


def test_graders_report_contained_programs_as_wrong_not_errors(SB):
    grader = CodeGrader(SB, Limits(wall_s=2, memory_mb=512))  # type: ignore[arg-type]
    gold = {"tests": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f"}
    assert grader.grade(gold, "```python\ndef f(x):\n    return x + 1\n```").correct
    for body in ("    while True:\n        pass\n", "    import os\n    os.system('true')\n    return bytearray(8 * 1024**3)\n",
                 "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n", "    import sys\n    sys.exit(0)\n"):
        res = grader.grade(gold, f"```python\ndef f(x):\n{body}```")
        assert res.correct is False and res.error is None, (body, res)


def test_parallel_runs_are_bounded_and_all_finish(mode):
    sb = mode[1](Limits(wall_s=10), max_parallel=2)
    results = sb.run_many([(f"print({i} * 3)", "") for i in range(12)])
    assert [r.stdout.strip() for r in results] == [str(i * 3) for i in range(12)]


def test_run_ends_even_if_the_parent_dies_first(mode):
    marker = f"sbx-{uuid.uuid4().hex}"
    # the child starts a sleeping sandboxed program, waits until it runs, then dies without cleaning up
    script = (f"import os, threading, time\nfrom conductor.sandbox import Sandbox, Limits\nmarker = {marker!r}\n"
              "def running():\n    for p in os.listdir('/proc'):\n        try:\n"
              "            if p.isdigit() and marker.encode() in open(f'/proc/{p}/environ', 'rb').read():\n"
              "                return True\n        except OSError:\n            pass\n    return False\n"
              "sb = Sandbox(Limits(wall_s=4))\n"
              "threading.Thread(target=lambda: sb.run('import time\\ntime.sleep(1000)', env={'SBX_MARKER': marker}),"
              " daemon=True).start()\n"
              "deadline = time.monotonic() + 30\nwhile not running() and time.monotonic() < deadline:\n"
              "    time.sleep(0.05)\nos._exit(0 if running() else 3)\n")
    pattern = os.path.join(tempfile.gettempdir(), "conductor-sbx-*")
    dirs_before = set(glob.glob(pattern))
    child = subprocess.run(mode[2]([sys.executable, "-c", script]), cwd=REPO, timeout=120)
    assert child.returncode == 0, "the sandboxed program never started"
    assert _gone(marker, within=30)        # the launcher's backstop fires at wall_s + 5 = 9 s at the latest
    for leftover in set(glob.glob(pattern)) - dirs_before:   # the dead parent never removed its temp dir
        shutil.rmtree(leftover, ignore_errors=True)


def test_broken_sandbox_is_an_infra_error_not_a_wrong_answer(mode):
    broken = mode[1](Limits(wall_s=4), python="/nonexistent/python3")
    r = broken.run("print(1)")
    assert r.status == "infra" and r.detail
    res = CodeGrader(broken).grade({"tests": "def check(c):\n    assert c() == 1\n", "entry_point": "f"},  # type: ignore[arg-type]
                                   "def f():\n    return 1\n")
    assert res.correct is False and res.error and res.error.startswith("sandbox:")


def test_extra_files_land_in_the_work_dir_and_cannot_escape(SB):
    r = SB.run("print(open('data/in.txt').read())", files={"data/in.txt": "hello"})
    assert r.stdout.strip() == "hello"
    with pytest.raises(ValueError, match="escapes the work dir"):
        SB.run("pass", files={"../evil.txt": "x"})


def test_filling_the_disk_or_inodes_is_stopped(SB):
    r = SB.run("for i in range(20):\n    open(f'f{i}', 'wb').write(b'x' * (8 << 20))\nprint('wrote all')",
               limits=Limits(wall_s=10, disk_mb=32))
    assert r.status == "error" and "No space left" in r.stderr and "wrote all" not in r.stdout
    r = SB.run("for i in range(100000):\n    open(f'f{i}', 'w').close()\nprint('made all')",
               limits=Limits(wall_s=10, inodes=500))
    assert r.status == "error" and "No space left" in r.stderr


# --------------------------------------------------------------------------- mode selection and the fallback


def test_network_refused_in_fallback_mode_too():
    sb = Sandbox(Limits(wall_s=4), use_namespaces=False)
    assert sb.mode == "fallback" and "audit-hook" in sb.isolation
    r = sb.run("import socket\ns = socket.create_connection(('127.0.0.1', 9), timeout=1)\nprint('connected')")
    assert r.status == "error" and "network access is disabled" in r.stderr


def test_bwrap_mode_is_refused_to_root():
    if os.geteuid() != 0:
        pytest.skip("only root is refused bubblewrap mode")
    with pytest.raises(ValueError, match="normal users"):
        Sandbox(mode="bwrap")
