"""API keys come only from the environment, and never leave the process in clear.

Keys are read by the variable NAME a pool manifest gives (``api_key_env``).
``redact`` scrubs the actual values of every variable we have read or were told
about, plus common key shapes, from any text about to be logged, raised or
stored: providers sometimes echo part of a key in their error bodies, and SDK
exception strings include those bodies.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time

from conductor.workers.providers.base import ProviderError

REDACTED = "[REDACTED]"

# Variables whose values are always scrubbed, even if no worker names them.
DEFAULT_KEY_ENVS: tuple[str, ...] = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GOOGLE_API_KEY", "GEMINI_API_KEY",
    "TOGETHER_API_KEY", "DEEPSEEK_API_KEY", "OPENROUTER_API_KEY", "HF_TOKEN",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
)

# Common key shapes (OpenAI/Anthropic sk-..., Google AIza..., HF hf_..., bearer headers).
_PATTERNS = re.compile(
    r"(sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,})"
    r"|(AIza[0-9A-Za-z_\-]{30,})"
    r"|(hf_[A-Za-z0-9]{20,})"
    r"|((?i:bearer)\s+[A-Za-z0-9._\-]{12,})"
)
_PREFIXES = ("sk-", "AIza", "hf_")    # every alternative of _PATTERNS starts with one of these, or with "bearer"

_lock = threading.Lock()
_env_names: set[str] = set(DEFAULT_KEY_ENVS)
_MIN_SECRET_LEN = 6   # shorter values are too likely to hit ordinary words
_TTL_S = 1.0          # re-read the environment at most this often (redact runs on every reply)
_cached: tuple[float, list[str]] = (-1e9, [])
_n_interpolated = 0


def register_key_env(name: str) -> None:
    """Scrub this variable's value from everything ``redact`` sees from now on."""
    global _cached
    with _lock:
        if name not in _env_names:
            _env_names.add(name)
            _cached = (-1e9, [])


def key_env_names() -> list[str]:
    with _lock:
        return sorted(_env_names)


def get_key(env_name: str, worker: str = "") -> str:
    """The key in ``env_name``; a ``missing_key`` ProviderError naming the variable, never a value.

    >>> import os; os.environ["CONDUCTOR_DOCTEST_KEY"] = "k-123456789"
    >>> get_key("CONDUCTOR_DOCTEST_KEY")
    'k-123456789'
    >>> redact("token k-123456789 leaked")
    'token [REDACTED] leaked'
    """
    global _cached
    register_key_env(env_name)
    value = os.environ.get(env_name, "").strip()
    if value and len(value) >= _MIN_SECRET_LEN and value not in _cached[1]:
        _cached = (-1e9, [])      # a key we have not scrubbed yet: refresh now, not in a second
    if not value:
        who = f"worker {worker}: " if worker else ""
        raise ProviderError("missing_key", f"{who}environment variable {env_name} is not set (it must hold the API key)")
    return value


def _secret_values() -> list[str]:
    global _cached, _n_interpolated
    from conductor.workers.pool import INTERPOLATED_SECRETS

    now = time.monotonic()
    if now - _cached[0] < _TTL_S and len(INTERPOLATED_SECRETS) == _n_interpolated:
        return _cached[1]
    _n_interpolated = len(INTERPOLATED_SECRETS)   # a key a manifest just interpolated: scrubbed from now on
    with _lock:
        names = list(_env_names | INTERPOLATED_SECRETS)
    vals = {os.environ.get(n, "").strip() for n in names}
    out = sorted((v for v in vals if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)
    _cached = (now, out)
    return out


def redact(text: str | None) -> str:
    """Remove configured key values and key-shaped strings from ``text``.

    >>> redact("Incorrect API key provided: sk-abcdefghijklmnopqrstuvwx")
    'Incorrect API key provided: [REDACTED]'
    >>> redact("nothing secret")
    'nothing secret'
    """
    if not text:
        return "" if text is None else text
    for v in _secret_values():
        if v in text:
            text = text.replace(v, REDACTED)
    if not (any(p in text for p in _PREFIXES) or "bearer" in text.lower()):
        return text     # the regex scan costs ~1 us per character; a substring test is ~20x cheaper on clean text
    return _PATTERNS.sub(REDACTED, text)


def mask_url(text: str) -> str:
    """A URL (or a spec holding one) with its secrets masked: the userinfo password, every query value and
    any value ``redact`` knows. Stable, so ids built from it stay the same across runs.

    >>> mask_url("http://u:hunter22@host:8000/v1?api-key=abc&x=1")
    'http://[REDACTED]@host:8000/v1?api-key=[REDACTED]&x=[REDACTED]'
    >>> mask_url("openai:m@https://host/v1#MY_KEY")
    'openai:m@https://host/v1#MY_KEY'
    """
    if not text:
        return text
    out = re.sub(r"://[^/\s@?#]+@", f"://{REDACTED}@", text)     # user:password@ (or a token as the user)
    out = re.sub(r"([?&][^=&#\s]+)=([^&#\s]*)", lambda m: f"{m.group(1)}={REDACTED}" if m.group(2) else m.group(0),
                 out)
    return redact(out)


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs keys from every record it passes (message, arguments and traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not break logging
            message = str(record.msg)
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[0] is not None:
            # Handlers format the traceback themselves (SDK errors carry response bodies that echo keys):
            # hand them the scrubbed text instead of the exception.
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, redact(text)
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


PREFECT_LOGGERS = ("prefect", "prefect.flow_runs", "prefect.task_runs")


def redact_prefect_logs() -> int:
    """Scrub keys from everything Prefect logs: its console output and the logs it stores in its database.

    A filter on a logger only sees records logged to that very logger, so the filter goes on every handler
    of the root logger and of Prefect's loggers (the console handler and the API log handler), where records
    from all child loggers arrive. Idempotent; call it after Prefect has configured logging (inside a flow).
    Returns how many handlers were newly covered.
    """
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in PREFECT_LOGGERS)]
    loggers += [lg for name, lg in list(logging.root.manager.loggerDict.items())
                if isinstance(lg, logging.Logger) and name.split(".")[0] in ("prefect", "uvicorn", "httpx", "openai")]
    added = 0
    for lg in loggers:
        for target in (lg, *lg.handlers):
            if not any(isinstance(f, RedactingFilter) for f in target.filters):
                target.addFilter(RedactingFilter())
                added += target is not lg
    return added


def redacting_logger(name: str) -> logging.Logger:
    """A logger whose records are scrubbed before any handler sees them.

    >>> import os; os.environ["CONDUCTOR_DOCTEST_KEY2"] = "k-abcdef123"; _ = get_key("CONDUCTOR_DOCTEST_KEY2")
    >>> log = redacting_logger("conductor.doctest")
    >>> rec = log.makeRecord(log.name, logging.INFO, __file__, 1, "key %s", ("k-abcdef123",), None)
    >>> log.filters[0].filter(rec) and rec.getMessage()
    'key [REDACTED]'
    """
    log = logging.getLogger(name)
    if not any(isinstance(f, RedactingFilter) for f in log.filters):
        log.addFilter(RedactingFilter())
    return log
