"""Conductor: a small model that writes workflows over a pool of LLM workers.

Importing this package is cheap: torch, vllm, transformers and prefect are only
imported inside the functions that need them.
"""

from conductor.workflow import ALL, Step, Workflow, WorkflowError

__all__ = ["ALL", "Step", "Workflow", "WorkflowError"]
__version__ = "0.1.0"
