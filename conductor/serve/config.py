"""What a ``conductor serve`` process is configured with (CLI options map one to one).

A pydantic dataclass: the conductor spec, the few-shot setting and the limits store are parsed once, here, into
the same types the run configurations hold (conductor/policy/spec.py, conductor/prompts.py,
conductor/execution/shared_limits.py); a bad one fails at construction with the field named.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from conductor.execution.shared_limits import LimitsField
from conductor.policy.spec import AutoSpec, ConductorSpecField
from conductor.prompts import FewShotField, FewShotSpec

# Every number is checked here, so `serve --max-cost nan` or `--key-concurrency 0` is one error line at start,
# never a server that ignores a budget or refuses every request: finite, and positive where 0 means nothing.
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]


@dataclass
class ServeConfig:
    pool: str                                   # pool manifest the conductor runs over (named in /v1/models)
    conductor: ConductorSpecField = field(default_factory=AutoSpec)   # untrained default when no champion
    registry: str | None = None                 # champion registry (default: $CONDUCTOR_REGISTRY / CONDUCTOR_HOME)
    reload_s: NonNegative = 2.0                 # how often the champion alias is re-read (0: never)
    lake: str | None = None                     # served traffic goes here (None: not recorded)
    store_text: bool = False                    # keep the user's text in the lake (else redacted)
    lake_batch: Count = 256                     # rows per lake shard at most
    lake_flush_s: Positive = 5.0                # a shard is written at least this often while traffic flows
    run_id: str | None = None                   # lake run id (default: served-<UTC date>)
    limits: LimitsField | None = None           # where the worker rate limits live: local | sqlite:PATH | prefect
    cache: str | None = None                    # optional response cache (sqlite path)
    api_keys_env: str = "CONDUCTOR_SERVE_API_KEYS"   # NAME of the variable holding keys (name=key,...)
    keys_file: str | None = None                # lines "name sha256:<hex>" (hashed keys)
    key_rpm: Positive | None = 600.0            # requests per minute per API key (None: unlimited)
    key_concurrency: Count = 64                 # requests in flight per API key
    client_limits: str | None = None            # store for the per-key limits (local | sqlite:PATH), shared by replicas
    max_input_chars: Count = 32_000             # longer inputs are refused (context_length_exceeded)
    max_body_bytes: Count = 1_000_000           # larger request bodies are refused (413)
    max_n: Count = 8                            # most choices per request
    max_steps: Count = 5                        # longest workflow the conductor may write
    recursion_depth: Annotated[int, Field(ge=0)] = 0   # extra conductor rounds (paper's recursive test-time scaling)
    fewshot: FewShotField = field(default_factory=lambda: FewShotSpec(policy="auto"))   # auto: informed
                                                # for the untrained embedded conductor, else ood
    constrained: bool | None = None             # workflow grammar; None: on for the embedded conductor
    temperature: Temperature = 0.0              # the conductor's default sampling temperature
    conductor_max_tokens: Annotated[int, Field(ge=16)] = 768   # the conductor's completion limit (as `answer`)
    max_cost: Positive | None = None            # server-wide dollar cap per request (a request may lower it)
    request_timeout_s: Positive = 600.0         # a workflow running longer fails with a timeout
    batch_window_ms: NonNegative = 2.0          # conductor generations arriving this close together share a batch
    max_batch: Count = 64                       # prompts per conductor batch
    extra: dict[str, str] = field(default_factory=dict)

    @field_validator("run_id")
    @classmethod
    def _plain_run_id(cls, v: str | None) -> str | None:
        """The run id is a lake partition: a plain name (``a/b`` or ``../x`` would put rows outside it)."""
        from conductor.lake.storage import check_key

        return None if v is None else check_key("run id", v)
