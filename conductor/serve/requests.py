"""Request bodies -> one ``ServeRequest``: validated, with a clear error for everything not honoured.

Honoured: ``n`` (independent workflows), ``temperature`` and ``seed`` (the conductor's sampling), ``max_tokens``
/ ``max_completion_tokens`` / ``max_output_tokens`` (the answer is cut there, finish_reason ``length``),
``stop`` (the answer is cut at the first stop sequence), ``stream`` and ``stream_options.include_usage``,
``user`` (ignored). Refused with ``unsupported_parameter``: tools, function calls, logprobs, response formats,
audio, and any non-text content. The per-request controls live in one body field, ``conductor``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from conductor.serve.errors import APIError, bad_controls, invalid, unsupported

CONTROLS_FIELD = "conductor"
TRACE_HEADER = "x-conductor-trace"
_UNSUPPORTED_CHAT = ("tools", "tool_choice", "functions", "function_call", "logprobs", "top_logprobs",
                     "response_format", "audio", "modalities", "prediction", "logit_bias", "parallel_tool_calls")
_IGNORED = ("user", "store", "metadata", "service_tier", "top_p", "frequency_penalty", "presence_penalty",
            "reasoning_effort", "safety_identifier", "prompt_cache_key")
_CONTROL_KEYS = ("workers", "exclude_workers", "max_cost", "max_steps", "trace")


@dataclass
class Controls:
    workers: list[str] | None = None        # allowed workers (pool names), in the order shown to the conductor
    exclude_workers: list[str] = field(default_factory=list)
    max_cost: float | None = None           # dollars per request, enforced during execution
    max_steps: int | None = None
    trace: bool = False


@dataclass
class ServeRequest:
    endpoint: str                           # "chat" | "responses"
    model: str
    question: str
    n: int = 1
    temperature: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    controls: Controls = field(default_factory=Controls)


def _num(body: dict[str, Any], name: str, low: float, high: float, integer: bool = False) -> Any:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and not isinstance(v, int)):
        raise invalid(f"{name} must be {'an integer' if integer else 'a number'}", "invalid_type", name)
    if not math.isfinite(v) or not low <= v <= high:
        raise invalid(f"{name} must be between {low:g} and {high:g} (got {v})", "invalid_value", name)
    return v


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if not isinstance(p, dict) or p.get("type") not in ("text", "input_text", "output_text"):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise invalid(f"{where}[{i}]: only text content is supported (got {kind!r})",
                              "unsupported_content", where)
            if not isinstance(p.get("text"), str):
                raise invalid(f"{where}[{i}].text must be a string", "invalid_type", where)
            parts.append(p["text"])
        return "\n".join(parts)
    if content is None:
        return ""
    raise invalid(f"{where} must be a string or a list of text parts", "invalid_type", where)


def question_from_messages(messages: Any, param: str = "messages") -> str:
    """The question the conductor answers: the last user turn, with any system text and earlier turns above it.

    >>> question_from_messages([{"role": "user", "content": "What is 2+2?"}])
    'What is 2+2?'
    >>> print(question_from_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]))
    Be brief.
    <BLANKLINE>
    Hi
    """
    if not isinstance(messages, list) or not messages:
        raise invalid(f"{param} must be a non-empty list of messages", "empty_messages", param)
    system: list[str] = []
    turns: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise invalid(f"{param}[{i}] must be an object with role and content", "invalid_type", param)
        role = m.get("role", "user")
        if role not in ("system", "developer", "user", "assistant"):
            raise invalid(f"{param}[{i}].role {role!r} is not supported (system, developer, user, assistant)",
                          "unsupported_role", param)
        if m.get("tool_calls") or m.get("function_call"):
            raise unsupported(f"{param}[{i}].tool_calls")
        text = _text_of(m.get("content"), f"{param}[{i}].content")
        if role in ("system", "developer"):
            system.append(text)
        else:
            turns.append((role, text))
    if not turns or turns[-1][0] != "user" or not turns[-1][1].strip():
        raise invalid(f"{param} must end with a non-empty user message", "empty_messages", param)
    head = "\n\n".join(s for s in system if s.strip())
    if len(turns) > 1:
        earlier = "\n".join(f"{r}: {t}" for r, t in turns[:-1])
        head = f"{head}\n\nConversation so far:\n{earlier}".strip()
    return f"{head}\n\n{turns[-1][1]}" if head else turns[-1][1]


def _names(v: Any, param: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise bad_controls(f"{param} must be a list of worker names", param)
    return list(v)


def parse_controls(body: dict[str, Any], trace_header: str | None) -> Controls:
    c = Controls()
    raw = body.get(CONTROLS_FIELD)
    if raw is not None:
        if not isinstance(raw, dict):
            raise bad_controls(f"{CONTROLS_FIELD} must be an object with any of {', '.join(_CONTROL_KEYS)}",
                               CONTROLS_FIELD)
        extra = sorted(set(raw) - set(_CONTROL_KEYS))
        if extra:
            raise bad_controls(f"{CONTROLS_FIELD}: unknown control {extra[0]!r} (known: {', '.join(_CONTROL_KEYS)})",
                               f"{CONTROLS_FIELD}.{extra[0]}")
        if raw.get("workers") is not None:
            c.workers = _names(raw["workers"], f"{CONTROLS_FIELD}.workers")
            if not c.workers:
                raise bad_controls(f"{CONTROLS_FIELD}.workers must name at least one worker", f"{CONTROLS_FIELD}.workers")
        if raw.get("exclude_workers") is not None:
            c.exclude_workers = _names(raw["exclude_workers"], f"{CONTROLS_FIELD}.exclude_workers")
        mc = raw.get("max_cost")
        if mc is not None:
            if isinstance(mc, bool) or not isinstance(mc, int | float) or not math.isfinite(mc) or mc <= 0:
                raise bad_controls(f"{CONTROLS_FIELD}.max_cost must be a positive number of dollars",
                                   f"{CONTROLS_FIELD}.max_cost")
            c.max_cost = float(mc)
        ms = raw.get("max_steps")
        if ms is not None:
            if isinstance(ms, bool) or not isinstance(ms, int) or ms < 1:
                raise bad_controls(f"{CONTROLS_FIELD}.max_steps must be a positive integer", f"{CONTROLS_FIELD}.max_steps")
            c.max_steps = ms
        tr = raw.get("trace")
        if tr is not None and not isinstance(tr, bool):
            raise bad_controls(f"{CONTROLS_FIELD}.trace must be true or false", f"{CONTROLS_FIELD}.trace")
        c.trace = bool(tr)
    if trace_header is not None and trace_header.strip().lower() in ("enabled", "true", "1", "yes", "on"):
        c.trace = True
    return c


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise invalid("stop must be a non-empty string or a list of up to 4 of them", "invalid_value", "stop")
    return stop


def _common(body: dict[str, Any], endpoint: str, max_n: int, trace_header: str | None) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model is required (e.g. 'conductor')", "missing_model", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("stream must be true or false", "invalid_type", "stream")
    temperature = _num(body, "temperature", 0.0, 2.0)
    seed = _num(body, "seed", -(2**63), 2**63 - 1, integer=True)
    return {"endpoint": endpoint, "model": model, "stream": stream, "temperature": temperature, "seed": seed,
            "controls": parse_controls(body, trace_header)}


def parse_chat(body: Any, *, max_n: int, max_chars: int, trace_header: str | None = None) -> ServeRequest:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", "invalid_json")
    for name in _UNSUPPORTED_CHAT:
        if body.get(name) not in (None, False, [], {}) and not (name == "response_format"
                                                                and body[name] == {"type": "text"}):
            raise unsupported(name, "the conductor answers in text only")
    kw = _common(body, "chat", max_n, trace_header)
    if "messages" not in body:
        raise invalid("messages is required", "empty_messages", "messages")
    question = question_from_messages(body["messages"])
    _check_size(question, max_chars, "messages")
    n = _num(body, "n", 1, max_n, integer=True) or 1
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _num({"max_tokens": mt}, "max_tokens", 1, 10**7, integer=True)
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise invalid("stream_options must be an object", "invalid_type", "stream_options")
    return ServeRequest(question=question, n=n, max_tokens=max_tokens, stop=_stop(body),
                        include_usage=bool(so.get("include_usage")), **kw)


def parse_responses(body: Any, *, max_n: int, max_chars: int, trace_header: str | None = None) -> ServeRequest:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", "invalid_json")
    for name in ("tools", "tool_choice", "previous_response_id", "conversation", "reasoning", "text_format"):
        if body.get(name) not in (None, [], {}, "auto"):
            raise unsupported(name, "/v1/responses serves text input and output only")
    kw = _common(body, "responses", max_n, trace_header)
    if kw["stream"]:
        raise unsupported("stream", "stream on /v1/chat/completions instead")
    raw = body.get("input")
    if isinstance(raw, str):
        if not raw.strip():
            raise invalid("input must not be empty", "empty_input", "input")
        messages: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list):
        messages = [m if isinstance(m, dict) and m.get("type", "message") == "message" else
                    _reject_item(i, m) for i, m in enumerate(raw)]
    else:
        raise invalid("input must be a string or a list of messages", "empty_input", "input")
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions must be a string", "invalid_type", "instructions")
        messages = [{"role": "system", "content": instructions}, *messages]
    question = question_from_messages(messages, "input")
    _check_size(question, max_chars, "input")
    max_tokens = _num(body, "max_output_tokens", 1, 10**7, integer=True)
    return ServeRequest(question=question, max_tokens=max_tokens, **kw)


def _reject_item(i: int, item: Any) -> Any:
    kind = item.get("type") if isinstance(item, dict) else type(item).__name__
    raise invalid(f"input[{i}]: only message items are supported (got {kind!r})", "unsupported_content", "input")


def _check_size(question: str, max_chars: int, param: str) -> None:
    if len(question) > max_chars:
        raise APIError(400, "invalid_request_error", "context_length_exceeded",
                       f"the input is {len(question):,} characters; this server accepts at most {max_chars:,}", param)
