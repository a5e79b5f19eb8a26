"""A transformers conductor whose assistant turn starts with a fixed text, optionally constrained after it.

WHY: an untrained 135M model almost never writes a parseable workflow (measured by the finished simulated-pool
experiment, docs/learning.md: 0 of 32 samples at T = 1.0), so GRPO would get no signal. Prefilling the turn with a one-step ``subtasks`` and
``access_list`` and an open ``model_id = [`` (``ONE_STEP_PREFILL``; the parser accepts the three lists in any
order) leaves the model only the worker to choose: a routing policy, which is what the simulated and replay
pools can check. ``IndexConstraint`` then lets it write only a worker index, ``]`` and end of turn, so every
sample parses and the signal is the routing choice alone.

The prefix is part of the returned completion (text and token ids), so the rows show exactly what was parsed and
the trainer trains on the very sequence that was sampled; log-probs are left out, so the trainer recomputes them
under the same weights (on-policy, ratio 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conductor.generation import Generation, GenerationParams

if TYPE_CHECKING:
    from conductor.policy.transformers_backend import TransformersBackend

# The parser finds the three lists in any order: this prefix fixes a one-step subtask and access list and
# leaves the worker choice (and the closing of the list) to the model.
ONE_STEP_PREFILL = 'subtasks = ["Answer the user question in the format it asks for."]\naccess_list = [[]]\nmodel_id = ['


class IndexConstraint:
    """After the prefill, the model may write only one index (a worker, or a menu entry), then ``]``, then end of turn.

    A transformers ``LogitsProcessor`` (constrained decoding, like the product's workflow grammar for the embedded
    conductor). Only the allowed tokens are masked; the trainer scores the sampled tokens under the unconstrained
    model, as grammar-constrained RL usually does. ``start`` is the prompt length (prefill included) of the batch
    being generated, set by ``PrefilledBackend``.
    """

    def __init__(self, tokenizer: Any, n_workers: int, eos_id: int):
        ids = [tokenizer(str(i), add_special_tokens=False)["input_ids"] for i in range(n_workers)]
        close = tokenizer("]", add_special_tokens=False)["input_ids"]
        if any(len(x) != 1 for x in ids) or len(close) != 1:
            raise ValueError("index constraint: needs single-token worker indices and ']' in this tokenizer")
        self.allowed: list[list[int]] = [[x[0] for x in ids], close, [eos_id]]
        self.start: int | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        step = input_ids.shape[1] - self.start if self.start is not None else 0
        allowed = self.allowed[min(step, len(self.allowed) - 1)]
        mask = torch.full_like(scores, float("-inf"))
        mask[:, allowed] = 0.0
        return scores + mask


class PrefilledBackend:
    """``inner`` (a ``TransformersBackend``) with every assistant turn started by ``prefill`` (module docstring).

    The prefix's tokens are returned as the first completion tokens, so the trainer (which tokenises prompt +
    completion ids exactly as the backend renders them) sees the very sequence that was sampled.
    """

    name = "transformers+prefill"

    def __init__(self, inner: TransformersBackend, prefill: str, constraint: IndexConstraint | None = None):
        self.inner = inner
        self.prefill = prefill
        self.constraint = constraint
        if constraint is not None:
            from transformers import LogitsProcessorList

            inner.generate_kwargs["logits_processor"] = LogitsProcessorList([constraint])

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        import torch

        if not self.prefill:
            return self.inner.generate(prompts, n, params)
        out: list[list[Generation]] = [[] for _ in prompts]
        if params.seed is not None:
            torch.manual_seed(params.seed)
        for i, p in enumerate(prompts):
            rendered, pre_ids, length = self._prefilled(p)
            bs = self.inner.batch_size
            for s in range(0, n, bs):   # one prompt per batch: its prefill is computed once (shared=True)
                if self.constraint is not None:
                    self.constraint.start = length
                gens = self.inner._generate_batch([rendered] * min(bs, n - s), params, shared=True)
                out[i] += [Generation(text=self.prefill + g.text, token_ids=list(pre_ids) + list(g.token_ids or []),
                                      logprobs=None, finish_reason=g.finish_reason) for g in gens]
        return out

    def _prefilled(self, prompt: str) -> tuple[str, list[int], int]:
        """(the rendered prompt with the prefill appended, the prefill's token ids, the length of both in tokens);
        refused if the prefill would
        change how the prompt itself is tokenised (the trainer would then see another sequence)."""
        tok = self.inner.tokenizer
        rendered = self.inner.render(prompt)
        base = tok(rendered, add_special_tokens=False)["input_ids"]
        full = tok(rendered + self.prefill, add_special_tokens=False)["input_ids"]
        if full[:len(base)] != base:
            raise ValueError("prefill changes the tokenisation of the prompt; choose another prefill")
        return rendered + self.prefill, list(full[len(base):]), len(full)

    def close(self) -> None:
        return None
