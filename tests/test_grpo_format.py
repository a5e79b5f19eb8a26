"""A checkpoint's decoding contract (conductor_format.json): written on a formatted base, carried by every GRPO
step to the child, applied by the transformers backend to every generation (whatever grammar a caller
passes), with real tiny models and the real llguidance grammar engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor.grpo.format import (DEFAULT_SUBTASKS, FORMAT_FILE, ConductorFormat, formatted_base, load_format,
                                   n_workers_in)
from conductor.parser import parse_workflow
from conductor.policy.base import GenerationParams
from conductor.workflow import Workflow

from grpo_fixtures import rollout, tiny_checkpoint

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
    assert n_workers_in("no models here") is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("llguidance")
    torch.set_num_threads(1)      # a busy 2-core box: one thread is several times faster than two contending
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=3)


def _prompts() -> list[str]:
    """Short prompts (the tiny model's tokens are bytes) listing 3 and 4 workers as the conductor prompt does."""
    models = lambda k: "\n".join(f"Model {i}" for i in range(k))   # noqa: E731
    return [f"Q: 17 * 3?\nAVAILABLE LANGUAGE MODELS:\n{models(3)}", f"Q: is 221 prime?\nAVAILABLE LANGUAGE MODELS:\n{models(4)}"]


def test_format_travels_with_the_checkpoint_and_governs_decoding(tiny, tmp_path):
    from conductor.grpo.config import GRPOConfig
    from conductor.grpo.trainer import grpo_step
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
    prompts = _prompts()                  # 3 and 4 workers: one grammar per worker count
    free_grammar = "root ::= [a-z]{1,5}"  # a caller's grammar is replaced by the checkpoint's own
    for params in (GenerationParams(temperature=1.0, max_tokens=400, seed=1),
                   GenerationParams(temperature=1.0, max_tokens=400, seed=2, grammar=free_grammar)):
        out = backend.generate(prompts, 3, params)
        for prompt, gens in zip(prompts, out):
            k = n_workers_in(prompt)
            for g in gens:
                assert g.finish_reason == "stop", g.text
                wf = parse_workflow(g.text, n_workers=k, max_steps=2)
                assert isinstance(wf, Workflow), g.text
                assert all(s.subtask in DEFAULT_SUBTASKS for s in wf.steps)
    with pytest.raises(ValueError, match="lists no 'Model i'"):
        backend.generate(["no model list"], 1, GenerationParams(max_tokens=8))
    assert not (Path(tiny) / FORMAT_FILE).exists()
