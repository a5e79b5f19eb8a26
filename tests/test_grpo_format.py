"""A checkpoint's decoding contract (conductor_format.json): written on a formatted base, carried by every GRPO
step to the child, applied by the transformers backend to every generation (whatever grammar a caller
passes) over the number of workers the caller says the prompt lists, with real tiny models and the real
llguidance grammar engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor.decoding.contract import FORMAT_FILE, ConductorFormat, load_format
from conductor.decoding.subtasks import DEFAULT_SUBTASKS
from conductor.generation import GenerationParams
from conductor.learning.grpo.checkpoint import formatted_base
from conductor.parser import parse_workflow
from conductor.workflow import Workflow
from grpo_fixtures import rollout

ROOT = Path(__file__).resolve().parent.parent


def test_format_round_trips_and_validates():
    fmt = ConductorFormat(max_steps=3)
    assert ConductorFormat.from_json(json.loads(json.dumps(fmt.to_json()))) == fmt
    assert fmt.digest == ConductorFormat(max_steps=3).digest != ConductorFormat(max_steps=2).digest
    assert 'st ::= "\\"' + DEFAULT_SUBTASKS[0] in fmt.grammar(4) and "wf3 ::=" in fmt.grammar(4)
    with pytest.raises(ValueError, match="unknown field"):
        ConductorFormat.from_json({"max_steps": 2, "steps": 3})
    with pytest.raises(ValueError):
        ConductorFormat(subtasks=('say "x"',))
    with pytest.raises(ValueError):
        ConductorFormat(min_steps=3, max_steps=2)
    assert fmt.for_workers(4).n_workers == 4 and fmt.for_workers(4).gbnf() == fmt.grammar(4)


@pytest.fixture(scope="module")
def tiny(tiny: Path) -> Path:
    """The session's tiny checkpoint (tests/conftest.py); constrained decoding needs llguidance."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("llguidance")
    torch.set_num_threads(1)      # a busy 2-core box: one thread is several times faster than two contending
    return tiny


def _prompt(k: int) -> str:
    """A short prompt (the tiny model's tokens are bytes) listing ``k`` workers as the conductor prompt does."""
    models = "\n".join(f"Model {i}" for i in range(k))
    return f"Q: 17 * 3?\nAVAILABLE LANGUAGE MODELS:\n{models}"


def test_format_travels_with_the_checkpoint_and_governs_decoding(tiny, tmp_path):
    from conductor.learning.grpo.config import GRPOConfig
    from conductor.learning.grpo.trainer import grpo_step
    from conductor.policy.transformers_backend import TransformersBackend

    fmt = ConductorFormat(max_steps=2)
    base = formatted_base(str(tiny), fmt, tmp_path / "base")
    assert load_format(base) == fmt and formatted_base(str(tiny), fmt, tmp_path / "base") == base   # made once
    assert load_format(tiny) is None
    child, _ = grpo_step(str(base), rollout("r", "q", [1.0, 0.0]), GRPOConfig.cpu(total_iterations=2),
                         out=str(tmp_path / "it1"))
    assert load_format(child) == fmt
    assert json.loads((Path(child) / "lineage.json").read_text())["conductor_format"] == fmt.to_json()
    backend = TransformersBackend.load(child, batch_size=4)
    assert backend.conductor_format == fmt
    free_grammar = "root ::= [a-z]{1,5}"  # a caller's grammar is replaced by the checkpoint's own
    for k, params in ((3, GenerationParams(temperature=1.0, max_tokens=400, seed=1, n_workers=3)),
                      (4, GenerationParams(temperature=1.0, max_tokens=400, seed=2, grammar=free_grammar, n_workers=4))):
        (gens,) = backend.generate([_prompt(k)], 3, params)
        for g in gens:
            assert g.finish_reason == "stop", g.text
            wf = parse_workflow(g.text, n_workers=k, max_steps=2)
            assert isinstance(wf, Workflow), g.text
            assert all(s.subtask in DEFAULT_SUBTASKS for s in wf.steps)
        assert max(s.worker for g in gens for s in parse_workflow(g.text).steps) < k
    with pytest.raises(ValueError, match="GenerationParams.n_workers"):
        backend.generate([_prompt(3)], 1, GenerationParams(max_tokens=8))
    assert backend.conductor_format == fmt              # the refusal leaves the contract in place
    assert not (Path(tiny) / FORMAT_FILE).exists()


