"""Request bodies -> one ``ServeRequest``: the HTTP body as pydantic models, one adapter to OpenAI's error shape.

WHY pydantic: the bodies are validated like every other input of the project (strict types, ranges, unknown
controls refused), and a ``ValidationError`` becomes exactly one OpenAI error object naming the parameter
(``param``: ``messages[0].content``, ``conductor.max_cost``), in one place (``api_error``).

Honoured: text ``messages`` / ``input`` in any role (a conversation of ``system`` / ``developer`` text only is
answered: that text is the question), content as a string or text parts, ``name``; ``n`` (independent
workflows), ``temperature`` and ``seed`` (the conductor's sampling), ``max_completion_tokens`` / ``max_tokens`` /
``max_output_tokens`` (the answer is cut there, finish_reason ``length``), ``stop`` (the answer is cut at the
first stop sequence), ``stream`` and ``stream_options.include_usage``. Validated, then ignored: ``user``,
``metadata``, ``store``, ``top_p``, the penalties, ``reasoning_effort`` and the like. Refused with
``unsupported_parameter`` naming it: tools and function calls, logprobs, structured output
(``response_format`` / ``text.format`` other than text), audio, prediction; non-text content is refused with
``unsupported_content``. The per-request controls live in one body field, ``conductor``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from conductor.serve.errors import APIError, invalid

CONTROLS_FIELD = "conductor"
TRACE_HEADER = "x-conductor-trace"
_TEXT_PARTS = ("text", "input_text", "output_text")
# the error codes the models raise themselves (PydanticCustomError types), passed through as they are
_OWN_CODES = ("unsupported_parameter", "unsupported_content", "unsupported_role", "empty_messages", "empty_input",
              "invalid_value", "invalid_type")
_MISSING_CODES = {"model": "missing_model", "messages": "empty_messages"}
_TAG = re.compile(r"^([\w-]+\[.*\]|\[key\])$")    # pydantic's validator/union tags in an error's location


def _strict(extra: Literal["allow", "forbid"] = "allow") -> ConfigDict:
    return ConfigDict(strict=True, allow_inf_nan=False, extra=extra)


class Controls(BaseModel):
    """The ``conductor`` body field: what this request may use, and whether to return the trace."""

    model_config = _strict("forbid")
    workers: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)   # in this order
    exclude_workers: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    max_cost: float | None = Field(None, gt=0)    # dollars per request, enforced during execution
    max_steps: int | None = Field(None, ge=1)
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


# ---------------------------------------------------------------------------------------------- field types
def _refuse(why: str, allowed: tuple[Any, ...] = (None, False, [], {})) -> Any:
    """A parameter the conductor cannot honour: accepted only at a value that asks for nothing."""

    def check(v: Any) -> Any:
        if v not in allowed:
            raise PydanticCustomError("unsupported_parameter", "Unsupported parameter: {why}", {"why": why})
        return v

    return BeforeValidator(check)


Unsupported = Annotated[Any, _refuse("it answers in text only")]


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or a list of text parts joined by newlines (None: empty)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise PydanticCustomError("invalid_type", "expected a string or a list of text parts")
    parts = []
    for i, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else type(p).__name__
        if kind == "refusal" and isinstance(p.get("refusal"), str):
            parts.append(p["refusal"])
            continue
        if kind not in _TEXT_PARTS:
            raise PydanticCustomError("unsupported_content", "part {i}: only text content is supported (got '{kind}')",
                                      {"i": i, "kind": kind})
        if not isinstance(p.get("text"), str):
            raise PydanticCustomError("invalid_type", "part {i}: text must be a string", {"i": i})
        parts.append(p["text"])
    return "\n".join(parts)


Text = Annotated[str, BeforeValidator(_content_text)]
# OpenAI: a string, up to 4 strings, or null (the length bound sits on the list: on the Optional it broke null)
Stop = Annotated[Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None,
                 BeforeValidator(lambda v: [v] if isinstance(v, str) else v)]
Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]


def _role(v: Any) -> Any:
    if v in ("tool", "function"):
        raise PydanticCustomError("unsupported_role", "'{role}' messages are not supported: the conductor calls no "
                                  "tools (roles: system, developer, user, assistant)", {"role": v})
    return v


class Message(BaseModel):
    model_config = _strict()
    role: Annotated[Literal["system", "developer", "user", "assistant"], BeforeValidator(_role)]
    content: Text = ""
    name: str | None = None
    tool_calls: Unsupported = None
    function_call: Unsupported = None


class _Common(BaseModel):
    """What both endpoints take."""

    model_config = _strict()
    model: str = Field(min_length=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    user: str | None = None
    metadata: Metadata | None = Field(None, max_length=16)
    store: bool | None = None
    conductor: Controls | None = None
    tools: Unsupported = None
    tool_choice: Annotated[Any, _refuse("it calls no tools", (None, "none", "auto"))] = None
    parallel_tool_calls: bool | None = None


class ChatBody(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    n: int = Field(1, ge=1, le=128)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: Stop = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    functions: Unsupported = None
    function_call: Unsupported = None
    logprobs: Unsupported = None
    top_logprobs: Annotated[Any, _refuse("it returns no logprobs", (None, 0))] = None
    logit_bias: Unsupported = None
    audio: Unsupported = None
    prediction: Unsupported = None
    web_search_options: Unsupported = None
    modalities: Annotated[Any, _refuse("it answers in text only", (None, ["text"]))] = None
    response_format: Annotated[Any, _refuse("it answers in free text: no JSON mode or json_schema",
                                            (None, {"type": "text"}))] = None


class InputItem(Message):
    type: Literal["message"] = "message"


def _input_items(v: Any) -> Any:
    """``input`` as a list of message items (a string is one user message); other item kinds are refused."""
    if isinstance(v, str):
        return [{"role": "user", "content": v}]
    for i, item in enumerate(v if isinstance(v, list) else []):
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind != "message":
            raise PydanticCustomError("unsupported_content", "item {i}: only message items are supported "
                                      "(got '{kind}')", {"i": i, "kind": kind})
    return v


class ResponsesBody(_Common):
    """``POST /v1/responses``."""

    input: Annotated[list[InputItem] | None, BeforeValidator(_input_items)] = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stream: Annotated[Any, _refuse("stream on /v1/chat/completions instead", (None, False))] = None
    previous_response_id: Annotated[Any, _refuse("it keeps no conversation state", (None,))] = None
    conversation: Annotated[Any, _refuse("it keeps no conversation state", (None,))] = None
    background: Annotated[Any, _refuse("it answers in the foreground only", (None, False))] = None
    prompt: Annotated[Any, _refuse("stored prompts are not available", (None,))] = None
    text: Annotated[Any, _refuse("it answers in free text: no json_schema",
                                 (None, {}, {"format": {"type": "text"}}))] = None


# ---------------------------------------------------------------------------------------------- the adapter
def _param(loc: tuple[int | str, ...]) -> str:
    """``("messages", 0, "content")`` -> ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def api_error(e: ValidationError, missing: dict[str, str] | None = None) -> APIError:
    """The first validation error as OpenAI's error object: ``param`` is the parameter's path, ``code`` the
    project's own code where the model raised it, else ``invalid_type`` / ``invalid_value`` /
    ``missing_required_parameter``; anything under ``conductor`` is ``invalid_controls``."""
    err = e.errors(include_url=False)[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _TAG.match(p)))
    param = _param(loc)[:120] or None       # a dict key from the body may be long: never echo much of it
    kind, msg = err["type"], err["msg"]
    if kind == "missing":
        code = (missing or _MISSING_CODES).get(param or "", "missing_required_parameter")
        message = f"Missing required parameter: '{param}'."
    elif kind == "too_short" and param in (missing or _MISSING_CODES):
        code, message = (missing or _MISSING_CODES)[param], f"{param} must not be empty"
    elif kind in _OWN_CODES:
        code, message = kind, f"{param}: {msg}" if param else msg
    elif kind.endswith("_type") or kind in ("finite_number", "union_tag_invalid", "model_attributes_type"):
        code, message = "invalid_type", f"Invalid type for '{param}': {msg[0].lower()}{msg[1:]}."
    else:
        code, message = "invalid_value", f"Invalid '{param}': {msg[0].lower()}{msg[1:]}."
    if code == "unsupported_parameter":
        message = f"Unsupported parameter: '{param}' is not supported by the conductor ({msg.split(': ', 1)[1]})."
    if param and param.split(".")[0].split("[")[0] == CONTROLS_FIELD:
        code = "invalid_controls"
        if kind == "extra_forbidden":
            message = (f"{CONTROLS_FIELD}: unknown control {str(loc[-1])!r} (known: "
                       f"{', '.join(Controls.model_fields)})")
    return invalid(message[:600], code, param)


