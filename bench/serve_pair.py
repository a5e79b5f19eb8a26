"""Two `conductor serve` processes side by side, under the same load at the same time: a server-CPU comparison
that the host's phase cannot fake.

`bench/serve.py`'s ``server_cpu_ms_per_request`` moves with this host's phase: one tree measured 0.83 to 1.26 ms in
one day (docs/serving.md, "Sixth look" to "Ninth look"), so a change and its base run minutes apart cannot tell a 5%
cut from the host. Here both servers run at once over the same simulated pool (``moa:0+1:2``, 0.25 s per worker
call, the lake on), each answering the same 2,000 chat completions from its own 64 aiohttp keep-alive lanes (the
light generator of `bench/serve.py`), so both see the same minutes of the host. Each round starts both afresh;
B's CPU per request over A's is the comparison, and its spread over rounds with the same tree on both sides
(A/A, the default) is the resolution of any such comparison on this machine.

Run: ``python bench/serve_pair.py`` (A/A on this tree), or ``--tree-b /path/to/worktree`` (``git worktree add``)
and/or ``--env-b NAME=VALUE`` for a change. CPU per request: each server process's user + system CPU (/proc) from
the load's start until its lake writer has written every row, over the requests.
Last line: ``rounds=<n> a_cpu_ms_per_request=<median> b_cpu_ms_per_request=<median> b_over_a_median=<r>
b_over_a_min=<r> b_over_a_max=<r>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve import light_load, start_server, stop  # noqa: E402

from conductor.testing.simulated_load import free_port, questions, simulated_pool  # noqa: E402


def _env(ap: argparse.ArgumentParser, flag: str, pairs: list[str]) -> dict[str, str]:
    out = {}
    for kv in pairs:
        name, sep, value = kv.partition("=")
        if not sep or not name:
            ap.error(f"{flag} {kv!r}: expected NAME=VALUE")
        out[name] = value
    return out


def one_round(tmp: Path, trees: tuple[Path, Path], envs: tuple[dict[str, str], dict[str, str]],
              requests: int, clients: int) -> tuple[float, float]:
    """CPU ms per request of A and B, both serving their load at once."""
    items, warm = questions(requests), questions(clients, offset=requests)
    pool = simulated_pool(tmp, items + warm, latency_s=0.25)
    procs, urls = [], []
    try:
        for side, tree, env in zip("ab", trees, envs):
            port = free_port()
            (tmp / side).mkdir()
            procs.append(start_server(pool, "moa:0+1:2", port, tmp / side / "lake", tree=tree, env=env))
            urls.append(f"http://127.0.0.1:{port}/v1")

        async def both() -> list[float]:
            got = await asyncio.gather(*(light_load(u, items, warm, clients, p.pid, requests + clients)
                                         for u, p in zip(urls, procs)))
            for errors, *_ in got:
                if errors:
                    raise SystemExit(f"{errors} requests failed")
            return [server_s / requests * 1000 for _, server_s, _, _ in got]

        a, b = asyncio.run(both())
        return a, b
    finally:
        for p in procs:
            stop(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tree-a", type=Path, default=ROOT, help="source tree of server A (default: this one)")
    ap.add_argument("--tree-b", type=Path, default=ROOT, help="source tree of server B (default: this one)")
    ap.add_argument("--env-a", nargs="*", default=[], help="NAME=VALUE set for server A")
    ap.add_argument("--env-b", nargs="*", default=[], help="NAME=VALUE set for server B")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=64)
    a = ap.parse_args()
    for flag, tree in (("--tree-a", a.tree_a), ("--tree-b", a.tree_b)):
        if not (tree / "conductor" / "__init__.py").is_file():
            ap.error(f"{flag} {tree}: not a conductor source tree (no conductor/__init__.py)")
    envs = (_env(ap, "--env-a", a.env_a), _env(ap, "--env-b", a.env_b))
    if a.rounds < 1 or a.requests < 1 or a.clients < 1:
        ap.error("--rounds, --requests and --clients must be at least 1")
    ab: list[tuple[float, float]] = []
    for r in range(a.rounds):
        with tempfile.TemporaryDirectory() as d:
            ab.append(one_round(Path(d), (a.tree_a, a.tree_b), envs, a.requests, a.clients))
        x, y = ab[-1]
        print(f"round {r + 1}/{a.rounds} (load {os.getloadavg()[0]:.2f}): A {x:.3f} ms, B {y:.3f} ms, B/A {y / x:.3f}",
              flush=True)
    ratios = [y / x for x, y in ab]
    print(f"A: {a.tree_a} {' '.join(a.env_a)}".rstrip())
    print(f"B: {a.tree_b} {' '.join(a.env_b)}".rstrip())
    print(f"rounds={a.rounds} a_cpu_ms_per_request={statistics.median(x for x, _ in ab):.3f} "
          f"b_cpu_ms_per_request={statistics.median(y for _, y in ab):.3f} "
          f"b_over_a_median={statistics.median(ratios):.3f} b_over_a_min={min(ratios):.3f} "
          f"b_over_a_max={max(ratios):.3f}")


if __name__ == "__main__":
    main()