def test_only_the_grammars_choices_are_trained(tiny, tmp_path):
    """Under a decoding contract most completion tokens are forced (a vocabulary subtask after its first
    token, brackets, quotes): the loss sees exactly the choices, 3 per step of a workflow (worker, subtask,
    and "another step?" / the access list), and a GRPO step on real grammar-decoded samples counts them."""
    from conductor.decoding.vocabulary import choice_positions
    from conductor.learning.grpo.config import GRPOConfig
    from conductor.learning.grpo.trainer import grpo_step
    from conductor.policy.transformers_backend import TransformersBackend

    fmt = ConductorFormat(max_steps=2)
    base = formatted_base(str(tiny), fmt, tmp_path / "base")
    backend = TransformersBackend.load(base, batch_size=4)
    prompt = _prompt(4)
    gens = backend.generate([prompt], 4, GenerationParams(temperature=1.0, max_tokens=400, seed=5, n_workers=4))[0]
    for g in gens:
        wf = parse_workflow(g.text, n_workers=4, max_steps=2)
        choice = choice_positions(backend.llguidance_tokenizer(), fmt.grammar(4), g.token_ids)
        assert len(choice) == len(g.token_ids) and sum(choice) == 3 * len(wf.steps), (g.text, choice)
        picked = "".join(backend.tokenizer.decode([t]) for t, c in zip(g.token_ids, choice) if c)
        assert picked[0] == str(wf.steps[0].worker) and all(s.subtask[0] in picked for s in wf.steps), picked
    # a token the grammar would refuse: the rest of the completion counts as choices (not decoded under it)
    bad = backend.tokenizer("model_id = [9]", add_special_tokens=False)["input_ids"]
    assert choice_positions(backend.llguidance_tokenizer(), fmt.grammar(4), bad)[-1] is True
    group = rollout("r", "q", [1.0, 0.0, 0.5, 1.0], completions=[g.text for g in gens], prompt=prompt,
                    token_ids=[g.token_ids for g in gens], logprobs=[g.logprobs for g in gens],
                    subpool=[f"w{i}" for i in range(4)])
    _, m = grpo_step(str(base), group, GRPOConfig.cpu(total_iterations=1, max_completion_tokens=1024), out=str(tmp_path / "it1"))
    assert m["n_choice_tokens"] == sum(3 * len(parse_workflow(g.text, n_workers=4, max_steps=2).steps) for g in gens)
    assert m["n_tokens"] == sum(len(g.token_ids) for g in gens) > 4 * m["n_choice_tokens"]


def test_nightly_with_a_format_trains_promotes_and_answer_uses_the_champion(tiny, tmp_path, monkeypatch):
    """The nightly flow end to end on a tiny model: the base gets the decoding contract, every rollout parses
    under it, the metrics go to MLflow (file store) and the curves to the report, the forced promotion makes
    the trained checkpoint champion, and `conductor answer --conductor champion@REGISTRY` decodes with it."""
    pytest.importorskip("prefect")
    pytest.importorskip("mlflow")
    import os
    import subprocess
    import sys

    from conductor.lake.reader import load_trajectories
    from conductor.learning.registry import Registry
    from conductor.run.config import NightlyConfig
    from flows.nightly import nightly_flow

    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "night"
    fmt = ConductorFormat(max_steps=2)
    res = nightly_flow(NightlyConfig(
        pool=str(ROOT / "data/pools/simulated.yaml"), train_questions="gsm8k_train:1,mmlu_stem[100:101]",
        eval_questions="gsm8k_test:1,mmlu_stem[0:1]", work_dir=str(work), base=str(tiny), night="f1",
        iterations=1, questions_per_iteration=2, group_size=3, eval_samples=1, max_tokens=400,
        fewshot="none", shard_size=2, baselines=False, conductor_format=fmt.to_json(),
        grpo={"learning_rate": 1e-3, "total_iterations": 1, "warmup_ratio": 0.0, "track_kl": True},
        promotion={"alpha": 1.01, "min_improvement": -1.0, "max_domain_regression": 1.0})).to_json()
    assert res["status"] == "promoted", res
    rollouts = load_trajectories(str(work / "lake"), "nightly-f1-it0", kind="rollout")
    assert len(rollouts) == 6 and all(t.rounds[0].parse_status == "ok" for t in rollouts)
    assert all(s["subtask"] in DEFAULT_SUBTASKS for t in rollouts for s in t.rounds[0].steps)
    reg = Registry.open(str(work / "registry"))
    assert reg.champion.checkpoint_id == "nightly-f1-it0" and load_format(reg.champion.uri) == fmt
    reports = work / "reports" / "f1"
    assert (reports / "training-curves.png").read_bytes()[:4] == b"\x89PNG"
    run = json.loads((reports / "mlflow.json").read_text())
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=run["tracking_uri"])
    assert run["tracking_uri"] == (work / "mlruns").resolve().as_uri()
    assert [m.step for m in client.get_metric_history(run["run_id"], "kl_ref")] == [1]
    assert client.get_run(run["run_id"]).data.metrics["parse_rate"] == 1.0
    # the product command with the promoted champion: its grammar comes with the checkpoint
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"id": "x1", "question": "What is 6 * 7? Give the number in <answer></answer> tags.",
                                 "answer": "42"}) + "\n")
    out = tmp_path / "answers"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "conductor.cli", "answer", str(qfile), "--out", str(out),
                           "--pool", str(ROOT / "data/pools/simulated.yaml"),
                           "--conductor", f"champion@{work / 'registry'}", "--fewshot", "none", "--max-steps", "2",
                           "--max-tokens", "400"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = load_trajectories(str(out / "lake"), _only_run(out / "lake"), kind=None)
    assert rows and all(t.checkpoint_id == "nightly-f1-it0" and t.rounds[0].parse_status == "ok" for t in rows)


def _only_run(lake: Path) -> str:
    runs = {p.name.removeprefix("run_id=") for p in lake.glob("trajectories/kind=*/date=*/run_id=*")}
    assert len(runs) == 1, runs
    return runs.pop()
