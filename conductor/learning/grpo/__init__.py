"""GRPO on stored rollouts: advantages, the clipped objective, the training step, fine-tune modes.

Pure parts (``advantages``, ``modes``, ``samples``, ``config``) import no torch; ``loss`` and
``trainer`` import torch/transformers/trl inside their functions, so importing this package is cheap.
"""

from conductor.learning.grpo.advantages import group_advantages, trajectory_advantages
from conductor.learning.grpo.config import GRPOConfig, lr_at
from conductor.learning.grpo.modes import RandomizedPoolConfig, forced_recursion_samples
from conductor.learning.grpo.samples import build_samples
from conductor.learning.grpo.trainer import PolicyTrainer, TrainError, grpo_step

__all__ = ["GRPOConfig", "PolicyTrainer", "RandomizedPoolConfig", "TrainError", "build_samples",
           "forced_recursion_samples", "group_advantages", "grpo_step", "lr_at", "trajectory_advantages"]
