"""Conductor sampling through any OpenAI-compatible chat endpoint.

WHY: the same conductor prompt can be answered by a llama.cpp server the project
started, a ``vllm serve`` deployment, or a frontier API acting as an untrained
conductor (the paper's Table 11 baseline). Endpoints differ in what they honour:
some ignore ``n`` (we top up with single calls, each with its own seed) and some
refuse ``logprobs`` (we retry once without and remember). Token ids are only
known when the server encodes them in the logprob tokens (vLLM's
``return_tokens_as_token_ids``); otherwise ``token_ids`` is None.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conductor.generation import Generation, GenerationParams

_LOOPBACK = ("http://127.0.0.1", "http://localhost", "http://[::1]")


class EndpointError(RuntimeError):
    """The conductor's endpoint failed after the client's retries (down, refused the key, timed out).

    Infrastructure, not the workflow: the shard's questions are recorded as infra-failed and a rerun retries
    them. The message is one redacted line (endpoints echo keys in 401 bodies); the SDK exception, which
    still holds the key, is not chained.
    """

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def endpoint_error(model: str, base_url: str | None, e: BaseException) -> EndpointError:
    """A redacted one-line EndpointError for an OpenAI SDK exception."""
    import openai

    from conductor.workers.secrets import redact

    if isinstance(e, openai.AuthenticationError | openai.PermissionDeniedError):
        kind = "auth"
    elif isinstance(e, openai.APITimeoutError):
        kind = "timeout"
    elif isinstance(e, openai.APIConnectionError):
        kind = "connection"
    elif isinstance(e, openai.RateLimitError):
        kind = "rate_limited"
    elif isinstance(e, openai.InternalServerError):
        kind = "server"
    else:
        kind = "permanent"
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    where = f"{model}@{base_url}" if base_url else model
    return EndpointError(kind, redact(f"conductor endpoint {where}: {kind}: {type(e).__name__}: {text}"))


class OpenAIBackend:
    name = "openai"

    def __init__(self, model: str, base_url: str | None = None, *, api_key_env: str | None = None,
                 system_prompt: str | None = None, concurrency: int = 4, timeout_s: float = 300.0,
                 max_retries: int = 4, token_ids: bool = False):
        import openai

        from conductor.workers.secrets import register_key_env

        for name in (api_key_env, "OPENAI_API_KEY"):   # whatever key is sent is scrubbed from every error
            if name:
                register_key_env(name)
        key = os.environ.get(api_key_env, "").strip() or None if api_key_env else None
        if api_key_env and not key:
            raise ValueError(f"openai backend: environment variable {api_key_env} is not set")
        if key is None:
            if base_url is None or not base_url.startswith(_LOOPBACK):
                key = os.environ.get("OPENAI_API_KEY")
                if not key:
                    raise ValueError("openai backend: no API key (set OPENAI_API_KEY or name another variable in the spec)")
            else:
                key = "no-key-needed-on-loopback"
        self.model = model
        self.base_url = base_url
        self.system_prompt = system_prompt
        self.concurrency = max(1, concurrency)
        self.want_token_ids = token_ids
        self._logprobs_ok: bool | None = None
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries)

    def generate(self, prompts: list[str], n: int, params: GenerationParams) -> list[list[Generation]]:
        import openai

        try:
            with ThreadPoolExecutor(self.concurrency) as pool:
                return list(pool.map(lambda p: self._one_prompt(p, n, params), prompts))
        except openai.OpenAIError as e:
            raise endpoint_error(self.model, self.base_url, e) from None

    def _one_prompt(self, prompt: str, n: int, params: GenerationParams) -> list[Generation]:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": prompt}]
        gens: list[Generation] = []
        attempt = 0
        while len(gens) < n:
            seed = None if params.seed is None else params.seed + attempt
            gens.extend(self._call(messages, n - len(gens), params, seed))
            attempt += 1
            if attempt > n:   # an endpoint that returns no choices at all
                raise RuntimeError(f"openai backend: {self.model} returned {len(gens)} of {n} samples")
        return gens[:n]

    def _call(self, messages: list[dict], n: int, params: GenerationParams, seed: int | None) -> list[Generation]:
        import openai

        kwargs: dict[str, Any] = dict(model=self.model, messages=messages, temperature=params.temperature,
                                      max_tokens=params.max_tokens, top_p=params.top_p)
        if n > 1:
            kwargs["n"] = n
        if seed is not None:
            kwargs["seed"] = seed
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.grammar:  # llama.cpp's server reads a GBNF grammar from the request body
            kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "grammar": params.grammar}
        want_lp = params.logprobs and self._logprobs_ok is not False
        if want_lp:
            kwargs["logprobs"] = True
            if self.want_token_ids:
                kwargs["extra_body"] = {**kwargs.get("extra_body", {}), "return_tokens_as_token_ids": True}
        probing = want_lp and self._logprobs_ok is None
        # While logprob support is unknown, probe without the client's retries: llama.cpp's server answers
        # 500 (not 400) for logprobs without logits_all, and retrying that only wastes back-off time.
        client = self.client.with_options(max_retries=0) if probing else self.client
        try:
            resp = client.chat.completions.create(**kwargs)
        except openai.OpenAIError as e:
            if not probing:
                raise
            if "logprob" in str(e).lower():
                self._logprobs_ok = False
                kwargs.pop("logprobs")
                kwargs.get("extra_body", {}).pop("return_tokens_as_token_ids", None)
            resp = self.client.chat.completions.create(**kwargs)   # with the normal retry policy
        gens = []
        for choice in resp.choices:
            content = getattr(choice.logprobs, "content", None) if choice.logprobs is not None else None
            logprobs = [float(t.logprob) for t in content] if content else None
            if want_lp and logprobs is not None:
                self._logprobs_ok = True
            ids = _token_ids(content) if content else None
            gens.append(Generation(text=choice.message.content or "", token_ids=ids, logprobs=logprobs,
                                   finish_reason=choice.finish_reason))
        return gens

    def close(self) -> None:
        self.client.close()


def _token_ids(content: list[Any]) -> list[int] | None:
    """Ids from vLLM's ``token_id:123`` logprob tokens; None when the server sent plain text tokens.

    >>> from types import SimpleNamespace as S
    >>> _token_ids([S(token="token_id:5"), S(token="token_id:9")])
    [5, 9]
    >>> _token_ids([S(token="hello")]) is None
    True
    """
    ids = []
    for t in content:
        tok = getattr(t, "token", "")
        if not tok.startswith("token_id:"):
            return None
        try:
            ids.append(int(tok.removeprefix("token_id:")))
        except ValueError:
            return None
    return ids
