"""The viewer's web app: Starlette routes rendering Jinja2 templates, plus a small JSON API.

WHY Starlette with server-rendered templates: every page is a query's result shown as a table or an SVG, so
the server renders it and the browser only displays it (no build step, no client framework, nothing fetched
from a CDN: the one stylesheet and the one small script ship in this package). Starlette and Jinja2 are
already in the lock (FastAPI and Prefect depend on them); FastAPI's request models would add nothing to
pages that take a handful of query-string values, parsed in ``filters.py``.

Loopback only: the CLI binds 127.0.0.1, and ``TrustedHostMiddleware`` refuses requests whose ``Host`` is not
a loopback name (a web page elsewhere cannot reach the viewer through DNS rebinding).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from conductor.lake.view.data import LakeData, run_report
from conductor.lake.view.filters import FilterError, TrajectoryFilter
from conductor.lake.view.graph import RoundView, draw, round_view
from conductor.lake.view.training import charts

HERE = Path(__file__).resolve().parent
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
PAGE_SIZE = 50
MAX_INT = 10**12          # an offset or limit past this is a typo (DuckDB's OFFSET would overflow further on)


def _pct(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * float(v):.1f}%"


def _usd(v: Any) -> str:
    return "" if v is None else f"${float(v):,.4f}"


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:,}" if isinstance(v, int) else f"{float(v):,.{digits}f}"


def _templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(HERE / "templates"))
    t.env.filters.update(pct=_pct, usd=_usd, num=_num, qs=lambda d: urlencode(d))
    return t


def _int(request: Request, name: str, default: int = 0) -> int:
    raw = request.query_params.get(name, "")
    try:
        value = max(0, int(raw)) if raw else default
    except ValueError:
        raise FilterError(f"{name}: {raw[:40]!r} is not a whole number") from None
    if value > MAX_INT:
        raise FilterError(f"{name}: {raw[:40]} is past the largest value, {MAX_INT:,}")
    return value


def _local_path(referer: str | None) -> str:
    """Where ``POST /reload`` sends the browser back: the referring page's path on this viewer, never another
    site (an open redirect).

    >>> _local_path("http://127.0.0.1:8765/trajectories?run=r1"), _local_path("https://evil.example/x")
    ('/trajectories?run=r1', '/runs')
    >>> _local_path("//evil.example/x"), _local_path(None)
    ('/runs', '/runs')
    """
    from urllib.parse import urlsplit

    if not referer:
        return "/runs"
    parts = urlsplit(referer)
    host = (parts.hostname or "").lower()
    if host not in ("127.0.0.1", "localhost", "::1") or not parts.path.startswith("/") or parts.path.startswith("//"):
        return "/runs"
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _lake(request: Request) -> int | None:
    raw = request.query_params.get("lake", "")
    return _int(request, "lake") if raw else None


def rounds_of(row: dict[str, Any]) -> list[RoundView]:
    """The trajectory's rounds (root and recursion) as the graph draws them."""
    subpool = list(row.get("subpool") or [])
    out = []
    if row.get("prompt") is not None or row.get("steps"):
        out.append(round_view(0, row.get("steps") or [], subpool, row.get("parse_status") or "not_run"))
    for r in row.get("recursion_rounds") or []:
        out.append(round_view(int(r["depth"]), r.get("steps") or [], subpool, r.get("parse_status") or "not_run",
                              bool(r.get("kept_previous"))))
    return out


