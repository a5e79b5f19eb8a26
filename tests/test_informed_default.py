"""The untrained default: the informed prompt, the tool rule in the grammar, cached conductor generations,
and embedded servers that start only when a call really needs them."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from conductor.decoding.grammar import workflow_grammar
from conductor.execution.cache import ResponseCache
from conductor.generation import Generation, GenerationParams
from conductor.parser import parse_workflow
from conductor.policy.cached import CachedPolicy
from conductor.policy.spec import is_embedded_checkpoint
from conductor.prompts import INFORMED_REMINDER, conductor_prompt, resolve_fewshot, role_ordinals, select_fewshot
from conductor.workers.pool import load_pool, parse_pool
from conductor.workflow import Workflow

ROOT = Path(__file__).resolve().parent.parent
LOCAL = load_pool(ROOT / "data/pools/local.yaml")
SMOL = "smollm2-135m-instruct"
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")


def _examples_block(prompt: str) -> str:
    return prompt.split("Examples, written for the models listed below:")[1].split("Now the real task.")[0]


def test_informed_examples_use_the_real_ordinals_of_their_roles():
    sub = LOCAL.full()
    roles = role_ordinals(sub)
    assert sub.workers[roles["reasoner"]].name == "qwen2.5-coder-1.5b" and sub.workers[roles["python"]].provider == "python"
    assert sub.workers[roles["reporter"]].name == "qwen2.5-coder-0.5b"      # states the printed result, faster
    text = conductor_prompt("What is 6 * 7?", sub, fewshot="informed")
    block = _examples_block(text)
    assert "{reasoner}" not in block and "{python}" not in block and "{reporter}" not in block
    assert f"model_id = [{roles['reasoner']}, {roles['python']}, {roles['reporter']}]" in block
    for reply in block.split("Reply:\n")[1:]:   # every instantiated example is a valid workflow for this pool
        assert reply.startswith("model_id = [")   # no plan line: the grammar of the informed mode has none
        wf = parse_workflow(reply.split("</example>")[0], n_workers=len(sub))
        assert isinstance(wf, Workflow), reply
    assert "Model 3: Not a language model" in text           # notes are shown
    assert text.rstrip().endswith("What is 6 * 7?\n\n" + INFORMED_REMINDER)   # question last but the reminder


def test_informed_prompt_of_two_questions_differs_only_after_the_shared_prefix():
    a = conductor_prompt("Question one?", LOCAL.full(), fewshot="informed")
    b = conductor_prompt("Another question entirely?", LOCAL.full(), fewshot="informed")
    shared = a.index("Question one?")
    assert a[:shared] == b[:shared] and shared > 0.9 * len(a)


def test_the_questions_domain_examples_come_first_and_every_example_stays():
    def first_and_count(domain):
        block = _examples_block(conductor_prompt("Q?", LOCAL.full(), fewshot="informed", domain=domain))
        return block.split("Reply:\n")[1].split("\n")[0], block.count("<example>")
    (mcq, n_mcq), (math, n_math) = first_and_count("mcq"), first_and_count("math")
    assert mcq == "model_id = [0]"                           # knowledge questions: the reasoner alone first
    assert math == "model_id = [0, 3, 1]"                    # calculations: reason and write, run, report first
    assert n_mcq == n_math == len(select_fewshot("informed"))


def test_examples_whose_roles_a_subpool_lacks_are_left_out_and_roles_can_move():
    pool = parse_pool("""
pool_id: t
workers:
  - {name: small, provider: simulated, model: s}
  - {name: big, provider: simulated, model: b, roles: [reasoner]}
""")
    text = conductor_prompt("Q?", pool.full(), fewshot="informed")
    block = _examples_block(text)
    assert "Run the program." not in block                    # no python worker: no code-and-run examples
    assert "model_id = [1]" in block                          # the reasoner is Model 1 in this pool
    assert len(block.split("<example>")) - 1 == sum(1 for e in select_fewshot("informed") if e.roles <= {"reasoner"})


def test_without_a_reporter_the_reasoner_reports():
    pool = parse_pool("""
pool_id: t
workers:
  - {name: big, provider: simulated, model: b, roles: [reasoner]}
  - {name: py, provider: python, model: cpython3}
