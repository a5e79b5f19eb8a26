"""Outcomes -> OpenAI-shaped bodies: chat completions (whole and streamed), responses, usage and the trace.

``usage`` keeps OpenAI's fields for the answer (``prompt_tokens``: the user's input; ``completion_tokens``: the
answer) and adds the orchestration: ``orchestration_input_tokens`` / ``orchestration_output_tokens`` (the
conductor's prompt and workflow plus every worker call), ``orchestration_cached_input_tokens`` /
``orchestration_cached_output_tokens`` (calls answered from the response cache), ``cost`` (dollars of every
worker call of the request) and ``worker_calls``. Every answer names the workers that ran (``conductor_workers``: per choice, their names and the
number of steps, no text of theirs); the full trace (``conductor_trace``) is added only on request.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from conductor.serve.errors import APIError
from conductor.workers.providers.shared import estimate_tokens

if TYPE_CHECKING:
    from conductor.serve.engine import Outcome
    from conductor.serve.requests import ServeRequest
    from conductor.serve.stream import AnswerStream
    from conductor.trajectory import Trajectory

TRACE_FIELD = "conductor_trace"
WORKERS_FIELD = "conductor_workers"


def answer_of(t: Trajectory, req: ServeRequest) -> tuple[str, str]:
    """(answer text, finish_reason) after the request's ``stop`` and ``max_tokens``.

    >>> from conductor.serve.requests import ServeRequest
    >>> from conductor.trajectory import Trajectory
    >>> t = Trajectory("t", "r", "served", "q", "served", "free", "q", final_answer="one two. three")
    >>> answer_of(t, ServeRequest("chat", "conductor", "q", stop=["."]))
    ('one two', 'stop')
    >>> answer_of(t, ServeRequest("chat", "conductor", "q", max_tokens=1))
    ('one ', 'length')
    """
    text = t.final_answer or ""
    finish = "stop"
    cut = min((i for i in (text.find(s) for s in req.stop) if i >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    if req.max_tokens is not None and estimate_tokens(text) > req.max_tokens:
        text, finish = text[: req.max_tokens * 4], "length"    # the same 4-characters-per-token estimate
    return text, finish


def _conductor_tokens(t: Trajectory, strategy: bool) -> tuple[int, int]:
    if strategy or not t.rounds:
        return 0, 0
    r = t.rounds[0]
    out = len(r.completion_token_ids) if r.completion_token_ids is not None else estimate_tokens(r.completion)
    return estimate_tokens(r.prompt), out


def usage(out: Outcome, req: ServeRequest, answers: list[str]) -> dict[str, Any]:
    prompt = estimate_tokens(req.question)
    completion = sum(estimate_tokens(a) for a in answers)
    o_in = o_out = c_in = c_out = calls = 0
    for t in out.trajectories:
        ci, co = _conductor_tokens(t, out.model.strategy)
        o_in += ci + t.input_tokens
        o_out += co + t.output_tokens
        for c in t.calls:
            calls += 1 if c.worker_index >= 0 and c.error_kind != "budget" else 0
            if c.cache_hit:
                c_in += c.input_tokens
                c_out += c.output_tokens
    cost = round(sum(t.cost_usd for t in out.trajectories), 10)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "orchestration_input_tokens": o_in, "orchestration_output_tokens": o_out,
            "orchestration_cached_input_tokens": c_in, "orchestration_cached_output_tokens": c_out,
            "cost": cost, "worker_calls": calls}


def workers_ran(out: Outcome) -> list[dict[str, Any]]:
    """Per choice, the pool workers that ran (in the order they first ran), the worker steps run and the worker
    whose reply is the answer; nothing of what they said. Steps left out under ``max_cost`` did not run; the
    conductor's own calls (recursion) are not worker steps."""
    result = []
    for i, t in enumerate(out.trajectories):
        ran = [c for c in t.calls if c.worker_index >= 0 and c.error_kind != "budget"]
        result.append({"index": i, "workers": list(dict.fromkeys(c.worker for c in ran)), "steps": len(ran),
                       "answered_by": ran[-1].worker if ran else None})
    return result


def budget_stop(t: Trajectory) -> str | None:
    """Why steps were left out under ``max_cost`` (the answer is then the last step that ran), or None."""
    stopped = [c for c in t.calls if c.error_kind == "budget"]
    return stopped[0].error if stopped else None


def trace(out: Outcome) -> dict[str, Any]:
    """The workflow(s) behind the answer: per choice, each recursion round's steps with worker, subtask, access
    list, tokens, dollars and seconds."""
    choices = []
    for i, t in enumerate(out.trajectories):
        rounds = []
        for r in t.rounds:
            steps = []
            for c in (c for c in t.calls if c.depth == r.depth):
                steps.append({"step": c.step, "worker": c.worker, "model_index": c.worker_index, "model": c.model,
                              "subtask": c.subtask, "access": "all" if c.access_all else list(c.access),
                              "input_tokens": c.input_tokens, "output_tokens": c.output_tokens,
                              "cost": round(c.cost_usd, 10), "seconds": round(c.latency_s, 4),
                              "cache_hit": c.cache_hit, "status": "ok" if not c.error_kind else
                              ("skipped_budget" if c.error_kind == "budget" else "error"),
                              **({"error": c.error} if c.error_kind else {})})
            rounds.append({"depth": r.depth, "parse_status": r.parse_status, "parse_error": r.parse_error,
                           "kept_previous": r.kept_previous, "steps": steps})
        choices.append({"index": i, "rounds": rounds, "budget_stop": budget_stop(t),
                        "cost": round(t.cost_usd, 10), "seconds": round(t.wall_s, 4),
                        "conductor_seconds": round(t.conductor_s, 4)})
    sub = out.trajectories[0].subpool if out.trajectories else []
    return {"request_id": out.request_id, "checkpoint": out.model.checkpoint_id, "pool": out.spec.pool.id,
            "workers": sub, "max_steps": out.spec.max_steps, "max_cost": out.spec.budget.max_dollars,
            "choices": choices}