class Views:
    """The viewer's pages and JSON endpoints over one ``LakeData`` (each handler a method; ``create_app`` routes)."""

    def __init__(self, data: LakeData, templates: Jinja2Templates, warm: bool):
        self.data, self.templates, self.warm = data, templates, warm

    def page(self, request: Request, name: str, **context: Any) -> Response:
        return self.templates.TemplateResponse(request, name, {"roots": self.data.roots, **context})

    def fail(self, request: Request, message: str, status: int = 400) -> Response:
        return self.page(request, "error.html", message=message, status=status) if "html" in \
            request.headers.get("accept", "html") else JSONResponse({"error": message}, status_code=status)

    async def home(self, request: Request) -> Response:
        return RedirectResponse("/runs")

    def runs(self, request: Request) -> Response:
        return self.page(request, "runs.html", runs=self.data.runs())

    def run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        lake = _lake(request)
        meta = [r for r in self.data.runs() if r["run_id"] == run_id and (lake is None or r["lake"] == lake)]
        if not meta:
            return self.fail(request, f"no run {run_id!r} in the lake", 404)
        return self.page(request, "run.html", run=meta[0], report=run_report(self.data, run_id, lake))

    def trajectories(self, request: Request) -> Response:
        try:
            flt = TrajectoryFilter.from_params(request.query_params)
            offset = _int(request, "offset")
        except FilterError as e:
            return self.fail(request, str(e))
        result = self.data.trajectories(flt, offset, PAGE_SIZE)
        total = None if flt.active else self.data.count(flt)
        return self.page(request, "trajectories.html", page=result, flt=flt, options=self.data.options(),
                         total=total, params=flt.params(),
                         prev_params=flt.params(offset=max(0, offset - PAGE_SIZE) or None),
                         next_params=flt.params(offset=offset + PAGE_SIZE))

    def trajectory(self, request: Request) -> Response:
        tid = request.path_params["trajectory_id"]
        try:
            lake = _lake(request)
        except FilterError as e:
            return self.fail(request, str(e))
        row = self.data.trajectory(tid, request.query_params.get("run", ""), lake,
                                   request.query_params.get("shard", ""))
        if row is None:
            return self.fail(request, f"no trajectory {tid!r}", 404)
        calls = self.data.calls(row)
        drawing = draw(rounds_of(row))
        by_call = {c["call_id"]: c for c in calls}
        return self.page(request, "trajectory.html", t=row, drawing=drawing, rounds=rounds_of(row),
                         calls=by_call, all_calls=calls)

    def compare(self, request: Request) -> Response:
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        show = request.query_params.get("show", "differ")
        if show not in ("differ", "regressions", "improvements", "all"):
            return self.fail(request, f"show: {show!r} is not one of differ, regressions, improvements, all")
        runs_list = self.data.runs()
        if not (a and b):
            return self.page(request, "compare.html", runs=runs_list, a=a, b=b, show=show, page=None, summary=None)
        try:
            offset = _int(request, "offset")
        except FilterError as e:
            return self.fail(request, str(e))
        result, summary = self.data.compare(a, b, show, offset, PAGE_SIZE)
        base = {"a": a, "b": b, "show": show}
        return self.page(request, "compare.html", runs=runs_list, a=a, b=b, show=show, page=result,
                         summary=summary, prev_params={**base, "offset": max(0, offset - PAGE_SIZE)},
                         next_params={**base, "offset": offset + PAGE_SIZE})

    def training(self, request: Request) -> Response:
        rows = self.data.training()
        return self.page(request, "training.html", rows=rows, charts=charts(rows))

    def api_count(self, request: Request) -> Response:
        try:
            flt = TrajectoryFilter.from_params(request.query_params)
        except FilterError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse({"count": self.data.count(flt)})

    def api_trajectories(self, request: Request) -> Response:
        try:
            flt = TrajectoryFilter.from_params(request.query_params)
            offset = _int(request, "offset")
            limit = min(_int(request, "limit", PAGE_SIZE), 1000)
        except FilterError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        result = self.data.trajectories(flt, offset, limit)
        return JSONResponse({"offset": result.offset, "limit": result.limit, "more": result.more,
                             "rows": [_jsonable(r) for r in result.rows]})

    def api_trajectory(self, request: Request) -> Response:
        tid = request.path_params["trajectory_id"]
        row = self.data.trajectory(tid, request.query_params.get("run", ""))
        if row is None:
            return JSONResponse({"error": f"no trajectory {tid!r}"}, status_code=404)
        d = draw(rounds_of(row))
        calls = self.data.calls(row)
        return JSONResponse({"trajectory": _jsonable(row), "calls": [_jsonable(c) for c in calls],
                             "graph": {"nodes": d.nodes, "edges": d.edges, "rounds": d.rounds}})

    def api_runs(self, request: Request) -> Response:
        return JSONResponse({"runs": [_jsonable(r) for r in self.data.runs()]})

    def reload(self, request: Request) -> Response:
        self.data.reload()
        if self.warm:
            self.data.warm()
        return RedirectResponse(_local_path(request.headers.get("referer")), status_code=303)


def create_app(roots: list[str], *, allowed_hosts: list[str] | None = None, threads: int = 2,
               warm: bool = True) -> Starlette:
    """The viewer over ``roots`` (lake paths or s3:// URLs), read through one DuckDB session; ``warm`` reads the
    footers and the filter values before the first request (``LakeData.warm``)."""
    data = LakeData(list(roots), threads=threads)
    templates = _templates()
    if warm:
        data.warm()
        for name in templates.env.list_templates():   # compiled once now, not on a user's first visit
            templates.get_template(name)

    v = Views(data, templates, warm)
    routes = [Route("/", v.home), Route("/runs", v.runs), Route("/run/{run_id:path}", v.run),
              Route("/trajectories", v.trajectories), Route("/t/{trajectory_id}", v.trajectory),
              Route("/compare", v.compare), Route("/training", v.training),
              Route("/reload", v.reload, methods=["POST"]),
              Route("/api/count", v.api_count), Route("/api/trajectories", v.api_trajectories),
              Route("/api/trajectory/{trajectory_id}", v.api_trajectory), Route("/api/runs", v.api_runs),
              Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")]
    hosts = allowed_hosts if allowed_hosts is not None else LOOPBACK_HOSTS
    app = Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)])
    app.state.data = data
    return app


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """A DuckDB row for JSON: NaN as null, everything else as DuckDB returned it (dates and decimals as text)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        elif v is not None and not isinstance(v, (str, int, float, bool, list, dict)):
            v = str(v)
        out[k] = v
    return out