""")
    block = _examples_block(conductor_prompt("Q?", pool.full(), fewshot="informed", domain="math"))
    assert block.split("Reply:\n")[1].startswith("model_id = [0, 1, 0]")


def test_auto_fewshot_is_informed_only_for_the_untrained_embedded_conductor():
    assert resolve_fewshot("auto", is_embedded_checkpoint("embedded:qwen2.5-coder-1.5b-instruct")) == "informed"
    assert resolve_fewshot("auto", is_embedded_checkpoint("ckpt-20261123-abc")) == "ood"
    assert resolve_fewshot("in_domain", is_embedded_checkpoint("embedded:x")) == "in_domain"


def test_grammar_keeps_tool_workers_out_of_the_first_and_last_steps():
    g = workflow_grammar(4, 3, tools=(3,))
    assert 'lm ::= "0" | "1" | "2"' in g and 'id ::= "0" | "1" | "2" | "3"' in g
    assert 'wf1 ::= "model_id = [" lm "]' in g and 'wf3 ::= "model_id = [" lm ", " id ", " lm "]' in g
    assert "lm" not in workflow_grammar(1, 2, tools=(0,))   # a pool of only tools stays usable
    assert LOCAL.full().tool_ordinals == (3,)


@needs_llama
def test_grammar_with_tools_compiles_in_llama_cpp():
    import llama_cpp

    assert llama_cpp.LlamaGrammar.from_string(workflow_grammar(4, 3, tools=(3,)), verbose=False) is not None


class CountingPolicy:
    name = "counting"

    def __init__(self):
        self.calls: list[tuple[list[str], int]] = []

    def generate(self, prompts, n, params):
        self.calls.append((list(prompts), n))
        return [[Generation(text=f"{p}#{i}#{len(self.calls)}", token_ids=[1, 2, i], logprobs=[-0.5, -0.25, -1.0],
                            finish_reason="stop") for i in range(n)] for p in prompts]


def test_cached_policy_reads_reproducible_generations_back(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    inner = CountingPolicy()
    policy = CachedPolicy(inner, cache, "embedded:x")
    greedy = GenerationParams(temperature=0.0)
    first = policy.generate(["a", "b"], 2, greedy)
    again = CachedPolicy(inner, ResponseCache(tmp_path / "cache.sqlite"), "embedded:x").generate(["b", "a", "c"], 2, greedy)
    assert inner.calls == [(["a", "b"], 2), (["c"], 2)]        # only the new prompt is generated
    assert [g.text for g in again[1]] == [g.text for g in first[0]]
    assert again[0][1].token_ids == [1, 2, 1] and again[0][1].logprobs == [-0.5, -0.25, -1.0]
    other = CachedPolicy(inner, cache, "ckpt-2").generate(["a"], 1, greedy)   # another checkpoint: no reuse
    assert other[0][0].text.endswith("#3") and len(inner.calls) == 3
    unseeded = GenerationParams(temperature=0.7, seed=None)      # fresh samples are never served from cache
    policy.generate(["a"], 1, unseeded)
    policy.generate(["a"], 1, unseeded)
    assert len(inner.calls) == 5
    grammar = GenerationParams(temperature=0.0, grammar="root ::= \"x\"")   # every parameter is in the key
    policy.generate(["a"], 1, grammar)
    assert len(inner.calls) == 6


@needs_llama
def test_reserved_embedded_server_starts_on_the_first_call_and_not_before(tmp_path):
    from conductor.execution.cache import ResponseCache
    from conductor.execution.executor import Executor
    from conductor.local.embedded import EmbeddedError, model_path
    from conductor.local.process import ServerSettings
    from conductor.local.servers import EmbeddedServers, resolve_embedded
    from conductor.trajectory import CallRecord
    from conductor.workers.providers.base import Message

    try:
        model_path(SMOL)
    except EmbeddedError as e:
        pytest.skip(str(e))
    pool = parse_pool(f"""
pool_id: t
workers:
  - {{name: a, provider: local, model: {SMOL}, base_url: "embedded://{SMOL}",
      sampling: {{temperature: 0, max_tokens: 8}}}}
""")
    with EmbeddedServers(settings=ServerSettings(n_ctx=1024)) as servers:
        resolved, _ = resolve_embedded(pool, servers, lazy=True)
        server = servers.servers[SMOL]
        assert server.process is None and resolved.workers[0].base_url == server.url   # reserved, not started
        worker = resolved.workers[0]
        msgs = [Message("user", "Say hi.")]

        async def one(executor: Executor) -> CallRecord:
            rec = CallRecord(call_id="0.0", parent_call_id=None, depth=0, step=0, worker_index=0, worker=worker.name,
                             provider=worker.provider, model=worker.model, subtask="Say hi.")
            await executor.call(worker, msgs, rec)
            await executor.aclose()
            return rec

        cache = tmp_path / "c.sqlite"
        rec = asyncio.run(one(Executor(cache=ResponseCache(cache))))
        assert rec.error is None and server.process is not None and server.process.poll() is None
        server.stop()
        assert server.process.poll() is not None
        replay = asyncio.run(one(Executor(cache=ResponseCache(cache))))   # a cache hit ...
        assert replay.cache_hit and replay.response == rec.response
        assert server.process.poll() is not None                                     # ... starts nothing


@needs_llama
def test_informed_examples_are_sentences_of_the_informed_grammar():
    """What the examples show is exactly what the grammar lets the conductor write (no plan, tools inside)."""
    import llama_cpp

    from conductor.local.embedded import EmbeddedError, model_path

    try:
        path = model_path(SMOL)
    except EmbeddedError as e:
        pytest.skip(str(e))
    sub = LOCAL.full()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=2048, verbose=False)
    grammar = llama_cpp.LlamaGrammar.from_string(
        workflow_grammar(len(sub), 3, plan_chars=0, subtask_chars=120, tools=sub.tool_ordinals), verbose=False)
    prompt = conductor_prompt("What is 6 * 7?", sub, fewshot="informed", max_steps=3)
    out = llm.create_chat_completion([{"role": "user", "content": prompt}], grammar=grammar, temperature=0,
                                     max_tokens=400)["choices"][0]["message"]["content"]
    wf = parse_workflow(out, n_workers=len(sub))
    assert isinstance(wf, Workflow), out
    assert wf.steps[0].worker not in sub.tool_ordinals and wf.steps[-1].worker not in sub.tool_ordinals
