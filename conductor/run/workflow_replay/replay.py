"""The ``replay`` stage: every menu entry, the untrained default, the hybrid cascade and the recorded models alone
from the recording (no model loads), then a menu conductor trained by GRPO on replayed rollouts, against the best
entry picked on validation (paired, exact McNemar). Results are kept per strategy in ``state/state.json`` and
replayed again only when the question set or the recording grew.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.run.workflow_replay.questions import (
    DEFAULT_CONDUCTOR,
    HYBRID_POOL,
    MENU,
    default_cache,
    question_set,
    slice_spec,
    split,
)
from conductor.run.workflow_replay.report import (
    Escalation,
    Figures,
    Outcome,
    Point,
    mean,
    point,
    progress_table,
    report,
)

if TYPE_CHECKING:
    from conductor.data.questions import Question
    from conductor.policy.menu import MenuBackend, WorkflowMenu
    from conductor.trajectory import Trajectory
    from conductor.workers.pool import Pool
    from conductor.workflow import Workflow

HYBRID_CASCADE = "cascade:0+pot-0+4:5"   # 1.5B CoT + 1.5B PoT + Mixtral agree -> accept, else GPT-4
HYBRID_PAIR = "cascade:0+4:5"            # 1.5B CoT + Mixtral agree -> accept, else GPT-4
GPT4, MIXTRAL = "fixed:5", "fixed:4"
HYBRID_MENU = ("fixed:0", "pot:0", "chain:0:1", MIXTRAL, HYBRID_CASCADE, HYBRID_PAIR, GPT4)
# the cheap answers each cascade pays for before it decides (their replayed rows price them one by one)
CASCADE_PARTS = {HYBRID_CASCADE: ("fixed:0", "pot:0", MIXTRAL), HYBRID_PAIR: ("fixed:0", MIXTRAL)}


class ReplaySettingsError(ValueError):
    """Replay settings that cannot run (the message names the option)."""


class ReplayError(RuntimeError):
    """The recording cannot be replayed into a result yet (too few recorded questions)."""


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """What a replay reads, trains and writes (``bench/workflow_replay.py replay``'s options)."""

    gsm8k: int = 300
    mmlu: int = 100
    cache: Path = dataclasses.field(default_factory=default_cache)
    state: Path = Path("runs/workflow-replay/replay")     # resumable results and trained models
    out: Path = Path("docs/figures/workflow-replay")
    lambdas: tuple[float, ...] = (0.0, 0.4)               # cost lambdas; the first is the headline
    iterations: int = 30
    questions_per_iteration: int = 8
    group_size: int = 8
    lr: float = 3e-5
    train_temperature: float = 2.0
    seed: int = 0
    hybrid_lambda: float | None = None     # also train the hybrid GSM8K menu at this lambda

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.group_size < 2 or self.questions_per_iteration < 1:
            raise ReplaySettingsError("--iterations and --questions-per-iteration must be >= 1, --group-size >= 2")
        if not (self.lr > 0 and self.train_temperature > 0):
            raise ReplaySettingsError("--lr and --train-temperature must be > 0")
        if not self.lambdas:
            raise ReplaySettingsError("--lambdas: at least one cost lambda")


def _outcomes(rows: Sequence[Trajectory]) -> dict[str, Outcome]:
    out = {}
    for t in rows:
        seconds = sum(c.latency_s for c in t.calls) + (t.conductor_s or 0.0)
        out[t.question_id] = Outcome(bool(t.correct), seconds, t.cost_usd, bool(t.infra_failed))
    return out


def priced_local(hybrid: Pool) -> Pool:
    """The hybrid manifest's local workers alone: data/pools/local.yaml's workers priced per second (the menu's
    tool workers then sit where the recording had them, so every message is the recorded one)."""
    return hybrid.model_copy(update={"workers": hybrid.workers[:4], "pool_id": "local-priced"})


def replay_strategy(spec: str, workflow: Workflow, pool: Pool, questions: Sequence[Question],
                    cache: Path) -> dict[str, Outcome]:
    """A fixed workflow over ``questions`` from the recording alone (a missing call: an infrastructure failure)."""
    from conductor.execution.cache import ResponseCache
    from conductor.execution.executor import Executor
    from conductor.policy.fixed import FixedWorkflowPolicy
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard

    run = RunSpec(run_id=f"replay-{spec}", kind="eval", pool=pool, checkpoint_id=spec, max_steps=max(1, len(workflow)))
    recording = ResponseCache(cache, mode="replay")
    try:
        return _outcomes(run_shard(questions, run, FixedWorkflowPolicy(workflow, name=spec), Executor(cache=recording)))
    finally:
        recording.close()


def replay_default(questions: Sequence[Question], cache: Path, out: Path, per_second: float) -> dict[str, Outcome]:
    """The untrained default as a user replays it: ``conductor answer --replay`` (no model loads); dollars are its
    recorded seconds (conductor generation included) at the local price."""
    from conductor.lake.reader import scan

    cmd = [sys.executable, "-m", "conductor", "answer", slice_spec(questions), "--conductor", DEFAULT_CONDUCTOR,
           "--cache", str(cache), "--replay", "--out", str(out), "--replace",
           "--shard-size", "1"]        # a conductor generation not recorded yet fails its own question only
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    if said:      # questions not recorded yet are infra-failed (left out of every figure); say how many
        print(f"  the default's replay: {said[-1].removeprefix('error: ')}", flush=True)
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
    return json.loads(path.read_text()) if path.is_file() else {}


def save_state(path: Path, state: dict[str, Any]) -> None:
    from conductor.files import atomic_write_text

    atomic_write_text(path, json.dumps(state, indent=1, sort_keys=True))


def outcomes_of(state: dict[str, Any], key: str) -> dict[str, Outcome]:
    return {q: Outcome(**o) for q, o in state.get(key, {}).items()}


def measure_all(s: ReplaySettings, questions: Sequence[Question], state: dict[str, Any], state_path: Path,
                recorded_now: int) -> dict[str, dict[str, Outcome]]:
    """Every menu entry, the default, the hybrid cascade, GPT-4 and Mixtral alone, replayed (resumable per key;
    all again when the question set or the recording, ``recorded_now`` calls, changed)."""
    from conductor.policy.menu import WorkflowMenu
    from conductor.policy.spec import parse_conductor_spec
    from conductor.policy.strategies import make_strategy, strategy_pool
    from conductor.workers.pool import load_pool
    from conductor.workflow import Workflow

    hybrid = load_pool(HYBRID_POOL)
    local = priced_local(hybrid)
    menu = WorkflowMenu.parse(list(MENU), local)
    cache = Path(s.cache)
    # (key, workflow, pool, questions): the menu's entries on every question, the hybrid ones on GSM8K only
    todo: list[tuple[str, Workflow, Pool, Sequence[Question]]] = [
        (e.spec, e.workflow, menu.pool, questions) for e in menu.entries]
    gsm = [q for q in questions if q.domain == "math"]
    for spec in (HYBRID_CASCADE, HYBRID_PAIR, GPT4, MIXTRAL):
        parsed = parse_conductor_spec(spec)
        pool = strategy_pool(parsed, hybrid)
        wf = make_strategy(parsed, pool).workflow
        if not isinstance(wf, Workflow):       # a fixed spec: its workflow does not depend on the question
            raise TypeError(f"{spec}: not a fixed workflow")
        todo.append((spec, wf, pool, gsm))
    per_second = hybrid.workers[0].price.per_second
    fresh = state.get("n_questions") != len(questions) or state.get("n_recorded") != recorded_now
    for key, wf, pool, qs in todo:
        if key in state and not fresh:
            continue
        t0 = time.perf_counter()
        rows = replay_strategy(key, wf, pool, qs, cache)
        state[key] = {q: dataclasses.asdict(o) for q, o in rows.items()}
        print(f"  replayed {key}: {sum(not o.infra for o in rows.values())} of {len(rows)} questions recorded "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    menu_ok = [q for q in questions if all(q.id in state[e.spec] and not state[e.spec][q.id]["infra"]
                                           for e in menu.entries)]
    if "default" not in state or fresh:    # the default only where the menu was recorded (a prefix of the order)
        t0 = time.perf_counter()
        rows = replay_default(menu_ok, cache, Path(s.state) / "default-replay", per_second) if menu_ok else {}
        state["default"] = {q: dataclasses.asdict(o) for q, o in rows.items()}
        print(f"  replayed the default conductor: {sum(not o.infra for o in rows.values())} of {len(menu_ok)} "
              f"questions recorded ({time.perf_counter() - t0:.1f} s)", flush=True)
    state["n_questions"], state["n_recorded"] = len(questions), recorded_now
    save_state(state_path, state)
    return {k: outcomes_of(state, k) for k in [*(key for key, *_ in todo), "default"]}


def recorded(results: dict[str, dict[str, Outcome]], questions: Sequence[Question]) -> list[Question]:
    """The questions every menu entry and the default replayed without an infrastructure failure."""
    keys = [*MENU, "default"]
    return [q for q in questions
            if all(q.id in results[k] and not results[k][q.id].infra for k in keys)]


def local_menu() -> WorkflowMenu:
    from conductor.policy.menu import WorkflowMenu
    from conductor.workers.pool import load_pool

    return WorkflowMenu.parse(list(MENU), priced_local(load_pool(HYBRID_POOL)))


def hybrid_menu() -> WorkflowMenu:
    """GSM8K only: the local entries beside the hybrid cascade and the recorded models alone (no local model sees
    the gate here, so the hybrid pool's other tool ordinals leave every recorded local message as it was)."""
    from conductor.policy.menu import WorkflowMenu
    from conductor.workers.pool import load_pool

    return WorkflowMenu.parse(list(HYBRID_MENU), load_pool(HYBRID_POOL))


def train_menu(s: ReplaySettings, menu: WorkflowMenu, train: Sequence[Question], cost_lambda: float,
               model_dir: Path) -> MenuBackend:
    """GRPO over ``menu`` on the recording (every rollout replayed): SmolLM2-135M picks a menu index; returns the
    trained MenuBackend (saved under ``model_dir``; a saved one is loaded instead of training again)."""
    from conductor.execution.cache import ResponseCache
    from conductor.execution.executor import Executor
    from conductor.learning.choice import ChoiceSettings, make_choice_conductor, train_choice_conductor
    from conductor.policy.menu import MENU_PREFILL, MenuBackend
    from conductor.prompts import FewShotSpec
    from conductor.run.pipeline import RunSpec
    from conductor.run.shards import run_shard

    cs = ChoiceSettings(n_workers=len(menu), iterations=s.iterations, lr=s.lr, group_size=s.group_size,
                        prefill=MENU_PREFILL, temperature=s.train_temperature, seed=s.seed, cost_lambda=cost_lambda)
    if (model_dir / "config.json").exists():
        _, policy = make_choice_conductor(cs, str(model_dir))
        return MenuBackend(policy, menu)
    trainer, policy = make_choice_conductor(cs)
    backend = MenuBackend(policy, menu)
    recording = ResponseCache(Path(s.cache), mode="replay")
    ex = Executor(cache=recording, shared_samples=True)
    steps = max(len(e.workflow) for e in menu.entries)

    def rollout(qs: Sequence[Question], run_id: str, samples: int, seed: int) -> list[Trajectory]:
        spec = RunSpec(run_id=run_id, kind="rollout", pool=menu.pool, checkpoint_id=f"menu-l{cost_lambda:g}",
                       samples=samples, seed=seed, fewshot=FewShotSpec.parse("none"), temperature=s.train_temperature, max_tokens=8,
                       max_steps=steps)
        return run_shard(qs, spec, backend, ex)

    math_q = [q for q in train if q.domain == "math"]
    mcq_q = [q for q in train if q.domain != "math"]
    t0 = time.perf_counter()
    train_choice_conductor(trainer, rollout, math_q, mcq_q, cs, s.questions_per_iteration,
                           [w.name for w in menu.pool.workers], run_prefix=f"menu-l{cost_lambda:g}",
                           choices=menu.shares)
    print(f"  trained lambda={cost_lambda:g}: {s.iterations} iterations in {time.perf_counter() - t0:.0f} s", flush=True)
    trainer.save(str(model_dir), checkpoint_id=f"workflow-menu-l{cost_lambda:g}", overwrite=True)
    recording.close()
    return backend


def evaluate_menu(backend: MenuBackend, menu: WorkflowMenu, questions: Sequence[Question],
                  results: dict[str, dict[str, Outcome]], label: str) -> tuple[dict[str, Outcome], dict[str, str]]:
    """The trained conductor's greedy choice per question, and that entry's replayed outcome (the choice is one
    constrained token: its greedy value is the most probable entry, so the entry's own row is its outcome)."""
    from conductor.parser import parse_workflow
    from conductor.prompts import FewShotSpec
    from conductor.run.pipeline import RunSpec, generate, plan

    spec = RunSpec(run_id=label, kind="eval", pool=menu.pool, checkpoint_id=label, fewshot=FewShotSpec.parse("none"), temperature=0.0,
                   max_tokens=8, max_steps=max(len(e.workflow) for e in menu.entries))
    trajs = generate(plan(questions, spec), backend, spec)
    chosen: dict[str, str] = {}
    for t in trajs:
        wf = parse_workflow(t.rounds[0].completion, n_workers=len(menu.pool.workers), max_steps=spec.max_steps)
        steps = [st.to_json() for st in getattr(wf, "steps", ())]
        chosen[t.question_id] = menu.chosen(steps) or "unparsed"
    out = {q: results[c][q] if c in results else Outcome(False, 0.0, 0.0) for q, c in chosen.items()}
    return out, chosen


def escalation(results: dict[str, dict[str, Outcome]], cascade: str, qids: Sequence[str],
               parts: Sequence[str] | None = None) -> Escalation:
    """How often ``cascade`` paid for GPT-4 (its dollars exceed its cheap answers' dollars), how often the answers
    it accepted were right, and the share of its dollars that went to local compute. ``parts``: its cheap answers'
    strategies (default ``CASCADE_PARTS[cascade]``).

    >>> O = Outcome
    >>> r = {HYBRID_PAIR: {"a": O(True, 9, 1.5), "b": O(True, 9, 0.5)}, "fixed:0": {"a": O(False, 5, 0.4),
    ...      "b": O(True, 5, 0.4)}, MIXTRAL: {"a": O(True, 1, 0.1), "b": O(True, 1, 0.1)}}
    >>> escalation(r, HYBRID_PAIR, ["a", "b"])
    Escalation(questions=2, escalated=1, accepted_right=1, local_share=0.4)
    """
    parts = CASCADE_PARTS[cascade] if parts is None else parts
    rows = results[cascade]
    ids = [q for q in qids if q in rows and not rows[q].infra and all(q in results[p] for p in parts)]
    escalated = accepted_right = 0
    local = total = 0.0
    for q in ids:
        went_up = rows[q].dollars > sum(results[p][q].dollars for p in parts) + 1e-12
        escalated += went_up
        accepted_right += not went_up and rows[q].correct
        local += sum(results[p][q].dollars for p in parts if p != MIXTRAL)
        total += rows[q].dollars
    return Escalation(len(ids), escalated, accepted_right, round(local / total, 4) if total else float("nan"))


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """The headline figures (the bench's last line)."""

    trained: Point
    best_entry: Point
    default: Point
    best_worker: Point
    oracle: Point
    p_value: float
    cascade: Point
    gpt4: Point

    def line(self) -> str:
        ratio = self.cascade.dollars / self.gpt4.dollars if self.gpt4.dollars else float("nan")
        return (f"trained_accuracy={self.trained.accuracy:.4f} best_entry_accuracy={self.best_entry.accuracy:.4f} "
                f"default_accuracy={self.default.accuracy:.4f} best_worker_accuracy={self.best_worker.accuracy:.4f} "
                f"oracle_accuracy={self.oracle.accuracy:.4f} p_value={self.p_value:.4f} "
                f"cascade_accuracy={self.cascade.accuracy:.4f} cascade_cost_ratio={ratio:.4f} "
                f"gpt4_accuracy={self.gpt4.accuracy:.4f}")


def _train_all(s: ReplaySettings, by_split: dict[str, list[Question]], results: dict[str, dict[str, Outcome]],
               test_ids: list[str]) -> tuple[dict[str, Point], dict[str, dict[str, str]]]:
    """The menu conductor at each lambda (and the hybrid menu on GSM8K, when asked), evaluated on test."""
    trained: dict[str, Point] = {}
    chosen_by: dict[str, dict[str, str]] = {}
    menu = local_menu()
    for lam in s.lambdas:
        backend = train_menu(s, menu, by_split["train"], lam, Path(s.state) / f"model-l{lam:g}")
        rows, chosen = evaluate_menu(backend, menu, by_split["test"], results, f"trained-l{lam:g}")
        trained[f"{lam:g}"] = point(f"trained (lambda={lam:g})", rows, test_ids)
        chosen_by[f"{lam:g}"] = chosen
        results[f"trained-l{lam:g}"] = rows
    gsm_train = [q for q in by_split["train"] if q.domain == "math"]
    if s.hybrid_lambda is not None and not gsm_train:
        print("hybrid menu: no recorded GSM8K training question yet; not trained", flush=True)
    elif s.hybrid_lambda is not None:     # the hybrid menu on GSM8K: when is GPT-4 worth its price?
        hmenu = hybrid_menu()
        backend = train_menu(s, hmenu, gsm_train, s.hybrid_lambda, Path(s.state) / f"model-hybrid-l{s.hybrid_lambda:g}")
        gsm_test_q = [q for q in by_split["test"] if q.domain == "math"]
        rows, chosen = evaluate_menu(backend, hmenu, gsm_test_q, results, "trained-hybrid")
        trained["hybrid"] = point(f"trained hybrid menu (GSM8K, lambda={s.hybrid_lambda:g})", rows,
                                  [q.id for q in gsm_test_q])
        chosen_by["hybrid"] = chosen
    return trained, chosen_by


def _measured(s: ReplaySettings) -> tuple[dict[str, dict[str, Outcome]], list[Question], int]:
    """Every strategy replayed (resumable in ``s.state``), the questions all of them replay, and the set's size."""
    from conductor.execution.cache import ResponseCache

    state_path = Path(s.state) / "state.json"
    state = load_state(state_path)
    rec = ResponseCache(s.cache, mode="replay")
    recorded_now = rec.count()     # a grown recording is replayed again
    rec.close()
    questions = question_set(s.gsm8k, s.mmlu)
    results = measure_all(s, questions, state, state_path, recorded_now)
    return results, recorded(results, questions), len(questions)


def progress(s: ReplaySettings) -> str:
    """The ``progress`` stage: the recording so far without training (``progress_table``), also written to
    ``s.out/progress.md``; for watching a recording that runs for hours."""
    results, usable, _ = _measured(s)
    text = progress_table(results, usable, MENU)
    Path(s.out).mkdir(parents=True, exist_ok=True)
    (Path(s.out) / "progress.md").write_text(text + "\n")
    return text


def replay(s: ReplaySettings) -> ReplayResult:
    """The whole replay stage; writes the table and plot under ``s.out``. Raises ``ReplayError`` when too few
    questions are recorded for a train/test run."""
    from conductor.stats.paired import mcnemar_exact

    t0 = time.perf_counter()
    results, usable, n_questions = _measured(s)
    by_split = {sp: [q for q in usable if split(q) == sp] for sp in ("train", "validation", "test")}
    print(f"recorded questions: {len(usable)} of {n_questions} (train {len(by_split['train'])}, validation "
          f"{len(by_split['validation'])}, test {len(by_split['test'])}); replayed in {time.perf_counter() - t0:.0f} s",
          flush=True)
    if len(by_split["test"]) < 2 or len(by_split["train"]) < 2:
        raise ReplayError("too few recorded questions for a train/test run: record more first")
    test_ids = [q.id for q in by_split["test"]]
    val_ids = [q.id for q in by_split["validation"]]
    entries = {spec: point(spec, results[spec], test_ids) for spec in MENU}
    best_entry = max(entries.values(), key=lambda p: p.accuracy)
    val_best = max(MENU, key=lambda sp: point(sp, results[sp], val_ids).accuracy) if val_ids else best_entry.label
    default = point("default", results["default"], test_ids)
    oracle = Point("any-correct oracle", mean([float(any(results[sp][q].correct for sp in MENU)) for q in test_ids]),
                   float("nan"), float("nan"), float("nan"), len(test_ids))
    trained, chosen_by = _train_all(s, by_split, results, test_ids)
    pick = f"{s.lambdas[0]:g}"
    # paired: trained (accuracy objective) against the best single menu entry picked on validation
    base = results[val_best]
    b = sum(results[f"trained-l{pick}"][q].correct and not base[q].correct for q in test_ids)
    c = sum(base[q].correct and not results[f"trained-l{pick}"][q].correct for q in test_ids)
    _, p_two = mcnemar_exact(b, c)
    gsm_test = [q.id for q in by_split["test"] if q.domain == "math"]
    cascade = point("hybrid cascade", results[HYBRID_CASCADE], gsm_test)
    pair = point("hybrid pair cascade (1.5B CoT + Mixtral)", results[HYBRID_PAIR], gsm_test)
    gpt4 = point("GPT-4-1106 alone", results[GPT4], gsm_test)
    mixtral = point("Mixtral alone", results[MIXTRAL], gsm_test)
    escalated = {label: escalation(results, key, gsm_test)
                 for label, key in (("hybrid cascade", HYBRID_CASCADE), ("hybrid pair cascade", HYBRID_PAIR))}
    report(Path(s.out), Figures(entries, default, oracle, trained, chosen_by, by_split, cascade, gpt4, mixtral,
                                val_best, (b, c, p_two), pair, escalated))
    best_worker = entries["fixed:0"] if entries["fixed:0"].accuracy >= entries["fixed:1"].accuracy else entries["fixed:1"]
    return ReplayResult(trained[pick], point(val_best, results[val_best], test_ids), default, best_worker, oracle,
                        p_two, cascade, gpt4)
