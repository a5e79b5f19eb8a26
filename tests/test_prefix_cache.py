"""Saved prompt-prefix KV states (conductor/local/prefix_cache.py): the store on its own, then the llama.cpp
conductor backend on the smallest real model (SmolLM2-135M), where a restored prefix must give exactly the
greedy output of a full prefill while evaluating only the prompt's new tokens."""

from __future__ import annotations

import importlib.util
import time

import pytest

from conductor.local import embedded
from conductor.local.prefix_cache import MAGIC, PrefixCache, PrefixState
from conductor.policy import GenerationParams
from conductor.run.runtime import LoadOnUse

SMOL = "smollm2-135m-instruct"


def test_the_best_prefix_is_the_one_sharing_most_tokens_and_survives_a_new_process(tmp_path):
    cache = PrefixCache(tmp_path / "p")
    cache.put(PrefixState((1, 2, 3, 4), b"four"))
    cache.put(PrefixState((1, 2, 9), b"nine"))
    assert cache.best([1, 2, 3, 7]) == ((1, 2, 3, 4), 3)
    assert cache.best([5]) == ((), 0)
    again = PrefixCache(tmp_path / "p")                      # a later run reads the files
    tokens, shared = again.best((1, 2, 9, 9))
    assert (tokens, shared) == ((1, 2, 9), 3) and again.load(tokens).data == b"nine"
    again.forget(tokens)
    assert PrefixCache(tmp_path / "p").best((1, 2, 9)) == ((1, 2, 3, 4), 2)
    assert not list((tmp_path / "p").glob("*.part"))       # written atomically


def test_only_the_newest_files_are_kept_and_foreign_files_are_ignored(tmp_path):
    cache = PrefixCache(tmp_path, max_files=2)
    for i in range(4):
        cache.put(PrefixState((i, i, i), bytes([i])))
        time.sleep(0.02)                                    # distinct modification times
    (tmp_path / "junk.kv").write_bytes(b"not a state")
    (tmp_path / "short.kv").write_bytes(MAGIC + (9).to_bytes(4, "little") + b"\x00")
    kept = PrefixCache(tmp_path)
    assert kept.best((3, 3, 3))[1] == 3 and kept.best((2, 2, 2))[1] == 3
    assert kept.best((0, 0, 0))[1] == 0 and kept.best((1, 1, 1))[1] == 0


def test_the_embedded_conductor_is_not_loaded_until_it_generates():
    made = []

    class Echo:
        def generate(self, prompts, n, params):
            return [[p] * n for p in prompts]

    lazy = LoadOnUse(lambda: made.append(1) or Echo())
    assert not made and lazy.generation_batch == 1
    assert lazy.generate(["a"], 2, None) == [["a", "a"]] and lazy.generate(["b"], 1, None) == [["b"]]
    assert made == [1]
    lazy.close()


@pytest.fixture()
def smol():
    """A factory of llama.cpp conductor backends on SmolLM2-135M (optionally with a prefix cache)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python not installed")
    from conductor.policy.llamacpp_backend import LlamaCppBackend

    try:
        path = embedded.model_path(SMOL)
    except embedded.EmbeddedError as e:
        pytest.skip(str(e))
    made = []
    yield lambda cache=None: made.append(LlamaCppBackend(path, n_ctx=2048, n_threads=1, prefix_cache=cache)) or made[-1]
    for backend in made:
        backend.close()


GREEDY = GenerationParams(temperature=0.0, max_tokens=12)


def greedy(backend, prompt: str) -> str:
    return backend.generate([prompt], 1, GREEDY)[0][0].text


def n_tokens(backend, prompt: str) -> int:
    return len(backend.llm.tokenize(backend.render(prompt).encode(), add_bos=False, special=True))


def test_a_restored_prefix_gives_the_full_prefill_greedy_output_and_skips_the_prefix(tmp_path, smol):
    rules = " ".join(f"Rule {i}: answer briefly and in English, with one short sentence." for i in range(40))
    prompts = [f"{rules}\n\nQuestion: {q}" for q in ("What colour is the sky?", "What is two plus two?",
                                                    "Name a large animal.")]
    plain = smol()
    expected = [greedy(plain, p) for p in prompts]

    first = smol(PrefixCache(tmp_path))
    assert [greedy(first, p) for p in prompts[:2]] == expected[:2]
    assert len(list(tmp_path.glob("*.kv"))) == 1           # the two prompts' shared prefix, saved at the second

    later = smol(PrefixCache(tmp_path))                    # a new run
    assert greedy(later, prompts[2]) == expected[2]
    assert later.prefill_tokens < n_tokens(later, prompts[2]) // 4   # only the question was read


def test_a_state_llama_cpp_refuses_is_deleted_and_the_prompt_read_in_full(tmp_path, smol):
    prompt = " ".join(f"Rule {i}: answer briefly." for i in range(60)) + "\n\nQuestion: What colour is the sky?"
    expected = greedy(smol(), prompt)
    backend = smol(PrefixCache(tmp_path))
    ids = backend.llm.tokenize(backend.render(prompt).encode(), add_bos=False, special=True)
    backend.prefix_cache.put(PrefixState(tuple(ids[:300]), b"\x01\x00\x00\x00" + b"not a kv state" * 50))
    assert greedy(backend, prompt) == expected
    assert backend.prefill_tokens == len(ids) and not list(tmp_path.glob("*.kv"))
