"""Conductor sampling in-process with llama-cpp-python (GGUF on CPU, fast).

WHY our own token loop instead of ``create_chat_completion``: llama-cpp-python
only reports log-probs when the model is built with ``logits_all=True``, which
computes the vocabulary projection for every prompt token (slow with a 150k
vocabulary). Here llama.cpp evaluates, we read the last position's logits,
sample with numpy (temperature, top-p) and keep the sampled token's log-prob;
the n samples of one prompt share the prompt's KV cache (evaluated once).

Log-probs are ``log_softmax(logits / temperature)`` of the sampled token (raw
``log_softmax(logits)`` when greedy), the same convention as the transformers backend.

Constrained decoding (``GenerationParams.grammar``, GBNF): llama.cpp's own grammar
sampler (``llama_sampler_init_grammar`` on the text ``llama_cpp.LlamaGrammar``
holds) masks the candidates our loop samples from and accepts each chosen token.
The recorded log-probs stay those of the unconstrained distribution, as on the
other backends (the trainer scores sampled tokens under the unconstrained model).

Prompt-lookup speculation (greedy decoding only, ``speculate`` > 0): a conductor copies much of what it
writes from its prompt (the examples' subtasks, the list syntax), so the tokens that followed the longest
recent n-gram match (:func:`lookup_draft`) are proposed and verified in ONE batched evaluation, whose rows give
the logits after each of them. The longest prefix of the proposal that greedy decoding (under the grammar)
would have chosen is accepted, the rest of the KV cache dropped. Each accepted token is the argmax of the
logits at its position; a batched evaluation's logits differ from a single-token one's by floating-point
noise (up to ~0.2 in log-prob measured here), so a close call (best two tokens within ``NEAR_TIE``) is
re-decided on a single-token evaluation. On one thread a batch of 17 tokens costs about 6 single steps, so
every accepted draft token saves most of a decode step. Sampled decoding (temperature > 0) is never
speculated.

A prefill (``prefill``, text the assistant's turn starts with, as ``conductor.policy.prefill`` does on
transformers): it is evaluated as part of the prompt, the model continues after it, and the returned text starts
with it, so the parser, the lake and a menu's expansion (``conductor.policy.menu``) read the whole turn. A grammar
constrains what follows the prefill. Its tokens are prompt tokens here (``prompt_token_ids``), not completion
tokens: nothing trains on a llama.cpp generation's ids.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor.generation import Generation, GenerationParams
from conductor.local.prefix_cache import MIN_GAIN, MIN_SAVED_PREFIX, PrefixCache, PrefixState, common_length

if TYPE_CHECKING:
    from llama_cpp.llama_types import ChatCompletionRequestMessage


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, model_path: str | Path, *, n_ctx: int = 8192, n_threads: int | None = None, n_batch: int = 512,
                 system_prompt: str | None = None, prefix_cache: PrefixCache | None = None, speculate: int = 0,
                 prefill: str = ""):
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise FileNotFoundError(f"llama.cpp backend: {self.model_path} does not exist")
        threads = n_threads or default_threads()
        # n_threads_batch too: llama-cpp-python's default is every core, so prompt reading and verifying drafts
        # would spin a second thread against the worker server running beside it (7.5x slower when busy)
        self.llm = Llama(model_path=str(self.model_path), n_ctx=n_ctx, n_batch=n_batch, n_threads=threads,
                         n_threads_batch=threads, logits_all=False, verbose=False)
        self.system_prompt = system_prompt
        self.prefix_cache = prefix_cache
        self.prefill_tokens = 0           # prompt tokens actually evaluated (after reused prefixes)
        self.speculate = speculate        # draft tokens proposed per greedy step (0: none)
        self.prefill = prefill            # the text every assistant turn starts with (module docstring)
        self.drafted = self.accepted = 0  # draft tokens proposed / accepted so far (bench/answer_flow.py)
        self.rechecked = 0                # close calls re-decided token by token (``NEAR_TIE``)
        model = self.llm._model
        bos, eos = self.llm.token_bos(), self.llm.token_eos()
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"llama.cpp backend: {self.model_path.name} has no tokenizer.chat_template in its GGUF metadata")
        self._formatter = Jinja2ChatFormatter(template=template, eos_token=model.token_get_text(eos) if eos != -1 else "",
                                              bos_token=model.token_get_text(bos) if bos != -1 else "")
        self._n_vocab = self.llm.n_vocab()

    # ------------------------------------------------------------ helpers

    def render(self, prompt: str) -> str:
        """The chat-formatted prompt up to the assistant's turn, the prefill included."""
        messages: list[ChatCompletionRequestMessage] = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self._formatter(messages=messages).prompt + self.prefill

    def _is_end(self, token: int) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token))

    def _last_logits(self) -> Any:
        import llama_cpp
        import numpy as np

        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).astype(np.float64)

    # ------------------------------------------------------------ generation

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        import numpy as np

        rng = np.random.default_rng(params.seed)
        out: list[list[Generation]] = []
        grammar = GrammarMask(self.llm, params.grammar) if params.grammar else None
        try:
            for prompt in prompts:
                ids = self.llm.tokenize(self.render(prompt).encode("utf-8"), add_bos=False, special=True)  # the template adds any BOS it wants
                if len(ids) + 1 >= self.llm.n_ctx():
                    raise ValueError(f"llama.cpp backend: prompt of {len(ids)} tokens does not fit n_ctx={self.llm.n_ctx()}")
                self._prefill(ids)
                first_logits = self._last_logits()
                out.append([self._sample_one(ids, first_logits, params, rng, grammar) for _ in range(n)])
        finally:
            if grammar is not None:
                grammar.close()
        return out

    def _prefill(self, ids: list[int]) -> None:
        """Evaluate ``ids``, reusing what is already in the KV cache or in a saved prefix state; at least the
        last token is evaluated, for fresh logits. When this prompt shares a long prefix with the previous
        one, that prefix's state is saved (conductor/local/prefix_cache.py)."""
        llm, cache = self.llm, self.prefix_cache
        keep = common_length(llm.input_ids[: llm.n_tokens].tolist(), ids)
        if cache is not None:
            stored, shared = cache.best(ids)
            if shared > keep:   # a refused state leaves the KV cache empty: then nothing is kept
                keep = shared if self._restore(cache, stored) else common_length(llm.input_ids[: llm.n_tokens].tolist(), ids)
            elif keep >= MIN_SAVED_PREFIX and keep > shared + MIN_GAIN:
                self._save(cache, ids[:keep])
        keep = min(keep, len(ids) - 1)
        llm.n_tokens = keep               # eval() drops the KV cache past n_tokens
        llm.eval(ids[keep:])
        self.prefill_tokens += len(ids) - keep

    def _save(self, cache: PrefixCache, prefix: list[int]) -> None:
        import ctypes

        import llama_cpp

        llm = self.llm
        llm.n_tokens = len(prefix)
        llm._ctx.kv_cache_seq_rm(-1, len(prefix), -1)
        size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(llm.ctx, buf, size, 0)
        if n > 0:
            cache.put(PrefixState(tuple(prefix), bytes(buf)[:n]))

    def _restore(self, cache: PrefixCache, tokens: tuple[int, ...]) -> bool:
        """Load a saved prefix state into the KV cache; False (and the state forgotten) if llama.cpp refuses it."""
        import ctypes

        import llama_cpp

        state = cache.load(tokens)
        if state is None:
            return False
        llm = self.llm
        llm.n_tokens = 0
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        buf = (ctypes.c_uint8 * len(state.data)).from_buffer_copy(state.data)
        if llama_cpp.llama_state_seq_set_data(llm.ctx, buf, len(state.data), 0) == 0:
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
            cache.forget(tokens)
            return False
        llm.input_ids[: len(tokens)] = tokens
        llm.n_tokens = len(tokens)
        return True

    def _sample_one(self, prompt_ids: list[int], first_logits: Any, params: GenerationParams, rng: Any,
                    grammar: GrammarMask | None = None) -> Generation:
        import numpy as np

        llm = self.llm
        if grammar is not None:
            grammar.reset()
        llm.n_tokens = len(prompt_ids)           # drop the previous sample; eval() clears the KV cache past here
        budget = min(params.max_tokens, llm.n_ctx() - len(prompt_ids))
        tokens: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        pending = [first_logits]                 # logits to choose the next tokens from, in order
        draft: list[int] = []                    # what the pending rows past the first were evaluated with
        batched = False                          # whether ``pending`` came from a batched verification
        speculate = self.speculate if params.temperature <= 0 else 0
        while len(tokens) < budget:
            logits = pending.pop(0)
            scaled = logits / params.temperature if params.temperature > 0 else logits
            logp = scaled - np.logaddexp.reduce(scaled)
            if batched and _near_tie(logp):      # a close call: decide it on the token-by-token path's logits
                llm.n_tokens -= len(draft) + 1
                draft, pending, batched = [], [], False
                self.rechecked += 1
                logits = self._eval_rows([tokens[-1]])[0]
                logp = logits - np.logaddexp.reduce(logits)
            token = int(np.argmax(logp)) if params.temperature <= 0 else _sample_top_p(logp, params.top_p, rng)
            if grammar is not None:
                token = grammar.constrain(token, logp, params, rng)
            tokens.append(token)
            logprobs.append(float(logp[token]))
            if self._is_end(token) or self._stopped(tokens, params.stop):
                finish = "stop"
                break
            if grammar is not None:
                grammar.accept(token)
            if draft and draft[0] == token:      # the draft's next token is what decoding chose: its row is ready
                draft.pop(0)
                self.accepted += 1
                continue
            llm.n_tokens -= len(draft)           # a refused (or spent) draft: forget the KV entries past `token`
            draft = self._draft(prompt_ids, tokens, speculate, budget)
            pending = self._eval_rows([token, *draft])
            batched = len(pending) > 1
        text = llm.detokenize([t for t in tokens if not self._is_end(t)]).decode("utf-8", errors="ignore")
        for s in params.stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        if not all(math.isfinite(x) for x in logprobs):
            raise ValueError(f"llama.cpp backend ({self.model_path.name}): non-finite log-prob in a sampled completion")
        return Generation(text=self.prefill + text, token_ids=tokens, logprobs=logprobs if params.logprobs else None,
                          finish_reason=finish, prompt_token_ids=list(prompt_ids))

    def _stopped(self, tokens: list[int], stop: Sequence[str]) -> bool:
        if not stop:
            return False
        text = self.llm.detokenize(tokens).decode("utf-8", errors="ignore")
        return any(s in text for s in stop)

    def _draft(self, prompt_ids: list[int], tokens: list[int], speculate: int, budget: int) -> list[int]:
        """Up to ``speculate`` tokens proposed by prompt lookup, never past the token budget."""
        room = min(speculate, budget - len(tokens) - 1)
        if room <= 0:
            return []
        draft = lookup_draft([*prompt_ids, *tokens], room)
        self.drafted += len(draft)
        return draft

    def _eval_rows(self, batch: list[int]) -> list[Any]:
        """Evaluate ``batch`` after the cached context; the logits after each of its tokens, in order (one row,
        and llama.cpp's single-token path, when there is no draft)."""
        import llama_cpp
        import numpy as np

        llm = self.llm
        if len(batch) == 1:
            llm.eval(batch)
            return [self._last_logits()]
        llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
        n_past = llm.n_tokens
        llm._batch.set_batch(batch=batch, n_past=n_past, logits_all=True)
        llm._ctx.decode(llm._batch)
        llm.input_ids[n_past: n_past + len(batch)] = batch
        llm.n_tokens += len(batch)
        rows = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(len(batch), self._n_vocab))
        return list(rows.astype(np.float64))

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)      # a second close() finds nothing to close
        if llm is not None:
            llm.close()


