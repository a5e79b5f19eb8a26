"""A workflow drawn as SVG on the server: steps as nodes, access lists as edges, recursion rounds as nested groups.

WHY server-rendered SVG and not a JavaScript graph library: a conductor's workflow is a small DAG whose layout
is fixed by the workflow itself (steps run in order, a step sees only earlier ones), so placing node ``i`` at
column ``i`` and drawing each access as an arc from the step seen to the step seeing is the whole layout; there
is nothing for a force or layered layout engine to decide. The page then needs no script to show it, the same
markup is what the tests count, and nothing has to be vendored.

Each round is a ``<g class="round">`` frame (the root at the top, recursion rounds below it, indented by depth),
each step a ``<g class="node">`` linking to its details on the page (``#step-<depth>-<step>``), each access an
``<path class="edge">`` (dashed when the workflow said ``"all"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

NODE_W, NODE_H, GAP_X, PAD, ROUND_GAP, ARC = 150, 54, 46, 16, 26, 26


@dataclass(frozen=True)
class Step:
    index: int
    worker: str
    subtask: str
    access: tuple[int, ...]     # resolved: the earlier steps it saw
    access_all: bool


@dataclass(frozen=True)
class RoundView:
    depth: int
    steps: tuple[Step, ...]
    parse_status: str = "ok"
    kept_previous: bool = False


@dataclass
class Drawing:
    svg: str
    nodes: int
    edges: int
    rounds: int
    width: int = 0
    height: int = 0
    notes: list[str] = field(default_factory=list)


def round_view(depth: int, steps: Sequence[dict[str, Any]], subpool: Sequence[str], parse_status: str = "ok",
               kept_previous: bool = False) -> RoundView:
    """A round from lake step structs (``worker`` ordinal into ``subpool``, ``access`` / ``access_all``).

    >>> r = round_view(0, [{"worker": 1, "subtask": "a", "access": [], "access_all": False},
    ...                    {"worker": 0, "subtask": "b", "access": [], "access_all": True}], ["x", "y"])
    >>> [(s.worker, s.access) for s in r.steps]
    [('y', ()), ('x', (0,))]
    """
    out = []
    for i, s in enumerate(steps):
        w = s.get("worker")
        name = subpool[w] if isinstance(w, int) and 0 <= w < len(subpool) else f"Model {w}"
        access = tuple(range(i)) if s.get("access_all") else tuple(a for a in (s.get("access") or []) if 0 <= a < i)
        out.append(Step(i, name, str(s.get("subtask") or ""), access, bool(s.get("access_all"))))
    return RoundView(depth, tuple(out), parse_status, kept_previous)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _round_svg(r: RoundView, x0: int, y0: int) -> tuple[list[str], int, int, int, int]:
    """Markup of one round framed at (x0, y0): (parts, width, height, nodes, edges)."""
    n = len(r.steps)
    width = max(1, n) * (NODE_W + GAP_X) - GAP_X + 2 * PAD
    span = max((s.index - a for s in r.steps for a in s.access), default=0)
    top = 22 + (ARC + 12 * span if span else 4)
    height = top + NODE_H + PAD
    label = f"round {r.depth}" + (" (root)" if r.depth == 0 else "") + \
        ("" if r.parse_status == "ok" else f": {r.parse_status}") + (" - kept previous answer" if r.kept_previous else "")
    parts = [f'<g class="round" data-depth="{r.depth}" transform="translate({x0},{y0})">',
             f'<rect class="round-frame" x="0" y="0" width="{width}" height="{height}" rx="8"/>',
             f'<text class="round-label" x="{PAD}" y="16">{escape(label)}</text>']
    edges = 0
    for s in r.steps:
        for a in s.access:
            # spread the ends over the box tops, so arcs from or to one step stay apart
            xa = PAD + a * (NODE_W + GAP_X) + NODE_W // 2 + min(s.index - a, 6) * 8
            xb = PAD + s.index * (NODE_W + GAP_X) + NODE_W // 2 - min(s.index - a, 6) * 8
            lift = ARC + 12 * (s.index - a)
            dash = ' stroke-dasharray="5 3"' if s.access_all else ""
            parts.append(f'<path class="edge" data-from="{a}" data-to="{s.index}"{dash} '
                         f'd="M{xa},{top} C{xa},{top - lift} {xb},{top - lift} {xb},{top - 2}" '
                         f'marker-end="url(#arrow)"><title>step {s.index} sees step {a}</title></path>')
            edges += 1
    for s in r.steps:
        x = PAD + s.index * (NODE_W + GAP_X)
        parts.append(f'<a href="#step-{r.depth}-{s.index}"><g class="node" data-step="{s.index}" '
                     f'transform="translate({x},{top})">'
                     f'<rect width="{NODE_W}" height="{NODE_H}" rx="6"/>'
                     f'<text x="8" y="18" class="node-title">{escape(f"{s.index}: {_clip(s.worker, 17)}")}</text>'
                     f'<text x="8" y="38" class="node-sub">{escape(_clip(s.subtask, 22))}</text>'
                     f'<title>{escape(s.worker)}: {escape(_clip(s.subtask, 300))}</title></g></a>')
    if not r.steps:
        parts.append(f'<text class="empty" x="{PAD}" y="{top + 24}">no workflow</text>')
    parts.append("</g>")
    return parts, width, height, len(r.steps), edges


def draw(rounds: Sequence[RoundView]) -> Drawing:
    """All rounds, stacked: recursion rounds nested under the root, indented by depth.

    >>> d = draw([round_view(0, [{"worker": 0, "subtask": "s", "access": [], "access_all": False},
    ...                          {"worker": 0, "subtask": "t", "access": [0], "access_all": False}], ["w"])])
    >>> d.nodes, d.edges, d.rounds, d.svg.count('class="node"'), d.svg.count('class="edge"')
    (2, 1, 1, 2, 1)
    """
    body: list[str] = []
    y, width, nodes, edges = 0, 0, 0, 0
    for r in sorted(rounds, key=lambda r: r.depth):
        x = r.depth * 28
        parts, w, h, n, e = _round_svg(r, x, y)
        body += parts
        y += h + ROUND_GAP
        width, nodes, edges = max(width, x + w), nodes + n, edges + e
    height = max(y - ROUND_GAP, 40)
    width = max(width, 200)
    head = (f'<svg class="workflow" xmlns="http://www.w3.org/2000/svg" width="{width + 2}" height="{height + 2}" '
            f'viewBox="-1 -1 {width + 2} {height + 2}" role="img" aria-label="workflow graph" '
            f'data-nodes="{nodes}" data-edges="{edges}">'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="8" refY="5" markerWidth="7" markerHeight="7" '
            'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>')
    return Drawing(head + "".join(body) + "</svg>", nodes, edges, len(rounds), width, height)