def _validate(model: type[BaseModel], body: Any, missing: dict[str, str] | None = None) -> Any:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", "invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise api_error(e, missing) from None


# ---------------------------------------------------------------------------------------------- the question
def question_from_messages(messages: Sequence[Message], param: str = "messages") -> str:
    """The question the conductor answers: the last user turn, with any system text and earlier turns above it;
    a conversation of system/developer text only is that text; one that ends with the assistant is the whole
    conversation (the answer is the next turn).

    >>> question_from_messages([Message(role="user", content="What is 2+2?")])
    'What is 2+2?'
    >>> print(question_from_messages([Message(role="system", content="Be brief."), Message(role="user", content="Hi")]))
    Be brief.
    <BLANKLINE>
    Hi
    >>> question_from_messages([Message(role="developer", content="What is 2+2?")])
    'What is 2+2?'
    """
    system = [m.content for m in messages if m.role in ("system", "developer") and m.content.strip()]
    turns = [(m.role, m.content) for m in messages if m.role in ("user", "assistant") and m.content.strip()]
    # the last user turn is the question, unless the conversation ends with the assistant (then it is all context)
    asked = bool(turns) and turns[-1][0] == "user" and messages[-1].role != "assistant"
    earlier = turns[:-1] if asked else turns
    head = "\n\n".join(system)
    if earlier:
        head = f"{head}\n\nConversation so far:\n" + "\n".join(f"{r}: {t}" for r, t in earlier)
    head = head.strip()
    question = head if not asked else f"{head}\n\n{turns[-1][1]}" if head else turns[-1][1]
    if not question.strip():
        code = "empty_input" if param == "input" else "empty_messages"
        raise invalid(f"{param} holds no text to answer", code, param)
    return question