def headers(out: Outcome, use: dict[str, Any]) -> dict[str, str]:
    h = {"X-Conductor-Cost": f"{use['cost']:.10f}".rstrip("0").rstrip(".") if use["cost"] else "0",
         "X-Conductor-Checkpoint": out.model.checkpoint_id, "X-Request-Id": out.request_id}
    if any(budget_stop(t) for t in out.trajectories):
        h["X-Conductor-Budget-Stop"] = "true"
    if any(t.parse_status != "ok" for t in out.trajectories):
        h["X-Conductor-Status"] = "workflow_" + next(t.parse_status for t in out.trajectories if t.parse_status != "ok")
    return h


def chat_completion(out: Outcome, req: ServeRequest, want_trace: bool) -> tuple[dict[str, Any], dict[str, str]]:
    answers = [answer_of(t, req) for t in out.trajectories]
    use = usage(out, req, [a for a, _ in answers])
    body: dict[str, Any] = {
        "id": f"chatcmpl-{out.request_id}", "object": "chat.completion", "created": int(time.time()),
        "model": out.model.model_id, "system_fingerprint": out.model.checkpoint_id,
        "choices": [{"index": i, "message": {"role": "assistant", "content": a, "refusal": None},
                     "logprobs": None, "finish_reason": f} for i, (a, f) in enumerate(answers)],
        "usage": use, WORKERS_FIELD: workers_ran(out)}
    if want_trace:
        body[TRACE_FIELD] = trace(out)
    return body, headers(out, use)


def chunk(cid: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, **extra}


def split_answer(text: str, size: int = 32) -> list[str]:
    """Stream pieces at word boundaries, about ``size`` characters each; joined they are the text.

    >>> "".join(split_answer("a b c " * 20)) == "a b c " * 20, split_answer("")
    (True, [''])
    """
    tokens = re.findall(r"\s*\S+\s*", text)
    if not text or "".join(tokens) != text:
        return [text]
    pieces, cur = [], ""
    for tok in tokens:
        cur += tok
        if len(cur) >= size:
            pieces.append(cur)
            cur = ""
    if cur:
        pieces.append(cur)
    return pieces


def stream_tail(out: Outcome, req: ServeRequest, want_trace: bool, cid: str, created: int,
                answer: AnswerStream | None = None) -> list[dict[str, Any]]:
    """The chunks once the workflow is done: the rest of the answer(s) in pieces (all of it, or what the live
    ``answer`` stream has not sent yet), the finish, then usage/trace (last before ``[DONE]``). APIError
    ``stream_diverged`` when what was sent is not the beginning of the answer (a reply that failed mid-stream
    was retried and said something else)."""
    model = out.model.model_id
    answers = [answer_of(t, req) for t in out.trajectories]
    chunks = []
    for i, (text, _) in enumerate(answers):
        rest = text if answer is None else answer.choices[i].finish(text)
        if rest is None:
            raise APIError(502, "api_error", "stream_diverged",
                           "a worker's reply failed while it was being streamed, and its retry differs from the "
                           "part already sent; ask again")
        if answer is not None and not rest:
            continue
        for piece in split_answer(rest):
            chunks.append(chunk(cid, model, created, [{"index": i, "delta": {"content": piece},
                                                       "logprobs": None, "finish_reason": None}]))
    chunks.append(chunk(cid, model, created, [{"index": i, "delta": {}, "logprobs": None, "finish_reason": f}
                                              for i, (_, f) in enumerate(answers)]))
    if req.include_usage or want_trace:
        extra: dict[str, Any] = {"usage": usage(out, req, [a for a, _ in answers])}
        if want_trace:
            extra[TRACE_FIELD] = trace(out)
        chunks.append(chunk(cid, model, created, [], **extra))
    chunks[-1][WORKERS_FIELD] = workers_ran(out)      # on the last chunk, whichever it is
    return chunks


def response_object(out: Outcome, req: ServeRequest, want_trace: bool) -> tuple[dict[str, Any], dict[str, str]]:
    text, finish = answer_of(out.trajectories[0], req)
    use = usage(out, req, [text])
    body: dict[str, Any] = {
        "id": f"resp_{out.request_id}", "object": "response", "created_at": int(time.time()),
        "status": "completed" if finish == "stop" else "incomplete",
        "incomplete_details": None if finish == "stop" else {"reason": "max_output_tokens"},
        "model": out.model.model_id, "error": None, "instructions": None, "tools": [], "tool_choice": "auto",
        "parallel_tool_calls": False, "metadata": {}, "temperature": out.spec.temperature, "top_p": 1.0,
        "output": [{"type": "message", "id": f"msg_{out.request_id}", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": use["prompt_tokens"], "output_tokens": use["completion_tokens"],
                  "total_tokens": use["total_tokens"],
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0},
                  **{k: v for k, v in use.items() if k not in ("prompt_tokens", "completion_tokens", "total_tokens")}},
        WORKERS_FIELD: workers_ran(out),
    }
    if want_trace:
        body[TRACE_FIELD] = trace(out)
    return body, headers(out, use)