class GrammarMask:
    """llama.cpp's grammar sampler over our own sampling loop: which tokens the GBNF allows next.

    Exact and cheap: the token drawn from the unconstrained distribution is checked alone first; only when the
    grammar rejects it is the whole vocabulary masked and the token redrawn from the allowed set. For plain
    sampling (top_p = 1) and greedy decoding the result has exactly the distribution of sampling from the
    masked, renormalised distribution (P(t) = p(t) + (1 - p(A)) p(t) / p(A) = p(t) / p(A) for allowed t); with
    top_p < 1 the vocabulary is always masked first, then top-p applies to the allowed set.
    """

    def __init__(self, llm: Any, grammar: str):
        import llama_cpp
        import numpy as np

        g = llama_cpp.LlamaGrammar.from_string(grammar, verbose=False)
        self._smpl = llama_cpp.llama_sampler_init_grammar(llm._model.vocab, g._grammar.encode("utf-8"),
                                                          g._root.encode("utf-8"))
        if not self._smpl:
            raise ValueError("llama.cpp backend: the grammar does not parse (llama_sampler_init_grammar failed)")
        dtype = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
        self._n = llm.n_vocab()
        self._all = np.zeros(self._n, dtype=dtype)
        self._ids = np.arange(self._n, dtype=np.intc)
        self._one = np.zeros(1, dtype=dtype)

    def _apply(self, data: Any) -> None:
        import ctypes

        import llama_cpp

        arr = llama_cpp.llama_token_data_array(data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
                                               size=len(data), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        self._one[0] = (token, 0.0, 0.0)
        self._apply(self._one)
        return bool(self._one["logit"][0] > -1e30)

    def allowed(self) -> Any:
        """Boolean mask over the vocabulary."""
        self._all["id"] = self._ids
        self._all["logit"] = 0.0
        self._apply(self._all)
        return self._all["logit"] > -1e30

    def constrain(self, token: int, logp: Any, params: GenerationParams, rng: Any) -> int:
        """``token`` if the grammar allows it (and top-p did not already truncate), else a redraw from the allowed set."""
        import numpy as np

        if (params.temperature <= 0 or params.top_p >= 1.0) and self.allows(token):
            return token
        ok = self.allowed()
        if not ok.any():
            raise ValueError("llama.cpp backend: the grammar allows no next token")
        masked = np.where(ok, logp, -np.inf)
        if params.temperature <= 0:
            return int(np.argmax(masked))
        return _sample_top_p(masked - np.logaddexp.reduce(masked[ok]), params.top_p, rng)

    def accept(self, token: int) -> None:
        import llama_cpp

        llama_cpp.llama_sampler_accept(self._smpl, token)

    def reset(self) -> None:
        import llama_cpp

        llama_cpp.llama_sampler_reset(self._smpl)

    def close(self) -> None:
        import llama_cpp

        smpl, self._smpl = self._smpl, None
        if smpl:
            llama_cpp.llama_sampler_free(smpl)


def default_threads() -> int:
    """All cores but one: llama.cpp's OpenMP threads spin, and on a busy 2-core machine two threads
    measured 7.5x slower than one (docs/backends.md)."""
    return max(1, (os.cpu_count() or 1) - 1)


NEAR_TIE = 0.5   # log-prob margin under which a batched row's greedy choice is re-decided token by token


def _near_tie(logp: Any) -> bool:
    """Whether the best two tokens are within ``NEAR_TIE`` of each other (a batched evaluation's logits differ
    from token-by-token ones by up to ~0.2 here, enough to flip such a choice).

    >>> import numpy as np
    >>> _near_tie(np.log(np.array([0.5, 0.45, 0.05]))), _near_tie(np.log(np.array([0.9, 0.05, 0.05])))
    (True, False)
    """
    import numpy as np

    top2 = np.partition(logp, -2)[-2:]
    return bool(top2[1] - top2[0] < NEAR_TIE)


def lookup_draft(context: list[int], n: int, max_ngram: int = 8, min_ngram: int = 2) -> list[int]:
    """The ``n`` tokens that followed the most recent earlier occurrence of the longest suffix n-gram of
    ``context`` (``max_ngram`` down to ``min_ngram`` tokens), or none.

    WHY not llama_cpp.llama_speculative.LlamaPromptLookupDecoding: it takes the first occurrence of at most a
    2-gram, which in a prompt of four examples proposes the first example's continuation, not the one being
    copied; the longest and latest match is the one a copying model follows.

    >>> lookup_draft([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2)      # longest suffix [1, 2, 3], latest earlier match
    [7, 5]
    >>> lookup_draft([1, 2, 3, 4], 3)                                # no earlier occurrence of any suffix
    []
    >>> lookup_draft([5, 6, 5, 6], 4)                                # the continuation stops at the context's end
    [5, 6]
    >>> lookup_draft([4, 4], 3, min_ngram=1)
    [4]
    """
    import numpy as np

    ids = np.asarray(context, dtype=np.int64)
    for size in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], size)
        hits = np.flatnonzero((windows == ids[-size:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + size
            return [int(t) for t in ids[start: start + n]]
    return []


def _sample_top_p(logp: Any, top_p: float, rng: Any) -> int:
    """Sample from exp(logp), restricted to the smallest set with mass >= top_p.

    >>> import numpy as np
    >>> _sample_top_p(np.log(np.array([0.7, 0.2, 0.1])), 0.5, np.random.default_rng(0))
    0
    """
    import numpy as np

    p = np.exp(logp)
    if top_p < 1.0:
        order = np.argsort(-p)
        keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
        q = p[keep] / p[keep].sum()
        return int(keep[rng.choice(len(keep), p=q)])
    return int(rng.choice(len(p), p=p / p.sum()))
