"""Learning which workflow each question gets, on real model outputs: record the embedded pool's menu once, replay it.

Issue #47. The only gain measured on real models here is a workflow (reason -> python -> report beats the 1.5B
alone); this bench records a MENU of workflows over the live embedded pool once (``record``), then replays every
entry, the untrained default and a trained menu conductor from the recording in seconds (``replay``), and puts
them beside the hybrid cascade over RouteLLM's recorded GPT-4 and Mixtral replies.

Stages (each resumable; ``record`` runs for hours on one core, run it in the background):

    python bench/workflow_replay.py record [--gsm8k 300] [--mmlu 100] [--cache PATH]
    python bench/workflow_replay.py replay [--cache PATH] [--iterations 40] [--out docs/figures/workflow-replay]

The question set: GSM8K test questions that RouteLLM also recorded and MMLU-STEM questions, each dataset in a
fixed content-hash order (a larger count keeps the smaller one's questions), recorded in one merged hash order
(so a partial recording is an unbiased sample of the full set), split by content hash 50/20/30 into train,
validation and test (``conductor.learning.routing.split_of``, seed 0).

The recording lives in ``$CONDUCTOR_HOME/recordings/workflow-menu.sqlite`` (default ``~/.cache/conductor/``): it is
data, not source; ``export`` writes a gzipped snapshot that ``conductor`` reads back with ``copy_responses``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conductor.data.questions import Question

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conductor.run.record import RecordProgress  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCAL_POOL = ROOT / "data" / "pools" / "local.yaml"
# The menu over the embedded pool (0 = Qwen2.5-Coder-1.5B, 1 = Qwen2.5-Coder-0.5B, 2 = SmolLM2-135M, 3 = python):
MENU = (
    "fixed:0",                    # the 1.5B answers alone (chain of thought)
    "pot:0",                      # the 1.5B writes a program, python runs it (program of thought)
    "chain:0:1",                  # the untrained default's calculation pattern: reason + program, run, report
    "moa:0:0",                    # answer -> review (the 1.5B reviews its own answer)
    "vote:0+pot-0+chain-0-1",     # a vote of three kinds of answers (no new calls)
    "cascade:0+pot-0:0",          # CoT and PoT agree -> accept, else the 1.5B decides seeing both
    "fixed:1",                    # the 0.5B alone (cheap)
)
SPLIT = (0.5, 0.2)   # train, validation; the rest is test
DEFAULT_CONDUCTOR = "embedded"   # the untrained informed default, named explicitly (no registry champion)


def default_cache() -> Path:
    home = os.environ.get("CONDUCTOR_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "conductor"
    return base / "recordings" / "workflow-menu.sqlite"


def _order(q: Question) -> str:
    from conductor.data.questions import normalize_question

    return hashlib.sha256(f"workflow-replay\x1f{normalize_question(q.prompt)}".encode()).hexdigest()


def question_set(n_gsm8k: int, n_mmlu: int) -> list[Question]:
    """The first ``n_gsm8k`` RouteLLM-recorded GSM8K test questions and ``n_mmlu`` MMLU-STEM questions in
    content-hash order, merged in that order."""
    from conductor.data.datasets import load_dataset
    from conductor.workers.recordings import load_recordings

    gpt4 = load_recordings("routellm-gsm8k:", "gpt-4-1106-preview")
    gsm = sorted((q for q in load_dataset("gsm8k_test") if gpt4.find(q.prompt) is not None), key=_order)[:n_gsm8k]
    mmlu = sorted(load_dataset("mmlu_stem"), key=_order)[:n_mmlu]
    return sorted(gsm + mmlu, key=_order)


def split(q: Question) -> str:
    from conductor.learning.routing import split_of

    return split_of(q.prompt, 0, *SPLIT)


def slice_spec(questions: Sequence[Question]) -> str:
    """A question-set spec that loads exactly these questions, in order (``conductor answer`` reads it)."""
    index: dict[str, dict[str, int]] = {}
    parts = []
    for q in questions:
        name = q.dataset                 # the loaders name their questions' dataset after themselves
        if name not in index:
            from conductor.data.datasets import load_dataset

            index[name] = {x.id: i for i, x in enumerate(load_dataset(name))}
        i = index[name][q.id]
        parts.append(f"{name}[{i}:{i + 1}]")
    return ",".join(parts)


def record_default(questions: Sequence[Question], cache: Path, out: Path) -> int:
    """The untrained default conductor over ``questions`` through ``conductor answer`` (exactly as a user runs it),
    into the same cache: its generations and any call no menu entry made are recorded; the rest are hits."""
    cmd = [sys.executable, "-m", "conductor", "answer", slice_spec(questions), "--conductor", DEFAULT_CONDUCTOR,
           "--cache", str(cache), "--out", str(out), "--replace"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode not in (0, 4):
        print(f"  default conductor: exit {done.returncode}: {done.stdout.strip().splitlines()[-1:]}", flush=True)
    return done.returncode


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


def cmd_record(a: argparse.Namespace) -> int:
    from conductor.execution.cache import ResponseCache
    from conductor.local.servers import EmbeddedServers, resolve_embedded
    from conductor.local.watchdog import watch_children
    from conductor.policy.menu import WorkflowMenu
    from conductor.run.record import record_menu
    from conductor.workers.pool import load_pool

    watch_children()    # a killed recording must not leave its model servers running
    questions = question_set(a.gsm8k, a.mmlu)
    if a.limit:
        questions = questions[:a.limit]
    k, n = a.shard
    questions = questions[k::n]     # interleaved: shards recording side by side keep the union near a prefix
    menu = WorkflowMenu.parse(list(a.menu.split(",")) if a.menu else list(MENU), load_pool(a.pool))
    cache_path = Path(a.cache)
    print(f"recording {len(menu)} menu entries and the default conductor over {len(questions)} questions "
          f"({sum(q.domain == 'math' for q in questions)} GSM8K, {sum(q.domain != 'math' for q in questions)} "
          f"MMLU-STEM) into {cache_path}, {a.chunk} questions at a time", flush=True)
    t0, totals = time.perf_counter(), [0, 0, 0]
    for start in range(0, len(questions), a.chunk):
        chunk = questions[start:start + a.chunk]
        cache = ResponseCache(cache_path)
        try:
            with EmbeddedServers() as servers:
                live, _ = resolve_embedded(menu.pool, servers, lazy=True)

                def progress(p: RecordProgress, base: int = start) -> None:
                    print(dataclasses.replace(p, done=base + p.done, total=len(questions),
                                              elapsed_s=time.perf_counter() - t0).line(), flush=True)

                summary = record_menu(chunk, menu, live, cache, on_question=progress)
        finally:
            cache.close()
        for qid, spec, cause in summary.failed:
            print(f"  failed: {qid} {spec}: {cause}", flush=True)
        t1 = time.perf_counter()
        code = record_default(chunk, cache_path, Path(a.runs) / "default")
        print(f"  default conductor on questions {start + 1}-{start + len(chunk)}: {time.perf_counter() - t1:.0f} s "
              f"(exit {code})", flush=True)
        totals = [totals[0] + summary.new_calls, totals[1] + summary.cached_calls, totals[2] + summary.failures]
    print(f"questions={len(questions)} new_calls={totals[0]} cached_calls={totals[1]} failures={totals[2]} "
          f"wall_s={time.perf_counter() - t0:.1f}", flush=True)
    return 0


# ------------------------------------------------------------------------------------------------ replay

HYBRID_POOL = ROOT / "data" / "pools" / "local-hybrid.yaml"
HYBRID_CASCADE = "cascade:0+pot-0+4:5"   # 1.5B CoT + 1.5B PoT + Mixtral agree -> accept, else GPT-4
GPT4, MIXTRAL = "fixed:5", "fixed:4"
HYBRID_MENU = ("fixed:0", "pot:0", "chain:0:1", MIXTRAL, HYBRID_CASCADE, GPT4)


@dataclasses.dataclass
class Outcome:
    """One strategy on one question, replayed: right or not, and what it cost."""

    correct: bool
    seconds: float       # the recorded wall time of its calls (and of the conductor's generation)
    dollars: float       # local seconds at the manifest's per_second, recorded replies at their token prices
    infra: bool = False


def _outcomes(rows: Sequence[Any]) -> dict[str, Outcome]:
    out = {}
    for t in rows:
        seconds = sum(c.latency_s for c in t.calls) + (t.conductor_s or 0.0)
        out[t.question_id] = Outcome(bool(t.correct), seconds, t.cost_usd, bool(t.infra_failed))
    return out


def priced_local(hybrid: Any) -> Any:
    """The hybrid manifest's local workers alone: data/pools/local.yaml's workers priced per second (the menu's
    tool workers then sit where the recording had them, so every message is the recorded one)."""
    return hybrid.model_copy(update={"workers": hybrid.workers[:4], "pool_id": "local-priced"})


def replay_strategy(spec: str, workflow: Any, pool: Any, questions: Sequence[Question], cache: Path) -> dict[str, Outcome]:
    """A fixed workflow over ``questions`` from the recording alone (a missing call: an infrastructure failure)."""
    from conductor.execution.cache import ResponseCache
    from conductor.execution.executor import Executor
    from conductor.policy.fixed import FixedWorkflowPolicy
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard

    run = RunSpec(run_id=f"replay-{spec}", kind="eval", pool=pool, checkpoint_id=spec, max_steps=max(1, len(workflow)))
    ex = Executor(cache=ResponseCache(cache, mode="replay"))
    try:
        return _outcomes(run_shard(questions, run, FixedWorkflowPolicy(workflow, name=spec), ex))
    finally:
        ex.cache.close()


def replay_default(questions: Sequence[Question], cache: Path, out: Path, per_second: float) -> dict[str, Outcome]:
    """The untrained default as a user replays it: ``conductor answer --replay`` (no model loads); dollars are its
    recorded seconds (conductor generation included) at the local price."""
    from conductor.lake.reader import scan

    cmd = [sys.executable, "-m", "conductor", "answer", slice_spec(questions), "--conductor", DEFAULT_CONDUCTOR,
           "--cache", str(cache), "--replay", "--out", str(out), "--replace"]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    lake = out / "lake"
    if not lake.exists():
        return {}
    traj = scan(str(lake), "trajectories").collect().to_dicts()
    calls = scan(str(lake), "calls").collect().to_dicts()
    secs: dict[str, float] = {}
    for c in calls:
        secs[c["trajectory_id"]] = secs.get(c["trajectory_id"], 0.0) + float(c["latency_s"] or 0.0)
    out_rows = {}
    for t in traj:
        seconds = secs.get(t["trajectory_id"], 0.0) + float(t.get("conductor_s") or 0.0)
        out_rows[t["question_id"]] = Outcome(bool(t["correct"]), seconds, seconds * per_second,
                                             bool(t["infra_failed"]))
    return out_rows


def load_state(path: Path) -> dict[str, Any]:
    import json

    return json.loads(path.read_text()) if path.is_file() else {}


def save_state(path: Path, state: dict[str, Any]) -> None:
    import json

    from conductor.files import atomic_write_text

    atomic_write_text(path, json.dumps(state, indent=1, sort_keys=True))


def outcomes_of(state: dict[str, Any], key: str) -> dict[str, Outcome]:
    return {q: Outcome(**o) for q, o in state.get(key, {}).items()}


def measure_all(a: argparse.Namespace, questions: Sequence[Question], state: dict[str, Any],
                state_path: Path) -> dict[str, dict[str, Outcome]]:
    """Every menu entry, the default, the hybrid cascade, GPT-4 and Mixtral alone, replayed (resumable per key)."""
    from conductor.policy.menu import WorkflowMenu
    from conductor.policy.spec import parse_conductor_spec
    from conductor.policy.strategies import make_strategy, strategy_pool
    from conductor.workers.pool import load_pool

    hybrid = load_pool(HYBRID_POOL)
    local = priced_local(hybrid)
    menu = WorkflowMenu.parse(list(MENU), local)
    cache = Path(a.cache)
    todo: list[tuple[str, Any]] = [(e.spec, lambda qs, e=e: replay_strategy(e.spec, e.workflow, menu.pool, qs, cache))
                                   for e in menu.entries]
    gsm = [q for q in questions if q.domain == "math"]
    for spec in (HYBRID_CASCADE, GPT4, MIXTRAL):
        typed = parse_conductor_spec(spec)
        pool = strategy_pool(typed, hybrid)
        wf = make_strategy(typed, pool).workflow
        todo.append((spec, lambda qs, spec=spec, pool=pool, wf=wf: replay_strategy(spec, wf, pool, gsm, cache)))
    per_second = hybrid.workers[0].price.per_second
    fresh = state.get("n_questions") != len(questions) or state.get("n_recorded") != a.recorded_now
    for key, run in todo:
        if key in state and not fresh:
            continue
        t0 = time.perf_counter()
        rows = run(questions)
        state[key] = {q: dataclasses.asdict(o) for q, o in rows.items()}
        print(f"  replayed {key}: {sum(not o.infra for o in rows.values())} of {len(rows)} questions recorded "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    menu_ok = [q for q in questions if all(q.id in state[e.spec] and not state[e.spec][q.id]["infra"]
                                           for e in menu.entries)]
    if "default" not in state or fresh:    # the default only where the menu was recorded (a prefix of the order)
        t0 = time.perf_counter()
        rows = replay_default(menu_ok, cache, Path(a.state) / "default-replay", per_second) if menu_ok else {}
        state["default"] = {q: dataclasses.asdict(o) for q, o in rows.items()}
        print(f"  replayed the default conductor: {sum(not o.infra for o in rows.values())} of {len(menu_ok)} "
              f"questions recorded ({time.perf_counter() - t0:.1f} s)", flush=True)
    state["n_questions"], state["n_recorded"] = len(questions), a.recorded_now
    save_state(state_path, state)
    return {k: outcomes_of(state, k) for k in [*(key for key, _ in todo), "default"]}


def recorded(results: dict[str, dict[str, Outcome]], questions: Sequence[Question]) -> list[Question]:
    """The questions every menu entry and the default replayed without an infrastructure failure."""
    keys = [*MENU, "default"]
    return [q for q in questions
            if all(q.id in results[k] and not results[k][q.id].infra for k in keys)]


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def se(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return float("nan")
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / (n - 1) / n) ** 0.5


@dataclasses.dataclass(frozen=True)
class Point:
    label: str
    accuracy: float
    se: float
    seconds: float
    dollars: float
    n: int


def point(label: str, rows: dict[str, Outcome], qids: Sequence[str]) -> Point:
    got = [rows[q] for q in qids if q in rows and not rows[q].infra]
    acc = [float(o.correct) for o in got]
    return Point(label, mean(acc), se(acc), mean([o.seconds for o in got]), mean([o.dollars for o in got]), len(got))


def local_menu() -> Any:
    from conductor.policy.menu import WorkflowMenu
    from conductor.workers.pool import load_pool

    return WorkflowMenu.parse(list(MENU), priced_local(load_pool(HYBRID_POOL)))


def hybrid_menu() -> Any:
    """GSM8K only: the local entries beside the hybrid cascade and the recorded models alone (no local model sees
    the gate here, so the hybrid pool's other tool ordinals leave every recorded local message as it was)."""
    from conductor.policy.menu import WorkflowMenu
    from conductor.workers.pool import load_pool

    return WorkflowMenu.parse(list(HYBRID_MENU), load_pool(HYBRID_POOL))


def train_menu(a: argparse.Namespace, menu: Any, train: Sequence[Question], cost_lambda: float, model_dir: Path) -> Any:
    """GRPO over ``menu`` on the recording (every rollout replayed): SmolLM2-135M picks a menu index; returns the
    trained MenuBackend (saved under ``model_dir``; a saved one is loaded instead of training again)."""
    from conductor.execution.cache import ResponseCache
    from conductor.execution.executor import Executor
    from conductor.learning.routing import RoutingSettings, make_routing_conductor, train_routing
    from conductor.policy.menu import MENU_PREFILL, MenuBackend
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard

    s = RoutingSettings(n_workers=len(menu), iterations=a.iterations, lr=a.lr, group_size=a.group_size,
                        prefill=MENU_PREFILL, temperature=a.train_temperature, seed=a.seed, cost_lambda=cost_lambda)
    if (model_dir / "config.json").exists():
        _, policy = make_routing_conductor(s, str(model_dir))
        return MenuBackend(policy, menu)
    trainer, policy = make_routing_conductor(s)
    backend = MenuBackend(policy, menu)
    ex = Executor(cache=ResponseCache(Path(a.cache), mode="replay"), shared_samples=True)
    steps = max(len(e.workflow) for e in menu.entries)

    def rollout(qs: Sequence[Question], run_id: str, samples: int, seed: int) -> list[Any]:
        spec = RunSpec(run_id=run_id, kind="rollout", pool=menu.pool, checkpoint_id=f"menu-l{cost_lambda:g}",
                       samples=samples, seed=seed, fewshot="none", temperature=a.train_temperature, max_tokens=8,
                       max_steps=steps)
        return run_shard(qs, spec, backend, ex)

    math_q = [q for q in train if q.domain == "math"]
    mcq_q = [q for q in train if q.domain != "math"]
    t0 = time.perf_counter()
    train_routing(trainer, rollout, math_q, mcq_q, s, a.questions_per_iteration, [w.name for w in menu.pool.workers],
                  run_prefix=f"menu-l{cost_lambda:g}", choices=menu.shares)
    print(f"  trained lambda={cost_lambda:g}: {a.iterations} iterations in {time.perf_counter() - t0:.0f} s", flush=True)
    trainer.save(str(model_dir), checkpoint_id=f"workflow-menu-l{cost_lambda:g}", overwrite=True)
    ex.cache.close()
    return backend


def evaluate_menu(backend: Any, menu: Any, questions: Sequence[Question], results: dict[str, dict[str, Outcome]],
                  label: str) -> tuple[dict[str, Outcome], dict[str, str]]:
    """The trained conductor's greedy choice per question, and that entry's replayed outcome (the choice is one
    constrained token: its greedy value is the most probable entry, so the entry's own row is its outcome)."""
    from conductor.parser import parse_workflow
    from conductor.run.pipeline import RunSpec, generate, plan

    spec = RunSpec(run_id=label, kind="eval", pool=menu.pool, checkpoint_id=label, fewshot="none", temperature=0.0,
                   max_tokens=8, max_steps=max(len(e.workflow) for e in menu.entries))
    trajs = generate(plan(questions, spec), backend, spec)
    chosen: dict[str, str] = {}
    for t in trajs:
        wf = parse_workflow(t.rounds[0].completion, n_workers=len(menu.pool.workers), max_steps=spec.max_steps)
        steps = [st.to_json() for st in getattr(wf, "steps", ())]
        chosen[t.question_id] = menu.chosen(steps) or "unparsed"
    out = {q: results[c][q] if c in results else Outcome(False, 0.0, 0.0) for q, c in chosen.items()}
    return out, chosen


def cmd_replay(a: argparse.Namespace) -> int:
    from conductor.execution.cache import ResponseCache
    from conductor.stats.paired import mcnemar_exact

    state_path = Path(a.state) / "state.json"
    state = load_state(state_path)
    rec = ResponseCache(a.cache, mode="replay")
    a.recorded_now = rec.count()     # a grown recording is replayed again
    rec.close()
    questions = question_set(a.gsm8k, a.mmlu)
    t0 = time.perf_counter()
    results = measure_all(a, questions, state, state_path)
    usable = recorded(results, questions)
    by_split = {sp: [q for q in usable if split(q) == sp] for sp in ("train", "validation", "test")}
    print(f"recorded questions: {len(usable)} of {len(questions)} (train {len(by_split['train'])}, validation "
          f"{len(by_split['validation'])}, test {len(by_split['test'])}); replayed in {time.perf_counter() - t0:.0f} s",
          flush=True)
    if len(by_split["test"]) < 2 or len(by_split["train"]) < 2:
        print("error: too few recorded questions for a train/test run: record more first", file=sys.stderr)
        return 1
    test_ids = [q.id for q in by_split["test"]]
    val_ids = [q.id for q in by_split["validation"]]
    entries = {spec: point(spec, results[spec], test_ids) for spec in MENU}
    best_entry = max(entries.values(), key=lambda p: p.accuracy)
    val_best = max(MENU, key=lambda sp: point(sp, results[sp], val_ids).accuracy) if val_ids else best_entry.label
    default = point("default", results["default"], test_ids)
    oracle = Point("any-correct oracle", mean([float(any(results[sp][q].correct for sp in MENU)) for q in test_ids]),
                   float("nan"), float("nan"), float("nan"), len(test_ids))
    trained: dict[str, Point] = {}
    chosen_by: dict[str, dict[str, str]] = {}
    menu = local_menu()
    for lam in a.lambdas:
        backend = train_menu(a, menu, by_split["train"], lam, Path(a.state) / f"model-l{lam:g}")
        rows, chosen = evaluate_menu(backend, menu, by_split["test"], results, f"trained-l{lam:g}")
        trained[f"{lam:g}"] = point(f"trained (lambda={lam:g})", rows, test_ids)
        chosen_by[f"{lam:g}"] = chosen
        results[f"trained-l{lam:g}"] = rows
    gsm_train = [q for q in by_split["train"] if q.domain == "math"]
    if a.hybrid_lambda is not None and not gsm_train:
        print("hybrid menu: no recorded GSM8K training question yet; not trained", flush=True)
    elif a.hybrid_lambda is not None:     # the hybrid menu on GSM8K: when is GPT-4 worth its price?
        hmenu = hybrid_menu()
        backend = train_menu(a, hmenu, gsm_train, a.hybrid_lambda, Path(a.state) / f"model-hybrid-l{a.hybrid_lambda:g}")
        gsm_test_q = [q for q in by_split["test"] if q.domain == "math"]
        rows, chosen = evaluate_menu(backend, hmenu, gsm_test_q, results, "trained-hybrid")
        trained["hybrid"] = point(f"trained hybrid menu (GSM8K, lambda={a.hybrid_lambda:g})", rows,
                                  [q.id for q in gsm_test_q])
        chosen_by["hybrid"] = chosen
    pick = f"{a.lambdas[0]:g}"
    tr = trained[pick]
    # paired: trained (accuracy objective) against the best single menu entry picked on validation
    base = results[val_best]
    b = sum(results[f"trained-l{pick}"][q].correct and not base[q].correct for q in test_ids)
    c = sum(base[q].correct and not results[f"trained-l{pick}"][q].correct for q in test_ids)
    _, p_two = mcnemar_exact(b, c)
    gsm_test = [q.id for q in by_split["test"] if q.domain == "math"]
    cascade = point("hybrid cascade", results[HYBRID_CASCADE], gsm_test)
    gpt4 = point("GPT-4-1106 alone", results[GPT4], gsm_test)
    mixtral = point("Mixtral alone", results[MIXTRAL], gsm_test)
    report(a, entries, default, oracle, trained, chosen_by, by_split, cascade, gpt4, mixtral, val_best, (b, c, p_two))
    best_worker = entries["fixed:0"] if entries["fixed:0"].accuracy >= entries["fixed:1"].accuracy else entries["fixed:1"]
    print(f"trained_accuracy={tr.accuracy:.4f} best_entry_accuracy={point(val_best, results[val_best], test_ids).accuracy:.4f} "
          f"default_accuracy={default.accuracy:.4f} best_worker_accuracy={best_worker.accuracy:.4f} "
          f"oracle_accuracy={oracle.accuracy:.4f} p_value={p_two:.4f} cascade_accuracy={cascade.accuracy:.4f} "
          f"cascade_cost_ratio={cascade.dollars / gpt4.dollars if gpt4.dollars else float('nan'):.4f} "
          f"gpt4_accuracy={gpt4.accuracy:.4f}", flush=True)
    return 0


def report(a: argparse.Namespace, entries: dict[str, Point], default: Point, oracle: Point, trained: dict[str, Point],
           chosen_by: dict[str, dict[str, str]], by_split: dict[str, list[Question]], cascade: Point, gpt4: Point,
           mixtral: Point, val_best: str, paired: tuple[int, int, float]) -> None:
    """The table (printed and as Markdown beside the plot) and the plot: accuracy against seconds and dollars."""
    from collections import Counter

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"test: {len(by_split['test'])} questions ({sum(q.domain == 'math' for q in by_split['test'])} GSM8K); "
             f"train {len(by_split['train'])}, validation {len(by_split['validation'])}",
             "| strategy | accuracy | s.e. | seconds/q | $/q | n |", "|---|---:|---:|---:|---:|---:|"]
    for p in [*entries.values(), default, *trained.values(), oracle]:
        lines.append(f"| {p.label} | {p.accuracy:.3f} | {p.se:.3f} | {p.seconds:.1f} | {p.dollars:.6f} | {p.n} |")
    lines += ["", "GSM8K test only (the hybrid pool):", "| strategy | accuracy | s.e. | $/q | n |", "|---|---:|---:|---:|---:|"]
    for p in (cascade, gpt4, mixtral, *(point(f"{sp} (GSM8K)", {}, []) for sp in ())):
        lines.append(f"| {p.label} | {p.accuracy:.3f} | {p.se:.3f} | {p.dollars:.6f} | {p.n} |")
    lines.append(f"\nbest single entry on validation: {val_best}; trained vs it on test: trained-only right {paired[0]}, "
                 f"entry-only right {paired[1]}, exact McNemar p (two-sided) = {paired[2]:.4f}")
    domain = {q.id: q.domain for q in by_split["test"]}
    for lam, chosen in chosen_by.items():
        per = {d: Counter(c for q, c in chosen.items() if domain[q] == d) for d in sorted(set(domain.values()))}
        lines.append(f"trained lambda={lam}: chose " + "; ".join(
            f"{d}: " + ", ".join(f"{c} {n}" for c, n in cnt.most_common()) for d, cnt in per.items()))
    text = "\n".join(lines)
    print(text, flush=True)
    (out / "workflow_replay.md").write_text(text + "\n")
    plot(out / "workflow_replay.png", entries, default, trained, oracle, cascade, gpt4, mixtral)


