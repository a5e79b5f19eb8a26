"""The workflow grammar, enforced for real: SmolLM2-135M behind a llama.cpp server decodes under it, and every
sample must parse into a valid workflow over the sub-pool (the same model writes no lists at all without it)."""

from __future__ import annotations

import importlib.util

import pytest

from conductor.decoding.grammar import workflow_grammar
from conductor.generation import GenerationParams
from conductor.parser import parse_workflow
from conductor.workflow import Workflow

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")


def test_grammar_shape_follows_pool_and_step_cap():
    g = workflow_grammar(4, 3)
    assert 'id ::= "0" | "1" | "2" | "3"' in g and "wf3 ::=" in g and "wf4" not in g
    with pytest.raises(ValueError):
        workflow_grammar(0)


@needs_llama
def test_grammar_compiles_in_llama_cpp():
    import llama_cpp

    for n, steps in ((1, 1), (3, 5), (12, 5)):
        assert llama_cpp.LlamaGrammar.from_string(workflow_grammar(n, steps), verbose=False) is not None


@needs_llama
def test_constrained_samples_always_parse(tmp_path):
    from conductor.local.embedded import installed
    from conductor.local.process import ServerSettings
    from conductor.local.servers import LlamaServer
    from conductor.policy import make_policy, parse_spec
    from conductor.prompts import conductor_prompt
    from conductor.workers.pool import load_pool

    path = installed().get("smollm2-135m-instruct")
    if path is None:
        pytest.skip("SmolLM2-135M not installed")
    sub = load_pool("data/pools/simulated.yaml").sample(3, seed=1)
    prompt = conductor_prompt("What is 17 * 3?", sub, fewshot="ood:1")
    with LlamaServer(path, alias="smol", settings=ServerSettings(n_ctx=4096), log_path=tmp_path / "s.log") as srv:
        backend = make_policy(parse_spec(f"openai:smol@{srv.url}"))
        params = GenerationParams(temperature=1.0, max_tokens=160, seed=3, grammar=workflow_grammar(len(sub), 3))
        (samples,) = backend.generate([prompt], n=3, params=params)
        backend.close()
    assert any(g.finish_reason == "stop" for g in samples), [g.text for g in samples]
    for g in samples:
        wf = parse_workflow(g.text, n_workers=len(sub), max_steps=3)
        if g.finish_reason == "length":  # the token limit can cut inside the lists; never a wrong parse
            assert not isinstance(wf, Workflow) or wf.access_mode == "binary"
            continue
        assert isinstance(wf, Workflow), f"{wf}: {g.text!r}"
        assert wf.access_mode == "binary" and wf.steps[0].access == ()
