"""The explorer's screenshots in docs/figures/lake_view/, taken from a real lake with a real browser: Debian's
Chromium (/usr/bin/chromium) driven by Playwright for Python (the dev extra; `playwright install` is never run)
against `conductor lake view` started by the real CLI on 127.0.0.1, as tests/test_lake_view_browser.py does.

    python docs/figures/lake_view/screenshots.py --lake runs/quickstart/lake \\
        --trajectory trajectory=<id> --trajectory trajectory-wrong=<id> --compare <run A> <run B>

Each page is saved as ``NAME.png``, ``--width`` pixels wide, the top ``--max-height`` pixels of the whole page, in
a 256-colour palette: ``runs``, ``trajectories`` (filtered by ``--filters``), ``run`` (the first run's report), one
per ``--trajectory NAME=ID``, and ``compare`` when ``--compare`` names two runs. ``--list`` prints the lake's runs
and trajectories (id, run, dataset, correct, steps, question) to choose from, and takes no pictures.

Last line: ``screenshots=<n> out=<dir> bytes=<total>``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def viewer(lakes: list[str]) -> Iterator[str]:
    """`conductor lake view --lake L... --port 0`, its URL read from its first line."""
    cmd = [sys.executable, "-m", "conductor", "lake", "view", "--port", "0"]
    for lake in lakes:
        cmd += ["--lake", lake]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
        if not match:
            err = proc.stderr.read() if proc.stderr else ""
            sys.exit(f"error: the viewer printed no URL ({line.strip()!r}): {err.strip()}")
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def list_lake(url: str) -> None:
    for run in httpx.get(url + "/api/runs", timeout=60).json()["runs"]:
        print("run", run)
    for row in httpx.get(url + "/api/trajectories", params={"limit": 1000}, timeout=60).json()["rows"]:
        print(row.get("trajectory_id"), row.get("run_id"), row.get("dataset"), row.get("correct"),
              row.get("n_steps"), str(row.get("question", ""))[:70].replace("\n", " "))


def shoot(page: Any, url: str, path: Path, width: int, max_height: int) -> None:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    height = min(max_height, int(page.evaluate("Math.ceil(document.body.getBoundingClientRect().height)")) + 16)
    page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": width, "height": height}, full_page=True)
    with Image.open(path) as img:   # a 256-colour palette: a third of the bytes, text as sharp
        small = img.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)
    print(f"{path}: {url} ({width}x{height}, {path.stat().st_size} bytes)", flush=True)


def pages(args: argparse.Namespace, url: str) -> list[tuple[str, str]]:
    runs = httpx.get(url + "/api/runs", timeout=60).json()["runs"]
    out = [("runs", "/runs"), ("trajectories", "/trajectories" + (f"?{args.filters}" if args.filters else ""))]
    if runs:
        out.append(("run", f"/run/{runs[0]['run_id']}"))
    for spec in args.trajectory:
        name, _, tid = spec.partition("=")
        if not tid:
            sys.exit(f"error: --trajectory {spec!r}: expected NAME=ID")
        out.append((name, f"/t/{tid}"))
    if args.compare:
        a, b = args.compare
        out.append(("compare", f"/compare?a={a}&b={b}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lake", action="append", required=True, help="a lake directory (repeatable)")
    ap.add_argument("--out", default="docs/figures/lake_view", help="where the PNGs go")
    ap.add_argument("--trajectory", action="append", default=[], metavar="NAME=ID", help="a trajectory page")
    ap.add_argument("--filters", default="", help="the trajectory table's query string, e.g. dataset=gsm8k_test")
    ap.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="the compare page of two runs")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--max-height", type=int, default=1800)
    ap.add_argument("--list", action="store_true", help="print runs and trajectories to choose from")
    args = ap.parse_args()
    with viewer(args.lake) as url:
        if args.list:
            list_lake(url)
            return
        from playwright.sync_api import sync_playwright

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        shots = pages(args, url)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            for name, path in shots:
                shoot(page, url + path, out / f"{name}.png", args.width, args.max_height)
            browser.close()
        total = sum((out / f"{name}.png").stat().st_size for name, _ in shots)
        print(f"screenshots={len(shots)} out={out} bytes={total}")


if __name__ == "__main__":
    main()
