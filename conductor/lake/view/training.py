"""The training page's charts as server-rendered SVG: one point per GRPO iteration (rollout run), each point a
link to the rollouts behind it (the trajectory table filtered to that run).

Reward, parse rate and accuracy come from the rollout rows themselves, so every lake has them; KL and entropy
come from the update's record (``<lake>/training/run_id=<run>.json``, written by
``conductor.learning.grpo.usage.record_update``) and are drawn where one exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 420, 170, 46, 26, 22, 12
SERIES = (("reward_mean", "reward (mean)"), ("parse_rate", "parse rate"), ("accuracy", "accuracy"),
          ("kl_ref", "KL to the reference"), ("entropy", "entropy"))
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    svg: str
    points: int


def rollouts_link(row: dict[str, Any]) -> str:
    """The trajectory table filtered to one iteration's rollouts.

    >>> rollouts_link({"run_id": "grpo-it01", "lake": 0})
    '/trajectories?run=grpo-it01&lake=0'
    """
    return "/trajectories?" + urlencode({"run": row["run_id"], "lake": row["lake"]})


def _x(i: int, n: int) -> float:
    inner = 16   # keep the end points off the axis and its labels
    return PAD_L + inner + (W - PAD_L - PAD_R - 2 * inner) * (i / max(n - 1, 1) if n > 1 else 0.5)


def line_chart(key: str, title: str, rows: Sequence[dict[str, Any]]) -> Chart:
    """One metric against the iteration; missing values leave gaps (no point, no line through them).

    >>> c = line_chart("reward_mean", "reward", [{"run_id": "a", "lake": 0, "reward_mean": 0.5},
    ...                                          {"run_id": "b", "lake": 0, "reward_mean": None}])
    >>> c.points, c.svg.count('class="point"')
    (1, 1)
    """
    vals = [r.get(key) for r in rows]
    finite = [float(v) for v in vals if isinstance(v, (int, float)) and v == v]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    n = len(rows)

    def y(v: float) -> float:
        return PAD_T + (H - PAD_T - PAD_B) * (1 - (v - lo) / (hi - lo))

    parts = [f'<svg class="chart" data-key="{key}" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(title)}">',
             f'<text class="chart-title" x="{PAD_L}" y="14">{escape(title)}</text>',
             f'<line class="axis" x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}"/>',
             f'<line class="axis" x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}"/>',
             f'<text class="tick" x="{PAD_L - 4}" y="{PAD_T + 4}" text-anchor="end">{hi:.3g}</text>',
             f'<text class="tick" x="{PAD_L - 4}" y="{H - PAD_B}" text-anchor="end">{lo:.3g}</text>']
    segment: list[str] = []
    points = 0
    for i, v in enumerate(vals):
        if not (isinstance(v, (int, float)) and v == v):
            if len(segment) > 1:
                parts.append(f'<polyline class="line" points="{" ".join(segment)}"/>')
            segment = []
            continue
        segment.append(f"{_x(i, n):.1f},{y(float(v)):.1f}")
    if len(segment) > 1:
        parts.append(f'<polyline class="line" points="{" ".join(segment)}"/>')
    for i, (r, v) in enumerate(zip(rows, vals)):
        label = _label(r)
        parts.append(f'<text class="tick" x="{_x(i, n):.1f}" y="{H - 8}" text-anchor="middle">{escape(label)}</text>')
        if isinstance(v, (int, float)) and v == v:
            points += 1
            parts.append(f'<a href="{escape(rollouts_link(r))}"><circle class="point" data-run="{escape(r["run_id"])}" '
                         f'cx="{_x(i, n):.1f}" cy="{y(float(v)):.1f}" r="5"><title>{escape(r["run_id"])}: '
                         f'{key} = {float(v):.4g} (click: its rollouts)</title></circle></a>')
    parts.append("</svg>")
    return Chart(key, title, "".join(parts), points)


def _label(r: dict[str, Any]) -> str:
    v = r.get("policy_version")
    return f"v{v}" if v is not None else str(r["run_id"])[-6:]


def shares_chart(rows: Sequence[dict[str, Any]]) -> Chart:
    """Each iteration's worker shares (root-workflow calls) as a stacked bar linking to its rollouts."""
    workers = sorted({w for r in rows for w in r.get("worker_share", {})})
    n = len(rows)
    bar = max(8.0, (W - PAD_L - PAD_R) / max(n, 1) * 0.7)
    parts = [f'<svg class="chart" data-key="worker_share" xmlns="http://www.w3.org/2000/svg" width="{W}" '
             f'height="{H + 16 * ((len(workers) + 2) // 3)}" role="img" aria-label="worker shares">',
             f'<text class="chart-title" x="{PAD_L}" y="14">worker shares (root-workflow calls)</text>']
    for i, r in enumerate(rows):
        x = PAD_L + (W - PAD_L - PAD_R) * (i + 0.5) / max(n, 1) - bar / 2
        top = float(H - PAD_B)
        parts.append(f'<a href="{escape(rollouts_link(r))}"><g class="bar" data-run="{escape(r["run_id"])}">')
        for j, w in enumerate(workers):
            share = float(r.get("worker_share", {}).get(w, 0.0))
            h = share * (H - PAD_T - PAD_B)
            top -= h
            parts.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(r["run_id"])}: {escape(w)} '
                         f'{100 * share:.1f}%</title></rect>')
        parts.append("</g></a>")
        parts.append(f'<text class="tick" x="{x + bar / 2:.1f}" y="{H - 8}" text-anchor="middle">'
                     f'{escape(_label(r))}</text>')
    for j, w in enumerate(workers):
        lx, ly = PAD_L + (j % 3) * 125, H + 8 + 16 * (j // 3)
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>'
                     f'<text class="tick" x="{lx + 14}" y="{ly}">{escape(w)}</text>')
    parts.append("</svg>")
    return Chart("worker_share", "worker shares", "".join(parts), n)


def charts(rows: Sequence[dict[str, Any]]) -> list[Chart]:
    """Every chart the training page shows, KL and entropy only when some update recorded them."""
    out = [line_chart(k, t, rows) for k, t in SERIES]
    out = [c for c in out if c.points or c.key in ("reward_mean", "parse_rate")]
    return out + [shares_chart(rows)]
