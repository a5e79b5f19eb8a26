"""What ``conductor prompt`` and ``conductor parse`` are set with: the two ends of the conductor's language (the
prompt it reads, the workflow it writes). Configuration models (``RunConfig``) whose fields the commands' options
are generated from (conductor/cli/run_options.py).

WHY here and not beside conductor/prompts.py and conductor/parser.py: those sit floors below conductor/run/,
where ``RunConfig`` is; a model beside them would import back up the layering. No ``--config``: each command
turns one text into another. What stays declared by hand is what is not a setting: the question or file read,
and ``parse --render`` (an output format).
"""

from __future__ import annotations

from pydantic import Field

from conductor.run.config import DEFAULT_POOL, MaxSteps, RunConfig
from conductor.workflow import DEFAULT_MAX_STEPS


class PromptConfig(RunConfig):
    """``conductor prompt QUESTION``."""

    pool: str = Field(DEFAULT_POOL, description="Pool manifest.")
    k: int | None = Field(None, ge=1, description="Show a random k-of-n sub-pool instead of the whole pool.")
    seed: int = Field(0, description="Seed for the sub-pool.")
    fewshot: str = Field("ood", description="Few-shot policy: ood, in_domain, mixed or none, optionally :k "
                         "(e.g. ood:1).")
    max_steps: MaxSteps = Field(DEFAULT_MAX_STEPS, description="Most steps a workflow may have.")


class ParseConfig(RunConfig):
    """``conductor parse [FILE]``."""

    pool: str | None = Field(None, description="Pool manifest: also check worker indices against it.")
    max_steps: MaxSteps = Field(DEFAULT_MAX_STEPS, description="Most steps a workflow may have.")
    allow_empty: bool = Field(False, description="Accept three empty lists (a recursion round).")
    binary: bool = Field(False, description="Only \"all\" or [] access entries (the paper's default scheme).")
