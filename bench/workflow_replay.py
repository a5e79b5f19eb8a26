"""Learning which workflow each question gets, on real model outputs: record the embedded pool's menu once, replay it.

Issue #47. The only gain measured on real models here is a workflow (reason -> python -> report beats the 1.5B
alone); this bench records a MENU of workflows over the live embedded pool once (``record``), then replays every
entry, the untrained default and a trained menu conductor from the recording in seconds (``replay``), and puts
them beside the hybrid cascade over RouteLLM's recorded GPT-4 and Mixtral replies. The machinery, the question set
and its split are in ``conductor.run.workflow_replay`` (docs/workflow-replay.md).

Stages (each resumable; ``record`` runs for hours on one core, run it in the background):

    python bench/workflow_replay.py record [--gsm8k 300] [--mmlu 100] [--cache PATH]
    python bench/workflow_replay.py replay [--cache PATH] [--iterations 40] [--out docs/figures/workflow-replay]
    python bench/workflow_replay.py progress   # the recording so far: every entry per dataset, no training

The recording lives in ``$CONDUCTOR_HOME/recordings/workflow-menu.sqlite`` (default ``~/.cache/conductor/``): it is
data, not source; ``export`` writes a gzipped snapshot that ``conductor`` reads back with ``copy_responses``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conductor.run.workflow_replay.questions import LOCAL_POOL, default_cache
from conductor.run.workflow_replay.recording import RecordSettings, record
from conductor.run.workflow_replay.replay import ReplayError, ReplaySettings, ReplaySettingsError, progress, replay


def _lambdas(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 0,0.4") from None
    if not vals or any(not 0 <= v < 10 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: each lambda must be a number in [0, 10)")
    return vals


def _shard(text: str) -> tuple[int, int]:
    """``K/N`` -> (K, N).

    >>> _shard("1/2")
    (1, 2)
    """
    k, _, n = text.partition("/")
    try:
        kn = int(k), int(n)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected K/N, e.g. 0/2") from None
    if not 0 <= kn[0] < kn[1]:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: K must be in 0..N-1")
    return kn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="stage", required=True)
    rec = sub.add_parser("record", help="record every menu entry over the question set (resumable)")
    rec.add_argument("--gsm8k", type=int, default=300, help="GSM8K test questions (RouteLLM-recorded)")
    rec.add_argument("--mmlu", type=int, default=100, help="MMLU-STEM questions")
    rec.add_argument("--limit", type=int, default=0, help="record only the first N questions of the merged order")
    rec.add_argument("--menu", default="", help="comma-separated strategy specs (default: the bench's menu)")
    rec.add_argument("--pool", default=str(LOCAL_POOL))
    rec.add_argument("--cache", default=str(default_cache()))
    rec.add_argument("--chunk", type=int, default=10, help="questions per chunk (menu, then the default conductor)")
    rec.add_argument("--runs", default="runs/workflow-replay", help="where the default conductor's answer runs go")
    rec.add_argument("--shard", type=_shard, default=(0, 1), metavar="K/N",
                     help="record every N-th question from the K-th (0-based): N processes, one core each, share "
                          "one cache (give each its own --runs)")
    rec.add_argument("--reverse", action="store_true",
                     help="take the shard from its last question (a second recorder on a shard meets the first)")
    rep = sub.add_parser("replay", help="replay every entry, train the menu conductor, the cascade; last line")
    prog = sub.add_parser("progress", help="the recording so far per dataset, no training (OUT/progress.md)")
    for p in (rep, prog):
        p.add_argument("--gsm8k", type=int, default=300)
        p.add_argument("--mmlu", type=int, default=100)
        p.add_argument("--cache", default=str(default_cache()))
        p.add_argument("--state", default="runs/workflow-replay/replay", help="resumable results and trained models")
        p.add_argument("--out", default="docs/figures/workflow-replay")
    rep.add_argument("--lambdas", type=_lambdas, default=[0.0, 0.4], help="cost lambdas; the first is the headline")
    rep.add_argument("--iterations", type=int, default=30)
    rep.add_argument("--questions-per-iteration", type=int, default=8)
    rep.add_argument("--group-size", type=int, default=8)
    rep.add_argument("--lr", type=float, default=3e-5)
    rep.add_argument("--train-temperature", type=float, default=2.0)
    rep.add_argument("--seed", type=int, default=0)
    rep.add_argument("--hybrid-lambda", type=float, default=None,
                     help="also train the hybrid GSM8K menu (local entries, Mixtral, the cascade, GPT-4) at this lambda")
    a = ap.parse_args(argv)
    if a.stage == "progress":
        return print(progress(ReplaySettings(a.gsm8k, a.mmlu, Path(a.cache), Path(a.state), Path(a.out)))) or 0
    if a.stage == "record":
        menu = tuple(a.menu.split(",")) if a.menu else RecordSettings.menu
        print(record(RecordSettings(a.gsm8k, a.mmlu, a.limit, menu, Path(a.pool), Path(a.cache), a.chunk,
                                    Path(a.runs), a.shard, a.reverse)).line(), flush=True)
        return 0
    try:
        s = ReplaySettings(a.gsm8k, a.mmlu, Path(a.cache), Path(a.state), Path(a.out), tuple(a.lambdas), a.iterations,
                           a.questions_per_iteration, a.group_size, a.lr, a.train_temperature, a.seed, a.hybrid_lambda)
    except ReplaySettingsError as e:
        ap.error(str(e))
    try:
        result = replay(s)
    except ReplayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(result.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
