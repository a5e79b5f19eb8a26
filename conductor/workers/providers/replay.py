"""REPLAY workers: answer from recorded outputs of a real model instead of calling it.

A replay worker finds the question in the rendered worker messages (inside ``<overall_task>`` tags when
present, otherwise by substring) and returns the reply its model was recorded giving to that question, with
the recorded (or counted) token usage, so the executor prices the call with the manifest's ``price`` as if
the real model had answered. Recordings, sources, keying and token counting are described in
``conductor/workers/recordings.py`` and docs/replay.md.

The reply is fixed per question: it does **not** depend on the subtask the conductor wrote, on the earlier
steps the access list shows, on ``sampling`` or on ``sample_index``. A workflow that gives a replay worker
a checking or rewriting subtask gets the same recorded reply as one that asks it to solve the question.

A question without a recording raises ``ProviderError("permanent", ...)``: the executor records an
infrastructure failure for that trajectory (no reward), never a wrong answer.

Example manifest entry::

    - name: gpt-4-1106
      provider: replay
      model: gpt-4-1106-preview            # selects the model's columns in the RouteLLM file
      price: {input_per_mtok: 10, output_per_mtok: 30}
      options: {source: "routellm-gsm8k:routellm/gsm8k_responses.csv"}
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conductor.workers.providers.base import Completion, Message, ProviderError, register_provider
from conductor.workers.recordings import RecordingError, RecordingIndex, load_recordings, parse_source

if TYPE_CHECKING:
    from conductor.workers.pool import Worker


class ReplayOptions(BaseModel):
    """``Worker.options`` for a replay worker, validated so a typo is a clear error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1)            # PATH | routellm-gsm8k:PATH | routellm-mmlu:DIR | lake:PATH
    tokenizer: str | None = None                 # a tokenizer.json to count tokens the source did not record
    exclude_contaminated: bool = True            # drop RouteLLM's contaminated prompts
    latency_s: float = Field(0.0, ge=0, allow_inf_nan=False)   # fixed simulated latency per call
    columns: dict[str, str] = Field(default_factory=dict)      # plain files: field -> column name

    @field_validator("source")
    @classmethod
    def _parses(cls, v: str) -> str:
        try:
            parse_source(v)
        except RecordingError as e:
            raise ValueError(str(e)) from None
        return v


class ReplayProvider:
    """One REPLAY worker; ``complete`` returns the recorded reply to the question in the messages."""

    def __init__(self, worker: Worker):
        try:
            self.options = ReplayOptions.model_validate(worker.options)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            raise ProviderError("permanent", f"worker {worker.name}: options.{where}: {msg}") from None
        self.worker = worker
        self.source = parse_source(self.options.source)
        self.calls = 0
        self._index: RecordingIndex | None = None
        self._lock = threading.Lock()

    def index(self) -> RecordingIndex:
        """The worker's recordings (loaded on first use, shared per process; see ``load_recordings``)."""
        if self._index is None:
            try:
                idx = load_recordings(self.source, self.worker.model, worker=self.worker.name,
                                      tokenizer=self.options.tokenizer,
                                      exclude_contaminated=self.options.exclude_contaminated,
                                      columns=self.options.columns)
            except RecordingError as e:
                raise ProviderError("permanent", f"replay worker {self.worker.name}: {e}") from None
            with self._lock:
                self._index = idx
        return self._index

    async def complete(self, messages: list[Message], *, sample_index: int = 0) -> Completion:
        self.calls += 1
        index = self._index
        if index is None:
            index = await asyncio.to_thread(self.index)   # first load off the event loop
        rec = index.find_messages(messages)
        if rec is None:
            raise ProviderError("permanent", f"replay worker {self.worker.name}: no recording for this question "
                                f"(source {self.source}, {len(index)} recordings of {self.worker.model})")
        if self.options.latency_s:
            await asyncio.sleep(self.options.latency_s)
        return Completion(text=rec.reply, input_tokens=rec.input_tokens, output_tokens=rec.output_tokens,
                          finish_reason="stop")

    async def aclose(self) -> None:
        return None


@register_provider("replay")
def _factory(worker: Worker) -> ReplayProvider:
    return ReplayProvider(worker)
