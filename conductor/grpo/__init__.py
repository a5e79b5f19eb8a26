"""GRPO on stored rollouts: advantages, the clipped objective, the training step, fine-tune modes.

Pure parts (``advantages``, ``modes``, ``samples``, ``config``) import no torch; ``loss`` and
``trainer`` import torch/transformers inside their functions.
"""

from conductor.grpo.advantages import group_advantages, trajectory_advantages
from conductor.grpo.config import GRPOConfig

__all__ = ["GRPOConfig", "group_advantages", "trajectory_advantages"]
