"""Gemini batch mode (``models/{model}:batchGenerateContent``) with inlined requests, one job per model.

Each inlined request carries the same contents and ``GenerateContentConfig`` as ``GeminiGenerate.complete``
(the SDK turns both into the same wire JSON) and ``metadata.custom_id``; responses come back in request
order with their metadata, so they are matched by custom id, falling back to position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from conductor.execution.batch.adapters.base import BatchCompletion, BatchRequest, Outcome, Poll, register_batch_adapter
from conductor.workers.providers.base import Message
from conductor.workers.providers.google import read_reply
from conductor.workers.providers.shared import classify, kind_for_status

_ENDED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
                    "JOB_STATE_PARTIALLY_SUCCEEDED"})
# google.rpc.Code values of a request's error inside a batch
_GRPC_KIND = {1: "cancelled", 2: "server", 3: "permanent", 4: "expired", 5: "permanent", 7: "auth", 8: "rate_limited",
              9: "permanent", 11: "permanent", 13: "server", 14: "server", 16: "auth"}


def inlined_request(provider: Any, custom_id: str, messages: list[Message]) -> Any:
    contents, config = provider.request(messages)
    return provider.types.InlinedRequest(contents=contents, config=config, metadata={"custom_id": custom_id})


def parse_response(r: Any) -> Outcome:
    try:
        text, in_tok, out_tok, cached, reason = read_reply(r)
    except ValueError as e:
        return Outcome.failed("malformed", str(e))
    return Outcome(BatchCompletion(text, in_tok, out_tok, reason, cached_input_tokens=cached))


def error_outcome(err: Any) -> Outcome:
    code = int(getattr(err, "code", None) or 13)
    kind = kind_for_status(code) if code >= 100 else _GRPC_KIND.get(code, "server")
    return Outcome.failed(kind, f"code {code}: {getattr(err, 'message', '')}"[:300])


@register_batch_adapter("google")
class GeminiBatches:
    name: ClassVar[str] = "google"
    per_model: ClassVar[bool] = True

    def __init__(self, provider: Any):
        self.client = provider.client
        self.model = provider.worker.model
        self.who = f"gemini batch ({provider.worker.name})"

    async def submit(self, requests: Sequence[BatchRequest]) -> str:
        src = [inlined_request(r.provider, r.custom_id, r.messages) for r in requests]
        try:
            job = await self.client.aio.batches.create(model=self.model, src=src,
                                                       config={"display_name": "conductor-batch"})
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
        return str(job.name)

    async def poll(self, batch_id: str, custom_ids: Sequence[str]) -> Poll:
        try:
            job = await self.client.aio.batches.get(name=batch_id)
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
        state = str(getattr(job.state, "value", job.state))
        if state not in _ENDED:
            return Poll(False, state)
        outcomes: dict[str, Outcome] = {}
        responses = (job.dest.inlined_responses or []) if job.dest else []
        for i, r in enumerate(responses):
            cid = (r.metadata or {}).get("custom_id") or (custom_ids[i] if i < len(custom_ids) else None)
            if cid is None:
                continue
            if r.error is not None:
                outcomes[cid] = error_outcome(r.error)
            elif r.response is not None:
                outcomes[cid] = parse_response(r.response)
        if state == "JOB_STATE_FAILED" and job.error is not None:
            for cid in custom_ids:
                outcomes.setdefault(cid, Outcome.failed("server", f"batch failed: {job.error.message}"[:300]))
        return Poll(True, state, outcomes)

    async def cancel(self, batch_id: str) -> None:
        try:
            await self.client.aio.batches.cancel(name=batch_id)
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
