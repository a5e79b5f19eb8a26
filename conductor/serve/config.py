"""What a ``conductor serve`` process is configured with: a run configuration (conductor/run/config.py).

The command's options are generated from these fields, as ``conductor answer``'s are from ``AnswerConfig``
(conductor/cli/run_options.py); the fields a command line does not set are the server's tuning, set by a
``--config`` file or by the code that builds the server. The conductor spec, the few-shot setting and the limits
store are parsed once, here, into the same types the run configurations hold (conductor/policy/spec.py,
conductor/prompts.py, conductor/execution/shared_limits.py); a bad one fails at construction with the field named.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from conductor.execution.shared_limits import LimitsField
from conductor.policy.spec import AutoSpec, ConductorSpecField
from conductor.prompts import FewShotField, FewShotSpec
from conductor.run.config import CONDUCTOR_MAX_TOKENS, MaxDollars, MaxSteps, RunConfig
from conductor.workflow import DEFAULT_MAX_STEPS

# Every number is checked here, so `serve --max-cost nan` or `--key-concurrency 0` is one error line at start,
# never a server that ignores a budget or refuses every request: finite (RunConfig), and positive where 0 means
# nothing.
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=1)]

# The fields only a configuration file (or the code that builds a server) sets: not command-line options.
TUNING = ("lake_batch", "lake_flush_s", "api_keys_env", "max_body_bytes", "max_n", "constrained", "temperature",
          "conductor_max_tokens", "request_timeout_s", "batch_window_ms", "max_batch")


class ServeConfig(RunConfig):
    """``conductor serve``: the conductor behind an OpenAI-compatible HTTP API (docs/serving.md)."""

    pool: str = Field(description="Pool manifest the conductor runs over.")
    conductor: ConductorSpecField = Field(AutoSpec(), description=(
        "The default when the registry has no champion: auto (embedded), a policy spec, or a strategy such as "
        "fixed:0."))
    registry: str | None = Field(None, description="Champion registry (default $CONDUCTOR_REGISTRY).")
    reload_s: NonNegative = Field(2.0, description="Re-read the champion this often (0: never).")
    lake: str | None = Field(None, description="Write served traffic here (kind=served).")
    store_text: bool = Field(False, description="Keep the user's text in the lake.")
    lake_batch: Count = Field(1024, description="Rows per lake shard at most (a shard costs a fixed ~13 ms "
                                                "of CPU, so larger shards cost less per row).")
    lake_flush_s: Positive = Field(5.0, description="A shard is written at least this often while traffic flows.")
    run_id: str | None = Field(None, description="Lake run id of served rows (default served-<UTC date>).")
    limits: LimitsField | None = Field(None, description="Worker rate limits: local, sqlite:PATH or prefect.")
    cache: str | None = Field(None, description="Response cache (SQLite path).")
    api_keys_env: str = Field("CONDUCTOR_SERVE_API_KEYS", description="NAME of the variable holding keys "
                              "(name=key,...).")
    keys_file: str | None = Field(None, description="Lines 'NAME sha256:<hex>' (hashed API keys).")
    key_rpm: Positive | None = Field(600.0, description="Requests per minute per API key (0: unlimited).")
    key_concurrency: Count = Field(64, description="Requests in flight per API key.")
    client_limits: str | None = Field(None, description="Per-key limits store shared by replicas: local or "
                                      "sqlite:PATH.")
    max_input_chars: Count = Field(32_000, description="Longer inputs are refused (context_length_exceeded).")
    max_body_bytes: Count = Field(1_000_000, description="Larger request bodies are refused (413).")
    max_n: Count = Field(8, description="Most choices per request.")
    max_steps: MaxSteps = Field(DEFAULT_MAX_STEPS, description="Longest workflow the conductor may write.")
    recursion_depth: int = Field(0, ge=0, description="Extra conductor rounds (the paper's recursive test-time "
                                 "scaling).")
    fewshot: FewShotField = Field(FewShotSpec(policy="auto"), description="Conductor prompt examples (auto: as "
                                  "`answer`: informed for the untrained embedded conductor, else ood).")
    constrained: bool | None = Field(None, description="Workflow grammar (default: on for the embedded conductor).")
    temperature: float = Field(0.0, ge=0, le=2, description="The conductor's default sampling temperature.")
    conductor_max_tokens: int = Field(CONDUCTOR_MAX_TOKENS, ge=16, description="The conductor's completion limit "
                                      "(as `answer`).")
    max_dollars: MaxDollars = Field(None, description="Dollar cap per request (requests may lower it).")
    request_timeout_s: Positive = Field(600.0, description="A workflow running longer fails with a timeout.")
    batch_window_ms: NonNegative = Field(2.0, description="Conductor generations arriving this close together "
                                         "share a batch.")
    max_batch: Count = Field(64, description="Prompts per conductor batch.")
    extra: dict[str, str] = Field(default_factory=dict, description="Free-form settings for extensions.")

    @field_validator("key_rpm", mode="before")
    @classmethod
    def _unlimited(cls, v: Any) -> Any:
        """``--key-rpm 0`` means no per-key rate limit."""
        return None if v == 0 else v

    @field_validator("run_id")
    @classmethod
    def _plain_run_id(cls, v: str | None) -> str | None:
        """The run id is a lake partition: a plain name (``a/b`` or ``../x`` would put rows outside it)."""
        from conductor.lake.storage import check_key

        return None if v is None else check_key("run id", v)
