"""Anthropic Message Batches: many models in one batch, results streamed as JSONL by custom id.

Each request's ``params`` are exactly what ``AnthropicMessages.complete`` sends (system split out, prefill
unless thinking, sampling keywords that the SDK carries in ``extra_body`` written into the params).
Results: ``succeeded`` (a Message), ``errored`` (an error object), ``canceled``, ``expired``.
Anthropic reports prompt-cache reads apart from ``input_tokens``; here they are added back into the input
tokens and priced at the cached rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from conductor.execution.batch.adapters.base import BatchCompletion, BatchRequest, Outcome, Poll, register_batch_adapter
from conductor.workers.providers.anthropic import _STOP
from conductor.workers.providers.base import Message
from conductor.workers.providers.shared import classify, split_system, with_prefill

_ERROR_KIND = {"invalid_request_error": "permanent", "not_found_error": "permanent", "request_too_large": "permanent",
               "authentication_error": "auth", "permission_error": "auth", "billing_error": "auth",
               "rate_limit_error": "rate_limited", "api_error": "server", "overloaded_error": "server",
               "timeout_error": "timeout"}


def request_params(provider: Any, messages: list[Message]) -> dict[str, Any]:
    s = provider.worker.sampling
    system, rest = split_system(messages, s.system_prompt)
    if not provider.thinking:
        rest = with_prefill(rest, s.assistant_prefill)
    elif rest and rest[-1].role == "assistant":
        rest = rest[:-1]
    params = dict(provider.params)
    extra = params.pop("extra_body", None) or {}
    out = {**params, **extra, "messages": [{"role": m.role, "content": m.content} for m in rest]}
    if system:
        out["system"] = system
    return out


def parse_result(result: Any) -> Outcome:
    kind = getattr(result, "type", None)
    if kind == "succeeded":
        m = result.message
        try:
            text = "".join(b.text for b in m.content if getattr(b, "type", None) == "text")
            u = m.usage
            cached = int(getattr(u, "cache_read_input_tokens", None) or 0)
            written = int(getattr(u, "cache_creation_input_tokens", None) or 0)
            in_tok, out_tok = int(u.input_tokens) + cached + written, int(u.output_tokens)
        except (AttributeError, TypeError, ValueError):
            return Outcome.failed("malformed", "reply lacks text content or usage")
        return Outcome(BatchCompletion(text, in_tok, out_tok, _STOP.get(m.stop_reason or "", m.stop_reason),
                                       cached_input_tokens=cached))
    if kind == "errored":
        err = getattr(getattr(result, "error", None), "error", None)
        etype = str(getattr(err, "type", "api_error"))
        return Outcome.failed(_ERROR_KIND.get(etype, "server"), f"{etype}: {getattr(err, 'message', '')}"[:300])
    if kind in ("canceled", "expired"):
        return Outcome.failed("cancelled" if kind == "canceled" else "expired", f"request {kind}")
    return Outcome.failed("malformed", f"unknown result type {kind!r}")


@register_batch_adapter("anthropic")
class AnthropicBatches:
    name: ClassVar[str] = "anthropic"
    per_model: ClassVar[bool] = False

    def __init__(self, provider: Any):
        self.client = provider.client
        self.who = f"anthropic batch ({provider.worker.name})"

    async def submit(self, requests: Sequence[BatchRequest]) -> str:
        reqs = [{"custom_id": r.custom_id, "params": request_params(r.provider, r.messages)} for r in requests]
        try:
            b = await self.client.messages.batches.create(requests=reqs)
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
        return str(b.id)

    async def poll(self, batch_id: str, custom_ids: Sequence[str]) -> Poll:
        try:
            b = await self.client.messages.batches.retrieve(batch_id)
            if b.processing_status != "ended":
                return Poll(False, b.processing_status)
            outcomes: dict[str, Outcome] = {}
            async for line in await self.client.messages.batches.results(batch_id):
                outcomes[line.custom_id] = parse_result(line.result)
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
        return Poll(True, b.processing_status, outcomes)

    async def cancel(self, batch_id: str) -> None:
        try:
            await self.client.messages.batches.cancel(batch_id)
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
