"""The sandbox contains hostile programs: each of these would damage or leak on a bare run."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from conductor.grading.code import CodeGrader
from conductor.sandbox import Limits, Sandbox, namespaces_available

SB = Sandbox(Limits(wall_s=4, memory_mb=512))


def test_ok_program_runs_in_empty_dir_with_clean_env():
    os.environ["CONDUCTOR_TEST_SECRET"] = "s3cr3t-value"
    try:
        r = SB.run("import os, sys\nprint(sorted(os.listdir('.')))\nprint(os.environ.get('CONDUCTOR_TEST_SECRET'))\n"
                   "print(any('work/main' in p for p in sys.path))")
    finally:
        del os.environ["CONDUCTOR_TEST_SECRET"]
    assert r.status == "ok", r
    assert r.stdout.split("\n")[:3] == ["['main.py']", "None", "False"]


def test_stdin_is_passed():
    assert SB.run("print(int(input()) * 2)", stdin="21\n").stdout.strip() == "42"


def test_infinite_loop_times_out():
    t = time.monotonic()
    r = SB.run("while True:\n    pass\n", limits=Limits(wall_s=1.5))
    assert r.status == "timeout" and time.monotonic() - t < 10


def test_cpu_limit_kills_before_wall_clock():
    r = SB.run("while True:\n    pass\n", limits=Limits(wall_s=20, cpu_s=1))
    assert r.status == "timeout" and r.wall_s < 10


def test_memory_bomb_is_stopped():
    r = SB.run("x = bytearray(8 * 1024**3)\nprint('allocated')")
    assert r.status == "memory" and "allocated" not in r.stdout


def _sandbox_uid_procs() -> int:
    """Processes running under a sandbox uid (>= 200000); other jobs on the host do not disturb the count."""
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                n += os.stat(f"/proc/{p}").st_uid >= 200_000
            except OSError:
                pass
    return n


def test_fork_bomb_is_contained_and_cleaned_up():
    before = _sandbox_uid_procs()
    r = SB.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
               limits=Limits(wall_s=2, nproc=32))
    assert r.status in ("timeout", "error")
    deadline = time.monotonic() + 5
    while _sandbox_uid_procs() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _sandbox_uid_procs() <= before


def test_escaped_daemon_is_killed():
    # a child that starts its own session escapes killpg; the PID namespace (or uid sweep) still ends it
    marker = f"sbx-daemon-{os.getpid()}"
    r = SB.run(f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)  # {marker}\nprint('parent done')")
    assert r.status == "ok"
    time.sleep(0.3)
    leftovers = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    if b"main.py" in fh.read() and os.stat(f"/proc/{p}").st_uid >= 200_000:
                        leftovers.append(p)
            except OSError:
                pass
    assert not leftovers


@pytest.mark.parametrize("target", ["/tmp/conductor-sbx-escape", "/etc/conductor-sbx-escape",
                                    os.path.join(os.path.dirname(os.path.dirname(__file__)), "sbx-escape"),
                                    "/var/tmp/conductor-sbx-escape", "/dev/shm/conductor-sbx-escape"])
def test_writing_outside_the_work_dir_fails(target):
    r = SB.run(f"open({target!r}, 'w').write('x')\nprint('wrote')")
    assert r.status == "error" and "wrote" not in r.stdout
    assert not os.path.exists(target)


def test_project_files_and_home_are_invisible():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = SB.run(f"import os\nprint(os.path.exists({os.path.join(repo, 'pyproject.toml')!r}))\n"
               f"print(os.listdir(os.path.expanduser('~root')) if os.path.isdir(os.path.expanduser('~root')) else [])")
    assert r.status == "ok"
    assert r.stdout.splitlines()[0] == "False"


def test_reading_env_secrets_fails():
    os.environ["OPENAI_API_KEY"] = "sk-test-should-not-leak"
    try:
        r = SB.run("import os\nprint(os.environ.get('OPENAI_API_KEY'))\n"
                   "print(open('/proc/1/environ','rb').read().count(b'sk-test'))\n")
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert "sk-test-should-not-leak" not in r.stdout + r.stderr


def test_network_connection_to_loopback_is_refused():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    server.settimeout(1.0)

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass
    t = threading.Thread(target=accept)
    t.start()
    try:
        r = SB.run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
    finally:
        t.join()
        server.close()
    assert r.status == "error" and "connected" not in r.stdout
    assert not accepted


def test_network_refused_in_fallback_mode_too():
    sb = Sandbox(Limits(wall_s=4), use_namespaces=False)
    assert "audit-hook" in sb.isolation
    r = sb.run("import socket\ns = socket.create_connection(('127.0.0.1', 9), timeout=1)\nprint('connected')")
    assert r.status == "error" and "network access is disabled" in r.stderr


def test_output_flood_is_capped():
    r = SB.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits=Limits(wall_s=4, file_mb=1))
    assert r.status in ("output_limit", "error") and len(r.stdout) <= 1024 * 1024 + 65536


def test_graders_report_contained_programs_as_wrong_not_errors():
    grader = CodeGrader(SB, Limits(wall_s=2, memory_mb=512))
    gold = {"tests": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f"}
    for body in ("    while True:\n        pass\n", "    import os\n    os.system('true')\n    return bytearray(8 * 1024**3)\n",
                 "    import socket\n    socket.create_connection(('127.0.0.1', 9))\n"):
        res = grader.grade(gold, f"```python\ndef f(x):\n{body}```")
        assert res.correct is False and res.error is None


def test_parallel_runs_are_bounded_and_all_finish():
    sb = Sandbox(Limits(wall_s=10), max_parallel=2)
    results = sb.run_many([(f"print({i} * 3)", "") for i in range(12)])
    assert [r.stdout.strip() for r in results] == [str(i * 3) for i in range(12)]


def test_namespaces_in_use_when_root():
    if os.geteuid() == 0:
        assert namespaces_available(), "root with util-linux unshare should get namespaces"
        assert SB.isolation.startswith("namespaces")


def _sandboxed_pids() -> set[int]:
    pids = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    cmd = fh.read()
                if cmd.endswith(b"main.py\x00") and os.stat(f"/proc/{p}").st_uid >= 200_000:
                    pids.add(int(p))
            except OSError:
                pass
    return pids


def test_run_ends_even_if_the_parent_dies_first():
    import subprocess
    import sys

    # the child starts a sleeping sandboxed program, waits until it runs, then dies without cleaning up
    script = ("import os, threading, time, sys\nsys.path.insert(0, 'tests')\n"
              "from test_sandbox import _sandboxed_pids\nfrom conductor.sandbox import Sandbox, Limits\n"
              "sb = Sandbox(Limits(wall_s=4))\nbefore = _sandboxed_pids()\n"
              "threading.Thread(target=lambda: sb.run('import time\\ntime.sleep(1000)'), daemon=True).start()\n"
              "deadline = time.monotonic() + 15\n"
              "while not _sandboxed_pids() - before and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
              "os._exit(0)\n")
    import glob
    import shutil
    import tempfile

    pattern = os.path.join(tempfile.gettempdir(), "conductor-sbx-*")
    dirs_before = set(glob.glob(pattern))
    before = _sandboxed_pids()
    subprocess.run([sys.executable, "-c", script], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   check=True, timeout=60)
    orphans = _sandboxed_pids() - before
    assert orphans, "the sleeping program should still be running right after its parent died"
    deadline = time.monotonic() + 30     # the launcher's backstop fires at wall_s + 5 = 9 s
    while orphans & _sandboxed_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not orphans & _sandboxed_pids()
    for leftover in set(glob.glob(pattern)) - dirs_before:   # the dead parent never removed its temp dir
        shutil.rmtree(leftover, ignore_errors=True)


def test_broken_sandbox_is_an_infra_error_not_a_wrong_answer():
    broken = Sandbox(Limits(wall_s=4), python="/nonexistent/python3")
    r = broken.run("print(1)")
    assert r.status == "infra" and r.detail
    res = CodeGrader(broken).grade({"tests": "def check(c):\n    assert c() == 1\n", "entry_point": "f"},
                                   "def f():\n    return 1\n")
    assert res.correct is False and res.error and res.error.startswith("sandbox:")


def test_extra_files_land_in_the_work_dir_and_cannot_escape():
    r = SB.run("print(open('data/in.txt').read())", files={"data/in.txt": "hello"})
    assert r.stdout.strip() == "hello"
    with pytest.raises(ValueError, match="escapes the work dir"):
        SB.run("pass", files={"../evil.txt": "x"})


def test_filling_the_disk_or_inodes_is_stopped():
    r = SB.run("for i in range(20):\n    open(f'f{i}', 'wb').write(b'x' * (8 << 20))\nprint('wrote all')",
               limits=Limits(wall_s=10, disk_mb=32))
    assert r.status == "error" and "No space left" in r.stderr and "wrote all" not in r.stdout
    r = SB.run("for i in range(100000):\n    open(f'f{i}', 'w').close()\nprint('made all')",
               limits=Limits(wall_s=10, inodes=500))
    assert r.status == "error" and "No space left" in r.stderr
