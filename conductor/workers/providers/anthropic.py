"""Anthropic messages API (official ``anthropic`` SDK).

Thinking: Anthropic requires ``budget_tokens >= 1024`` when thinking is on, so a
manifest ``thinking_budget`` of 0 or None means thinking off (the paper's
constrained Claude setting), and 1..1023 is raised to 1024. With thinking on,
Anthropic rejects temperature/top_k changes and assistant prefill, so those are
left out. Without thinking, ``assistant_prefill`` is sent as the last
assistant turn and the reply continues it.
"""

from __future__ import annotations

from typing import Any

from conductor.workers.pool import Worker
from conductor.workers.providers.base import Completion, Message, ProviderError, TextSink, register_provider
from conductor.workers.providers.shared import LoopBoundClose, classify, split_system, with_prefill
from conductor.workers.secrets import get_key

MIN_THINKING_BUDGET = 1024
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "refusal": "refusal"}


class AnthropicMessages:
    def __init__(self, worker: Worker):
        import anthropic

        self.worker = worker
        key = get_key(worker.api_key_env or "ANTHROPIC_API_KEY", worker.name)
        self.client = anthropic.AsyncAnthropic(api_key=key, base_url=worker.base_url, max_retries=0,
                                               timeout=worker.limits.timeout_s)
        self.closing = LoopBoundClose(self.client.close)
        s = worker.sampling
        self.thinking = bool(s.thinking_budget)
        p: dict[str, Any] = {"model": worker.model}
        if self.thinking:
            budget = max(MIN_THINKING_BUDGET, int(s.thinking_budget or 0))
            p["thinking"] = {"type": "enabled", "budget_tokens": budget}
            p["max_tokens"] = s.max_tokens + budget     # max_tokens must exceed the thinking budget
        else:
            p["max_tokens"] = s.max_tokens
            # This SDK generation dropped the sampling keywords; the wire format still takes them.
            body: dict[str, Any] = {"temperature": min(s.temperature, 1.0)}   # Anthropic's range is 0..1
            if s.top_k is not None:
                body["top_k"] = s.top_k
            if s.top_p is not None:
                body["top_p"] = s.top_p
            p["extra_body"] = body
        if s.stop:
            p["stop_sequences"] = list(s.stop)
        self.params = p

    def _request(self, messages: list[Message]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        s = self.worker.sampling
        system, rest = split_system(messages, s.system_prompt)
        if not self.thinking:
            rest = with_prefill(rest, s.assistant_prefill)
        elif rest and rest[-1].role == "assistant":
            rest = rest[:-1]          # prefill is not allowed with thinking
        wire = [{"role": m.role, "content": m.content} for m in rest]
        return wire, ({"system": system} if system else {})

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        wire, extra = self._request(messages)
        who = f"worker {self.worker.name}"
        await self.closing.arm()
        try:
            create: Any = self.client.messages.create     # the sampling keywords travel in extra_body
            r = await create(messages=wire, **self.params, **extra)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, (KeyboardInterrupt, SystemExit)) or type(e).__name__ == "CancelledError":
                raise
            raise classify(e, who) from None
        try:
            text = "".join(b.text for b in r.content if getattr(b, "type", None) == "text")
            in_tok, out_tok = int(r.usage.input_tokens), int(r.usage.output_tokens)
        except (AttributeError, TypeError, ValueError):
            raise ProviderError("malformed", f"{who}: reply lacks text content or usage") from None
        return Completion(text, in_tok, out_tok, _STOP.get(r.stop_reason or "", r.stop_reason))

    async def complete_stream(self, messages: list[Message], sink: TextSink, *, sample_index: int = 0) -> Completion:
        """``complete`` as a message stream: text deltas go to ``sink`` as they arrive (thinking is not
        passed on); input tokens come with ``message_start``, output tokens and the stop reason at the end."""
        wire, extra = self._request(messages)
        who = f"worker {self.worker.name}"
        await self.closing.arm()
        parts: list[str] = []
        in_tok: int | None = None
        out_tok: int | None = None
        stop: str | None = None
        try:
            create: Any = self.client.messages.create
            stream = await create(messages=wire, stream=True, **self.params, **extra)
            async with stream:
                async for ev in stream:
                    kind = getattr(ev, "type", None)
                    if kind == "message_start":
                        in_tok = int(ev.message.usage.input_tokens)
                    elif kind == "content_block_delta" and getattr(ev.delta, "type", None) == "text_delta":
                        parts.append(ev.delta.text)
                        sink.delta(ev.delta.text)
                    elif kind == "message_delta":
                        stop = ev.delta.stop_reason or stop
                        out_tok = int(ev.usage.output_tokens)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, (KeyboardInterrupt, SystemExit)) or type(e).__name__ == "CancelledError":
                raise
            raise classify(e, who) from None
        if in_tok is None or out_tok is None:
            raise ProviderError("malformed", f"{who}: stream lacks usage (message_start / message_delta)")
        return Completion("".join(parts), in_tok, out_tok, _STOP.get(stop or "", stop))

    async def aclose(self) -> None:
        await self.closing.aclose()


@register_provider("anthropic")
def _anthropic(worker: Worker) -> AnthropicMessages:
    return AnthropicMessages(worker)
