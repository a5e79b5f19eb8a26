"""Conductor policy backends: prompts in, n sampled completions (token ids, log-probs) out.

Backends import their heavy libraries only when built; ``make_policy(spec)`` picks one.
"""

from conductor.generation import Generation, GenerationParams, PolicyBackend
from conductor.policy.factory import PolicySpec, PolicySpecError, make_policy, parse_spec

__all__ = ["Generation", "GenerationParams", "PolicyBackend", "PolicySpec", "PolicySpecError", "make_policy", "parse_spec"]