def plot(path: Path, entries: dict[str, Point], default: Point, trained: dict[str, Point], oracle: Point,
         cascade: Point, gpt4: Point, mixtral: Point) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for p in entries.values():
        ax1.errorbar(p.seconds, p.accuracy, yerr=p.se, fmt="o", color="#6baed6", capsize=3)
        ax1.annotate(p.label, (p.seconds, p.accuracy), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax1.errorbar(default.seconds, default.accuracy, yerr=default.se, fmt="s", color="#fd8d3c", capsize=3,
                 label="untrained default (conductor)")
    for p in trained.values():
        ax1.errorbar(p.seconds, p.accuracy, yerr=p.se, fmt="*", ms=12, color="#31a354", capsize=3, label=p.label)
    ax1.axhline(oracle.accuracy, ls="--", color="grey", label=f"any-correct oracle {oracle.accuracy:.3f}")
    ax1.set_xlabel("recorded seconds per question (2-core CPU)")
    ax1.set_ylabel("accuracy (test)")
    ax1.set_title("menu entries, default and trained conductor (all test questions)")
    ax1.legend(fontsize=8, loc="lower right")
    for p, color in ((cascade, "#e6550d"), (gpt4, "#756bb1"), (mixtral, "#9e9ac8")):
        ax2.errorbar(p.dollars, p.accuracy, yerr=p.se, fmt="o", color=color, capsize=3, label=p.label)
    for p in entries.values():
        ax2.scatter(p.dollars, p.accuracy, color="#6baed6", s=12)
    ax2.set_xscale("log")
    ax2.set_xlabel("dollars per question (log; local seconds at the manifest's per_second)")
    ax2.set_title("GSM8K test: the hybrid cascade against GPT-4 alone")
    ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _lambdas(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 0,0.4") from None
    if not vals or any(not 0 <= v < 10 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: each lambda must be a number in [0, 10)")
    return vals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    rep = sub.add_parser("replay", help="replay every entry, train the menu conductor, the cascade; last line")
    rep.add_argument("--gsm8k", type=int, default=300)
    rep.add_argument("--mmlu", type=int, default=100)
    rep.add_argument("--cache", default=str(default_cache()))
    rep.add_argument("--state", default="runs/workflow-replay/replay", help="resumable results and trained models")
    rep.add_argument("--out", default="docs/figures/workflow-replay")
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
    if a.stage == "record":
        return cmd_record(a)
    if a.iterations < 1 or a.group_size < 2 or a.questions_per_iteration < 1:
        ap.error("--iterations and --questions-per-iteration must be >= 1, --group-size >= 2")
    if not (a.lr > 0 and a.train_temperature > 0):
        ap.error("--lr and --train-temperature must be > 0")
    return cmd_replay(a)


if __name__ == "__main__":
    sys.exit(main())
