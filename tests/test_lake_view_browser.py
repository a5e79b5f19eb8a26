"""`conductor lake view` in a real headless browser: Debian's Chromium (/usr/bin/chromium) driven by Playwright
for Python against the viewer started by the real CLI on 127.0.0.1. Each page opens, a filter is applied through
the form, a trajectory is opened from the table and its drawn graph is counted, a comparison is chosen from the
drop-downs, a training point is clicked through to its rollouts.

Needs `chromium` (infra/install.sh installs it for the dev profile; infra/test.sh checks) and the `playwright`
package (the dev extra); Playwright's own browser download is never used. With ``LAKE_VIEW_SCREENSHOTS=DIR``
each page of the synthetic demo lake is also saved there as PNG, to look at; the committed screenshots in
docs/figures/lake_view/ are of a real run's lake, taken by docs/figures/lake_view/screenshots.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conductor.lake.synthetic import build_demo_lake

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

playwright_api = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists() and os.environ.get("CONDUCTOR_REQUIRE_BROWSER") == "1":   # CI: .ci/run sets it
    pytest.fail(f"{CHROMIUM} is not installed, and CONDUCTOR_REQUIRE_BROWSER=1 asks for the browser tests",
                pytrace=False)
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium; infra/install.sh does it)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The viewer as a user starts it: `conductor lake view --lake L --port 0`, its URL read from its first line."""
    root = str(tmp_path_factory.mktemp("browser") / "lake")
    build_demo_lake(root, rows_per_run=160)
    proc = subprocess.Popen([sys.executable, "-m", "conductor", "lake", "view", "--lake", root, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
        assert match, f"no URL in {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    profile = tmp_path_factory.mktemp("chromium-profile")     # a fresh user-data-dir every run
    with playwright_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, args=ARGS, headless=True,
                                                   viewport={"width": 1400, "height": 900})
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    pg = browser.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield pg
    pg.close()
    assert not errors, errors


def shot(page: Any, name: str) -> None:
    out = os.environ.get("LAKE_VIEW_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(out) / f"{name}.png"))


def test_every_page_opens_from_the_navigation(server: str, page: Any) -> None:
    page.goto(server + "/")
    assert page.url.endswith("/runs") and page.locator("tr.run-row").count() == 5
    shot(page, "runs")
    for nav, heading in (("#nav-trajectories", "Trajectories"), ("#nav-compare", "Compare two runs"),
                         ("#nav-training", "Training"), ("#nav-runs", "Runs")):
        page.click(nav)
        page.wait_for_load_state("networkidle")
        assert page.locator("h1").inner_text().startswith(heading)
    page.click("a.report >> nth=0")
    assert page.locator("h1").inner_text().startswith("Run ") and page.locator("table.grid").count() == 3


def test_filter_then_open_a_trajectory_and_count_its_graph(server: str, page: Any) -> None:
    page.goto(server + "/trajectories")
    page.select_option("#f-dataset", "gsm8k")
    page.select_option("#f-correct", "false")
    page.fill("#f-steps_min", "2")
    page.click("#apply")
    page.wait_for_load_state("networkidle")
    assert "dataset=gsm8k" in page.url and "correct=false" in page.url
    want = httpx.get(server + "/api/count?dataset=gsm8k&correct=false&steps_min=2").json()["count"]
    page.wait_for_selector("#count[data-count]")
    assert page.locator("#count").get_attribute("data-count") == str(want) and want > 0
    rows = page.locator("tr.traj-row")
    assert rows.count() == min(want, 50)
    for i in range(rows.count()):
        cells = rows.nth(i).locator("td")
        assert cells.nth(2).inner_text() == "gsm8k" and cells.nth(6).inner_text() == "wrong"
        assert int(cells.nth(8).inner_text()) >= 2
    shot(page, "trajectories")
    rows.nth(0).locator("td.question a").click()
    page.wait_for_load_state("networkidle")
    tid = page.url.split("/t/", 1)[1].split("?", 1)[0]
    graph = httpx.get(f"{server}/api/trajectory/{tid}").json()["graph"]
    assert graph["nodes"] >= 2
    assert page.locator("svg.workflow g.node").count() == graph["nodes"]
    assert page.locator("svg.workflow path.edge").count() == graph["edges"]
    assert page.locator("svg.workflow g.round").count() == graph["rounds"]
    assert page.locator("svg.workflow g.node").nth(0).is_visible()
    page.locator("svg.workflow g.node").nth(1).click()          # a node links to its step's details
    assert page.url.endswith("#step-0-1") and page.locator("#step-0-1").is_visible()
    assert page.locator("#step-0-1 .reply pre").inner_text().strip()
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "trajectory")


def test_a_recursion_round_is_drawn_as_its_own_nested_group(server: str, page: Any) -> None:
    rows = httpx.get(server + "/api/trajectories?limit=1000").json()["rows"]
    for r in rows:
        detail = httpx.get(f"{server}/api/trajectory/{r['trajectory_id']}").json()
        if detail["graph"]["rounds"] > 1:
            break
    else:
        pytest.fail("the demo lake should hold a trajectory with a recursion round")
    page.goto(f"{server}/t/{r['trajectory_id']}?run={r['run_id']}")
    assert page.locator("svg.workflow g.round").count() == detail["graph"]["rounds"]
    assert page.locator('svg.workflow g.round[data-depth="1"] g.node').count() == 2
    assert page.locator("svg.workflow g.node").count() == detail["graph"]["nodes"]


def test_compare_finds_what_the_new_checkpoint_got_wrong(server: str, page: Any) -> None:
    page.goto(server + "/compare")
    page.select_option("#f-a", "eval-ckpt-0002")
    page.select_option("#f-b", "eval-ckpt-0003")
    page.select_option("#f-show", "regressions")
    page.click("#compare")
    page.wait_for_load_state("networkidle")
    rows = page.locator("tr.cmp-row")
    assert rows.count() > 0 and rows.count() == page.locator("tr.regression").count()
    shot(page, "compare")
    rows.nth(0).locator("td").nth(2).locator("a").click()       # A's samples of that question
    page.wait_for_load_state("networkidle")
    assert "run=eval-ckpt-0002" in page.url and page.locator("tr.traj-row").count() > 0


def test_a_training_point_opens_the_rollouts_behind_it(server: str, page: Any) -> None:
    page.goto(server + "/training")
    assert page.locator('svg.chart[data-key="reward_mean"] circle.point').count() == 3
    assert page.locator('svg.chart[data-key="kl_ref"] circle.point').count() == 3
    shot(page, "training")
    page.locator('svg.chart[data-key="reward_mean"] circle.point').nth(1).click()
    page.wait_for_load_state("networkidle")
    assert "run=grpo-it01" in page.url
    runs = {c.inner_text() for c in page.locator("tr.traj-row td:first-child").all()}
    assert runs == {"grpo-it01"}


def test_chromium_is_the_system_one() -> None:
    assert shutil.which("chromium") == CHROMIUM or Path(CHROMIUM).exists()
