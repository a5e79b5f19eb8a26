"""OpenAI-style error objects: ``{"error": {"message", "type", "param", "code"}}`` with the matching status.

Every bad request maps to one of these; nothing else (no stack trace, no key) ever reaches a client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class APIError(Exception):
    """One client-visible failure.

    >>> APIError(404, "invalid_request_error", "model_not_found", "no model 'x'", "model").body()["error"]["code"]
    'model_not_found'
    """

    status: int
    type: str
    code: str
    message: str
    param: str | None = None
    retry_after: float | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, int(self.retry_after + 0.999)))}


def invalid(message: str, code: str = "invalid_request", param: str | None = None, status: int = 400) -> APIError:
    return APIError(status, "invalid_request_error", code, message, param)


def unsupported(param: str, why: str = "") -> APIError:
    tail = f": {why}" if why else ""
    return invalid(f"parameter {param!r} is not supported by the conductor{tail}", "unsupported_parameter", param)


def bad_controls(message: str, param: str) -> APIError:
    return invalid(message, "invalid_controls", param)


def unknown_model(model: str, known: list[str]) -> APIError:
    return APIError(404, "invalid_request_error", "model_not_found",
                    f"the model {model!r} does not exist; use one of {', '.join(known)} "
                    "(or conductor@<checkpoint id> for a registered checkpoint)", "model")


def auth_error(message: str) -> APIError:
    return APIError(401, "authentication_error", "invalid_api_key", message)


def rate_limited(message: str, retry_after: float) -> APIError:
    return APIError(429, "rate_limit_error", "rate_limit_exceeded", message, retry_after=retry_after)


def upstream(message: str) -> APIError:
    """Every worker attempt failed on infrastructure (after retries): a gateway error, not the client's fault."""
    return APIError(502, "api_error", "upstream_failure", message)


def internal() -> APIError:
    return APIError(500, "server_error", "internal_error", "the server failed to answer this request; it was logged")
