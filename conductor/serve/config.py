"""What a ``conductor serve`` process is configured with (CLI options map one to one).

A pydantic dataclass: the conductor spec, the few-shot setting and the limits store are parsed once, here, into
the same types the run configurations hold (conductor/policy/spec.py, conductor/prompts.py,
conductor/execution/shared_limits.py); a bad one fails at construction with the field named.
"""

from __future__ import annotations

from dataclasses import field

from pydantic.dataclasses import dataclass

from conductor.execution.shared_limits import LimitsField
from conductor.policy.spec import AutoSpec, ConductorSpecField
from conductor.prompts import FewShotField, FewShotSpec


@dataclass
class ServeConfig:
    pool: str                                   # pool manifest the conductor runs over (named in /v1/models)
    conductor: ConductorSpecField = field(default_factory=AutoSpec)   # untrained default when no champion
    registry: str | None = None                 # champion registry (default: $CONDUCTOR_REGISTRY / CONDUCTOR_HOME)
    reload_s: float = 2.0                       # how often the champion alias is re-read (0: never)
    lake: str | None = None                     # served traffic goes here (None: not recorded)
    store_text: bool = False                    # keep the user's text in the lake (else redacted)
    lake_batch: int = 256                       # rows per lake shard at most
    lake_flush_s: float = 5.0                   # a shard is written at least this often while traffic flows
    run_id: str | None = None                   # lake run id (default: served-<UTC date>)
    limits: LimitsField | None = None           # where the worker rate limits live: local | sqlite:PATH | prefect
    cache: str | None = None                    # optional response cache (sqlite path)
    api_keys_env: str = "CONDUCTOR_SERVE_API_KEYS"   # NAME of the variable holding keys (name=key,...)
    keys_file: str | None = None                # lines "name sha256:<hex>" (hashed keys)
    key_rpm: float | None = 600.0               # requests per minute per API key (None: unlimited)
    key_concurrency: int = 64                   # requests in flight per API key
    client_limits: str | None = None            # store for the per-key limits (local | sqlite:PATH), shared by replicas
    max_input_chars: int = 32_000               # longer inputs are refused (context_length_exceeded)
    max_body_bytes: int = 1_000_000             # larger request bodies are refused (413)
    max_n: int = 8                              # most choices per request
    max_steps: int = 5                          # longest workflow the conductor may write
    recursion_depth: int = 0                    # extra conductor rounds (paper's recursive test-time scaling)
    fewshot: FewShotField = field(default_factory=lambda: FewShotSpec(policy="auto"))   # auto: informed
                                                # for the untrained embedded conductor, else ood
    constrained: bool | None = None             # workflow grammar; None: on for the embedded conductor
    temperature: float = 0.0                    # the conductor's default sampling temperature
    conductor_max_tokens: int = 768             # the conductor's completion limit (as `conductor answer`)
    max_cost: float | None = None               # server-wide dollar cap per request (a request may lower it)
    request_timeout_s: float = 600.0            # a workflow running longer fails with a timeout
    batch_window_ms: float = 2.0                # conductor generations arriving this close together share a batch
    max_batch: int = 64                         # prompts per conductor batch
    extra: dict[str, str] = field(default_factory=dict)
