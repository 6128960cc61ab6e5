"""Training utilities shared by the scripts: callbacks for Trainer and helpers for Accelerate loops."""

from .callbacks import RandomStateCallback, resample_attention_random_state, step_seed

__all__ = ["RandomStateCallback", "resample_attention_random_state", "step_seed"]