def _apply_trace_header(controls: Controls, trace_header: str | None) -> Controls:
    if trace_header is not None and trace_header.strip().lower() in ("enabled", "true", "1", "yes", "on"):
        return controls.model_copy(update={"trace": True})
    return controls


def parse_chat(body: Any, *, max_n: int, max_chars: int, trace_header: str | None = None) -> ServeRequest:
    b: ChatBody = _validate(ChatBody, body)
    if b.n > max_n:
        raise invalid(f"Invalid 'n': this server answers at most {max_n} choices per request (got {b.n}).",
                      "invalid_value", "n")
    if b.stream_options is not None and not b.stream:
        raise invalid("stream_options is only allowed when stream is true", "invalid_value", "stream_options")
    question = question_from_messages(b.messages)
    _check_size(question, max_chars, "messages")
    return ServeRequest(endpoint="chat", model=b.model, question=question, n=b.n, temperature=b.temperature,
                        seed=b.seed, max_tokens=b.max_completion_tokens or b.max_tokens, stop=b.stop or [],
                        stream=bool(b.stream), include_usage=bool((b.stream_options or {}).get("include_usage")),
                        controls=_apply_trace_header(b.conductor or Controls(), trace_header))


def parse_responses(body: Any, *, max_n: int, max_chars: int, trace_header: str | None = None) -> ServeRequest:
    b: ResponsesBody = _validate(ResponsesBody, body, {"model": "missing_model", "input": "empty_input"})
    items = list(b.input or [])
    if b.instructions is not None:
        items.insert(0, InputItem(role="system", content=b.instructions))
    question = question_from_messages(items, "input")
    _check_size(question, max_chars, "input")
    return ServeRequest(endpoint="responses", model=b.model, question=question, temperature=b.temperature,
                        max_tokens=b.max_output_tokens, controls=_apply_trace_header(b.conductor or Controls(), trace_header))


def _check_size(question: str, max_chars: int, param: str) -> None:
    if len(question) > max_chars:
        raise APIError(400, "invalid_request_error", "context_length_exceeded",
                       f"the input is {len(question):,} characters; this server accepts at most {max_chars:,}", param)
