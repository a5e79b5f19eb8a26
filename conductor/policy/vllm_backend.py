"""Conductor sampling with vLLM's offline batch engine (the production path on GPU).

WHY: GRPO groups are many samples of the same prompt; vLLM batches them with
prefix caching, so a whole rollout shard is one ``llm.generate`` call. The chat
template is applied with the engine's own tokenizer, ``SamplingParams(n=...,
logprobs=0)`` returns exactly the sampled tokens' log-probs, and the engine is
asked for ``processed_logprobs`` (after temperature/top-p) when it supports the
option, to match the other backends' convention. vLLM is imported only here.

Constrained decoding (``GenerationParams.grammar``, the project's GBNF workflow
grammar): vLLM's structured outputs, ``SamplingParams(structured_outputs=
StructuredOutputsParams(grammar=...))`` (vLLM >= 0.10.2; the older
``guided_decoding=GuidedDecodingParams(grammar=...)`` before that, removed in
0.12). Its default xgrammar backend reads GBNF (llguidance's reads it too).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import replace
from typing import Any

from conductor.generation import Generation, GenerationParams


class VLLMBackend:
    name = "vllm"

    def __init__(self, model: str, *, tokenizer: str | None = None, system_prompt: str | None = None,
                 max_model_len: int = 8192, seed: int = 0, dtype: str = "auto", gpu_memory_utilization: float = 0.85,
                 tensor_parallel_size: int = 1, enable_prefix_caching: bool = True, **engine_kwargs: Any):
        from vllm import LLM

        kwargs: dict[str, Any] = dict(model=model, tokenizer=tokenizer or model, max_model_len=max_model_len, seed=seed,
                                      dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                                      enable_prefix_caching=enable_prefix_caching, **engine_kwargs)
        if _has_gpu():
            kwargs.setdefault("gpu_memory_utilization", gpu_memory_utilization)
        try:
            self.llm = LLM(**kwargs, logprobs_mode="processed_logprobs")
        except (TypeError, ValueError) as e:
            if "logprobs_mode" not in str(e):
                raise
            self.llm = LLM(**kwargs)   # older vLLM: log-probs of the raw model distribution
        self.model = model
        self.system_prompt = system_prompt
        self.tokenizer = self.llm.get_tokenizer()

    def render(self, prompt: str) -> str:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def sampling_params(self, n: int, params: GenerationParams) -> Any:
        from vllm import SamplingParams

        return SamplingParams(**sampling_kwargs(n, params))

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        texts = [self.render(p) for p in prompts]
        # vLLM refuses n > 1 with greedy decoding; greedy samples are identical, so decode once and copy.
        copies = n if params.temperature == 0 and n > 1 else 1
        outputs = self.llm.generate(texts, self.sampling_params(n // copies, params), use_tqdm=False)
        result: list[list[Generation]] = []
        for request in outputs:       # vLLM returns outputs in the order of the prompts
            gens = []
            for c in request.outputs:
                ids = list(c.token_ids)
                logprobs = _chosen_logprobs(ids, c.logprobs) if params.logprobs else None
                gens.append(Generation(text=c.text, token_ids=ids, logprobs=logprobs, finish_reason=c.finish_reason,
                                       prompt_token_ids=list(request.prompt_token_ids or [])))
            result.append([replace(g) for g in gens for _ in range(copies)])
        return result

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        del llm


def sampling_kwargs(n: int, params: GenerationParams, sampling_module: Any = None) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments; a grammar becomes vLLM's structured-outputs constraint.

    ``sampling_module`` is ``vllm.sampling_params`` (imported when None); its ``StructuredOutputsParams``
    (vLLM >= 0.10.2) is preferred, else the older ``GuidedDecodingParams``.
    """
    kwargs: dict[str, Any] = dict(n=n, temperature=params.temperature, top_p=params.top_p,
                                  max_tokens=params.max_tokens, seed=params.seed, stop=list(params.stop) or None,
                                  logprobs=0 if params.logprobs else None)
    if params.grammar:
        if sampling_module is None:
            sampling_module = importlib.import_module("vllm.sampling_params")
        if hasattr(sampling_module, "StructuredOutputsParams"):
            kwargs["structured_outputs"] = sampling_module.StructuredOutputsParams(grammar=params.grammar)
        elif hasattr(sampling_module, "GuidedDecodingParams"):
            kwargs["guided_decoding"] = sampling_module.GuidedDecodingParams(grammar=params.grammar)
        else:
            raise ValueError("vllm backend: this vLLM has neither StructuredOutputsParams nor GuidedDecodingParams; "
                             "constrained decoding needs vLLM >= 0.6")
    return kwargs


def _chosen_logprobs(token_ids: list[int], per_position: Any) -> list[float] | None:
    """The sampled token's log-prob at each position (vLLM always includes it, even with logprobs=0).

    >>> from types import SimpleNamespace as S
    >>> _chosen_logprobs([7, 3], [{7: S(logprob=-0.5)}, {3: S(logprob=-1.25), 9: S(logprob=-0.1)}])
    [-0.5, -1.25]
    """
    if per_position is None:
        return None
    out = []
    for tid, entry in zip(token_ids, per_position):
        lp = entry[tid].logprob
        if not math.isfinite(lp):
            raise ValueError(f"vllm backend: non-finite log-prob for token {tid}")
        out.append(float(lp))
    if len(out) != len(token_ids):
        raise ValueError(f"vllm backend: {len(out)} log-probs for {len(token_ids)} tokens")
    return out


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
