"""Gemini through the official ``google-genai`` SDK (async client).

``thinking_budget`` maps to ``ThinkingConfig(thinking_budget=...)`` (the paper
ran Gemini 2.5 Pro at 128). Gemini bills thinking tokens as output, so output
tokens = candidates + thoughts. ``base_url`` (e.g. the emulator) goes through
``http_options``; the SDK's own retries stay off because the executor retries.
"""

from __future__ import annotations

from typing import Any

from conductor.workers.pool import Worker
from conductor.workers.providers.base import Completion, Message, ProviderError, TextSink, register_provider
from conductor.workers.providers.shared import LoopBoundClose, classify, split_system, with_prefill
from conductor.workers.secrets import get_key

_FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}


class GeminiGenerate:
    def __init__(self, worker: Worker):
        from google import genai
        from google.genai import types

        self.worker = worker
        self.types = types
        key = get_key(worker.api_key_env or "GEMINI_API_KEY", worker.name)
        http: dict[str, Any] = {"timeout": int(worker.limits.timeout_s * 1000)}
        if worker.base_url:
            http["base_url"] = worker.base_url
        self.client = genai.Client(api_key=key, http_options=types.HttpOptions(**http))
        self.closing = LoopBoundClose(self._close_client)
        s = worker.sampling
        cfg: dict[str, Any] = {"temperature": s.temperature, "max_output_tokens": s.max_tokens}
        if s.top_p is not None:
            cfg["top_p"] = s.top_p
        if s.top_k is not None:
            cfg["top_k"] = s.top_k
        if s.presence_penalty is not None:
            cfg["presence_penalty"] = s.presence_penalty
        if s.stop:
            cfg["stop_sequences"] = list(s.stop)
        if s.thinking_budget is not None:
            cfg["thinking_config"] = types.ThinkingConfig(thinking_budget=s.thinking_budget)
        self.base_config = cfg

    def request(self, messages: list[Message]) -> tuple[list[Any], Any]:
        """(contents, config) of one call; the batch adapter builds its inlined requests from the same."""
        t = self.types
        s = self.worker.sampling
        system, rest = split_system(messages, s.system_prompt)
        rest = with_prefill(rest, s.assistant_prefill)
        contents = [t.Content(role="model" if m.role == "assistant" else "user", parts=[t.Part(text=m.content)])
                    for m in rest]
        return contents, t.GenerateContentConfig(system_instruction=system, **self.base_config)

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        contents, config = self.request(messages)
        who = f"worker {self.worker.name}"
        await self.closing.arm()
        try:
            r = await self.client.aio.models.generate_content(model=self.worker.model, contents=contents, config=config)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, (KeyboardInterrupt, SystemExit)) or type(e).__name__ == "CancelledError":
                raise
            raise classify(e, who) from None
        try:
            text, in_tok, out_tok, _cached, reason = read_reply(r)
        except ValueError as e:
            raise ProviderError("malformed", f"{who}: {e}") from None
        return Completion(text, in_tok, out_tok, reason)

    async def complete_stream(self, messages: list[Message], sink: TextSink, *, sample_index: int = 0) -> Completion:
        """``complete`` through ``generate_content_stream``: each chunk's text (thoughts left out) goes to
        ``sink``; usage and the finish reason are the last chunk's that carries them."""
        contents, config = self.request(messages)
        who = f"worker {self.worker.name}"
        await self.closing.arm()
        parts: list[str] = []
        last: tuple[int, int, str | None] | None = None
        try:
            stream = await self.client.aio.models.generate_content_stream(model=self.worker.model, contents=contents,
                                                                          config=config)
            async for chunk in stream:
                try:
                    text, in_tok, out_tok, _cached, reason = read_reply(chunk)
                except ValueError:        # a chunk without usage: its text still counts
                    text, in_tok, out_tok, reason = chunk_text(chunk), -1, -1, None
                if text:
                    parts.append(text)
                    sink.delta(text)
                if in_tok >= 0:
                    last = (in_tok, out_tok, reason or (last[2] if last else None))
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, (KeyboardInterrupt, SystemExit)) or type(e).__name__ == "CancelledError":
                raise
            raise classify(e, who) from None
        if last is None:
            raise ProviderError("malformed", f"{who}: stream lacks usage_metadata")
        return Completion("".join(parts), *last)

    async def aclose(self) -> None:
        await self.closing.aclose()

    async def _close_client(self) -> None:
        try:
            await self.client.aio.aclose()
        except AttributeError:   # older SDKs have no explicit close
            pass


@register_provider("google")
def _google(worker: Worker) -> GeminiGenerate:
    return GeminiGenerate(worker)


def chunk_text(r: Any) -> str:
    """The text of a reply or stream chunk without its thoughts ('' when it has none)."""
    try:
        cands = r.candidates or []
        parts = (cands[0].content.parts or []) if cands and cands[0].content else []
        return "".join(p.text or "" for p in parts if not getattr(p, "thought", False))
    except (AttributeError, TypeError, IndexError):
        return ""


def read_reply(r: Any) -> tuple[str, int, int, int, str | None]:
    """(text without thoughts, input tokens, output tokens with thoughts, cached input tokens, finish reason) of
    a ``GenerateContentResponse``; shared by calls and batch results. ValueError when the reply is malformed."""
    try:
        cands = r.candidates or []
        parts = (cands[0].content.parts or []) if cands and cands[0].content else []
        text = "".join(p.text or "" for p in parts if not getattr(p, "thought", False))
        u = r.usage_metadata
        in_tok = int(u.prompt_token_count or 0)
        out_tok = int(u.candidates_token_count or 0) + int(u.thoughts_token_count or 0)
        cached = int(getattr(u, "cached_content_token_count", None) or 0)
        finish = cands[0].finish_reason if cands else None
    except (AttributeError, TypeError, ValueError, IndexError):
        raise ValueError("reply lacks candidates or usage_metadata") from None
    fname = getattr(finish, "value", finish)
    return text, in_tok, out_tok, cached, _FINISH.get(str(fname), str(fname).lower() if fname else None)
