"""OpenAI Batch API: a JSONL input file of chat-completion requests, one batch per model.

Submit uploads the file (``purpose="batch"``) and creates the batch on ``/v1/chat/completions`` with a 24 h
window; results come back as an output file (successes) and an error file (failed requests, and requests
left unprocessed when the batch expired or was cancelled: ``batch_expired`` / ``batch_cancelled``).
Works with any server that implements the Batch API (``openai_compatible`` workers with ``batch: true``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from conductor.execution.batch.adapters.base import BatchCompletion, BatchRequest, Outcome, Poll, register_batch_adapter
from conductor.workers.providers.base import Message
from conductor.workers.providers.shared import classify, estimate_tokens, kind_for_status, with_prefill

ENDPOINT = "/v1/chat/completions"
_OPEN = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
_CODE_KIND = {"batch_expired": "expired", "batch_cancelled": "cancelled"}


def request_body(provider: Any, messages: list[Message]) -> dict[str, Any]:
    """The JSON body ``OpenAIChat.complete`` sends for these messages (``extra_body`` merged in, as the SDK does)."""
    s = provider.worker.sampling
    msgs = ([Message("system", s.system_prompt)] if s.system_prompt else []) + list(messages)
    msgs = with_prefill(msgs, s.assistant_prefill)
    params = dict(provider.params)
    extra = params.pop("extra_body", None) or {}
    return {"messages": [{"role": m.role, "content": m.content} for m in msgs], **params, **extra}


def parse_reply(body: Any, official: bool, prompt_chars: int = 0) -> Outcome:
    """A chat-completion body from the output file -> Outcome (the synchronous parser's rules)."""
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return Outcome.failed("malformed", "reply has no choices[0].message")
    if not isinstance(text, (str, type(None))):
        return Outcome.failed("malformed", "reply content is not text")
    text = text or ""
    usage = body.get("usage") or {}
    if usage.get("prompt_tokens") is not None:
        in_tok, out_tok = int(usage["prompt_tokens"]), int(usage.get("completion_tokens") or 0)
    elif official:
        return Outcome.failed("malformed", "reply has no usage")
    else:
        in_tok, out_tok = max(1, prompt_chars // 4), estimate_tokens(text)
    cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    return Outcome(BatchCompletion(text, in_tok, out_tok, choice.get("finish_reason"), cached_input_tokens=cached))


def parse_line(line: dict[str, Any], official: bool) -> tuple[str, Outcome]:
    """One line of an output or error file -> (custom id, outcome)."""
    cid = str(line.get("custom_id"))
    resp = line.get("response")
    if resp and resp.get("status_code") == 200:
        return cid, parse_reply(resp.get("body"), official)
    if resp:
        status = int(resp.get("status_code") or 500)
        err = ((resp.get("body") or {}).get("error") or {})
        return cid, Outcome.failed(kind_for_status(status), f"HTTP {status}: {err.get('message', '')}"[:300])
    err = line.get("error") or {}
    code = str(err.get("code") or "")
    return cid, Outcome.failed(_CODE_KIND.get(code, "server"), f"{code}: {err.get('message', '')}"[:300])


@register_batch_adapter("openai", "openai_compatible")
class OpenAIBatches:
    name: ClassVar[str] = "openai"
    per_model: ClassVar[bool] = True

    def __init__(self, provider: Any):
        self.client = provider.client          # the worker's AsyncOpenAI (SDK retries off; the scheduler retries)
        self.official = bool(provider.official)
        self.who = f"openai batch ({provider.worker.name})"

    async def submit(self, requests: Sequence[BatchRequest]) -> str:
        lines = [json.dumps({"custom_id": r.custom_id, "method": "POST", "url": ENDPOINT,
                             "body": request_body(r.provider, r.messages)}, ensure_ascii=False) for r in requests]
        data = ("\n".join(lines) + "\n").encode()
        try:
            f = await self.client.files.create(file=("conductor-batch.jsonl", data, "application/jsonl"), purpose="batch")
            b = await self.client.batches.create(input_file_id=f.id, endpoint=ENDPOINT, completion_window="24h",
                                                 metadata={"created_by": "conductor"})
        except Exception as e:  # noqa: BLE001 - classified for the scheduler
            raise classify(e, self.who) from None
        return str(b.id)

    async def poll(self, batch_id: str, custom_ids: Sequence[str]) -> Poll:
        try:
            b = await self.client.batches.retrieve(batch_id)
            if b.status in _OPEN:
                return Poll(False, b.status)
            outcomes: dict[str, Outcome] = {}
            for fid in (b.output_file_id, b.error_file_id):
                if fid:
                    content = await self.client.files.content(fid)
                    for raw in content.text.splitlines():
                        if raw.strip():
                            cid, o = parse_line(json.loads(raw), self.official)
                            outcomes[cid] = o
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
        if b.status == "failed":      # the whole input was refused (validation): nothing ran
            why = "; ".join(f"{x.code}: {x.message}" for x in ((b.errors.data or []) if b.errors else []))
            for cid in custom_ids:
                outcomes.setdefault(cid, Outcome.failed("server", f"batch {batch_id} failed: {why}"[:300]))
        return Poll(True, b.status, outcomes)

    async def cancel(self, batch_id: str) -> None:
        try:
            await self.client.batches.cancel(batch_id)
        except Exception as e:  # noqa: BLE001
            raise classify(e, self.who) from None
