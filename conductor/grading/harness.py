"""The trusted test harness for function-style code items; its source runs as ``main.py`` in the sandbox.

Why a harness: an exit status says nothing about whether the tests ran. A program that calls
``sys.exit(0)``, ``os._exit(0)`` or registers an ``atexit`` exit, or returns an object whose
``__eq__`` is always true, passed ``check(candidate)`` when both ran in one process. So:

- The harness forks the **program process** first, before it reads anything secret. The program
  (prompt + solution) runs there and only answers calls: ``get`` a global, ``call`` a function.
- The harness then reads the run's **token** and the **tests** from files and deletes them, makes
  itself non-dumpable (another process of the same uid cannot read its memory or ptrace it), and
  runs the tests itself. Each call of the candidate (or of any name the tests take from the program)
  crosses the process boundary as ``marshal`` data: only plain values (numbers, strings, bytes,
  None, lists, tuples, dicts, sets) come back, so an always-equal object, or an int subclass with a
  rigged ``__eq__``, cannot reach the tests' comparisons.
- Only after every test ran does the harness write the token to stdout; the grader checks for it.
  An exit, a crash, a non-plain result or a dead program process ends the harness without it.

Limits: the tests call helpers the prompt defines (``poly`` in HumanEval/32) in the program process,
so a solution that rewrites such a helper is not caught; tests that pass a function or an object
*into* the candidate, or check an argument the candidate mutated in place, cannot run here.
This file must import only the standard library, and little of it (every run pays for its imports):
it runs under ``python -I -S``.
"""

from __future__ import annotations

import builtins
import marshal
import os
import sys

TYPE_CHECKING = False     # typing costs an import at every run's start; the type checker reads this branch
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

    _Globals = dict[str, Any]
else:
    _Globals = dict

MAX_MESSAGE = 1 << 28      # bytes in one reply from the program process


def _send(fd: int, obj: Any) -> None:     # Any: marshal.dumps itself decides what is plain
    data = marshal.dumps(obj)
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[os.write(fd, data):]


def _recv(fd: int) -> Any:       # a marshalled message: a tuple whose first item says its kind
    size = int.from_bytes(_read_exact(fd, 8), "little")
    if size > MAX_MESSAGE:
        raise EOFError(f"message of {size} bytes")
    return marshal.loads(_read_exact(fd, size))


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the program process closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- the program process


def _serve_program(requests: int, replies: int) -> None:
    """Load solution.py once asked to, then answer ``get`` and ``call`` requests until killed."""
    _recv(requests)                                   # "load": the harness has hidden its secrets
    scope: dict[str, Any] = {"__name__": "__main__", "__file__": os.path.abspath("solution.py"),
                          "__builtins__": builtins}
    _send(replies, _guard(lambda: exec(compile(open("solution.py").read(), "solution.py", "exec"), scope)))
    while True:
        req = _recv(requests)
        if req[0] == "get":
            if req[1] not in scope:
                reply: tuple[object, ...] = ("missing",)
            elif callable(scope[req[1]]):
                reply = ("callable",)
            else:
                reply = _plain(scope[req[1]])
        else:
            _, name, args, kwargs = req
            reply = _guard(lambda: scope[name](*args, **kwargs))   # noqa: B023 - called at once, in this iteration
        sys.stdout.flush()
        _send(replies, reply)


def _guard(fn: Callable[[], object]) -> tuple[object, ...]:
    try:
        result = fn()
    except SystemExit as exc:
        return ("exit", repr(exc.code)[:200])
    except BaseException as exc:  # noqa: BLE001  (reported to the harness, which re-raises it)
        import traceback  # only on this path: importing it costs ~20 ms of every run's start-up

        return ("raise", type(exc).__name__, str(exc)[:2000], traceback.format_exc()[-4000:])
    return _plain(result)


def _plain(value: Any) -> tuple[object, ...]:
    try:
        marshal.dumps(value)
    except ValueError:
        return ("bad", type(value).__name__)
    return ("ok", value)


# --------------------------------------------------------------------------- the harness process


class ProgramError(Exception):
    """An exception of a type the harness does not have (one the solution defined)."""


class _Channel:
    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid, self.requests, self.replies = pid, requests, replies

    def ask(self, request: tuple[object, ...]) -> object:
        try:
            _send(self.requests, request)
            reply = _recv(self.replies)
        except (OSError, EOFError, ValueError) as exc:
            _fail(f"the program process died ({exc})")
        kind = reply[0]
        if kind == "ok":
            return reply[1]
        if kind == "exit":
            _fail(f"the program exited (SystemExit {reply[1]}) instead of returning")
        if kind == "bad":
            _fail(f"the program returned a {reply[1]}; only plain values (numbers, strings, bytes, None, "
                  "lists, tuples, dicts, sets) are compared")
        if kind == "raise":
            sys.stderr.write(reply[3])
            exc_type = getattr(builtins, reply[1], None)
            if isinstance(exc_type, type) and issubclass(exc_type, Exception):
                raise exc_type(reply[2])
            raise ProgramError(f"{reply[1]}: {reply[2]}")
        return reply           # "callable" / "missing": for Namespace


class Namespace(_Globals):
    """The tests' globals: a name the tests do not define comes from the program process."""

    channel: _Channel

    def __missing__(self, name: str) -> object:
        if hasattr(builtins, name):
            raise KeyError(name)            # the interpreter then looks in builtins
        reply = self.channel.ask(("get", name))
        if reply == ("missing",):
            raise KeyError(name)
        value = _proxy(self.channel, name) if reply == ("callable",) else reply
        self[name] = value
        return value


def _proxy(channel: _Channel, name: str) -> object:
    def call(*args: Any, **kwargs: Any) -> object:
        try:
            marshal.dumps((args, kwargs))
        except ValueError:
            _fail(f"a test passes a non-plain argument to {name}(); it cannot cross to the program process")
        return channel.ask(("call", name, args, kwargs))

    call.__name__ = call.__qualname__ = name
    return call


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"\nharness: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def _nondumpable() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)       # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def main(entry_point: str | None) -> None:
    to_program, from_harness = os.pipe()
    to_harness, from_program = os.pipe()
    pid = os.fork()                      # before any secret is read: the program's memory never holds one
    if pid == 0:
        os.close(from_harness)
        os.close(to_harness)
        try:
            _serve_program(to_program, from_program)
        finally:
            os._exit(0)
    os.close(to_program)
    os.close(from_program)
    with open("token", "rb") as fh:
        token = fh.read().strip()
    with open("tests.py") as fh:
        tests = fh.read()
    os.unlink("token")
    os.unlink("tests.py")
    _nondumpable()
    channel = _Channel(pid, from_harness, to_harness)
    channel.ask(("load",))               # runs the solution's module code in the program process
    scope = Namespace(__name__="__tests__", __builtins__=builtins)
    scope.channel = channel
    exec(compile(tests, "tests.py", "exec"), scope)
    if entry_point:
        scope["check"](_proxy(channel, entry_point))
    os.kill(pid, 9)
    sys.stdout.flush()
    os.write(1, b"\n" + token + b"\n")
    os._exit(0)
