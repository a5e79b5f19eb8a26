"""A local provider emulator (a test double): OpenAI, Anthropic and Gemini wire formats on 127.0.0.1.

WHY: tests and benchmarks must drive the *real* SDK clients (openai, anthropic,
google-genai) through real HTTP, including the failures real providers produce
(429 with Retry-After, 5xx, hangs, malformed bodies), without any network.

Routes (what the SDKs call):
  POST /v1/chat/completions                  OpenAI chat completions (base_url .../v1)
  POST /v1/messages                          Anthropic messages (base_url = root)
  POST /v1beta/models/{model}:generateContent  Gemini (http_options base_url = root)
Streaming (``stream: true``; Gemini's ``:streamGenerateContent?alt=sse``): the same reply and usage as
server-sent events, one word piece per event (``stream_delay_s`` before each; ``stream_pause_after`` pieces,
then held until ``POST /_emulator/release``, so a test can check what its client has while the reply is
provably unfinished).
Batch APIs (processing delay, partial failures, expiry and cancellation; see ``core.Batch``):
  POST /v1/files, GET /v1/files/{id}[/content], POST /v1/batches, GET /v1/batches[/{id}],
  POST /v1/batches/{id}/cancel                 OpenAI Batch API (JSONL input file, output/error files)
  POST /v1/messages/batches, GET /v1/messages/batches/{id}[/results], POST .../{id}/cancel
                                               Anthropic Message Batches (JSONL results)
  POST /v1beta/models/{model}:batchGenerateContent, GET /v1beta/batches/{id}, POST /v1beta/batches/{id}:cancel
                                               Gemini batch mode (inlined requests and responses; also
                                               under /v1, the SDK's default API version)
Control:
  GET  /_emulator/stats     request counts per route and outcome
  GET  /_emulator/requests  the last requests: body and headers (to check what an SDK sent)
  GET  /_emulator/arrivals  monotonic arrival time of every request (rate measurements)
  POST /_emulator/config    merge settings (see ``EmulatorConfig``)
  POST /_emulator/reset     zero the counters and fault state (and forget batches and files)
  POST /_emulator/release   let streamed replies held at ``stream_pause_after`` go on
  GET  /_emulator/batches   every batch created: id, route, status, custom ids

Replies are echo-style by default and deterministic: ``reply from <model> to
<digest of the messages>``, so equal inputs give equal outputs and a test can
check that parallel and sequential execution saw the same messages. Scripted
replies match a substring of the prompt. Faults come from a fault plan in the
config or from magic text in the prompt: ``[[fault:429]]``, ``[[fault:500]]``,
``[[fault:hang]]``, ``[[fault:malformed]]``, ``[[fault:badschema]]``,
``[[fault:empty]]``, ``[[fault:401]]``, ``[[fault:400]]``; ``[[fault:429*2]]``
fails the first two requests with that exact body and then succeeds. In batches, ``[[batchfault:error]]``
fails a request (HTTP 500 inside the results) and ``[[batchfault:expire]]`` leaves it unprocessed until its
batch expires; ``*N`` limits either to the request's first N submissions.

One module per provider (``openai``, ``anthropic``, ``google``: request parsing, reply and error bodies,
batch API), what they share in ``core`` (settings, faults, replies, batches), the HTTP server and the
in-process handle in ``server``. Lives under ``conductor.testing``, which runtime code never imports: only
tests, benches and the ``conductor emulator`` command (lazily) use it; it needs the ``dev`` extra (aiohttp).

Run: ``python -m conductor.testing.emulator --port 8765 --latency 0.05 --rpm 6000`` (or ``conductor emulator``).
"""

from __future__ import annotations

from conductor.testing.emulator.core import ROUTES, EmulatorConfig, EmulatorState
from conductor.testing.emulator.server import Emulator, main, make_app

__all__ = ["ROUTES", "Emulator", "EmulatorConfig", "EmulatorState", "main", "make_app"]
