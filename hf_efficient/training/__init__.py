"""Training utilities shared by the scripts: callbacks, metrics, config files, model cards."""

from .callbacks import RandomStateCallback, has_random_state, resample_attention_random_state, step_seed
from .config_files import ConfigArguments, load_config_file, merge_model_configs, parse_args_with_config_files
from .distributed import enable_cpu_ddp_if_launched
from .metrics import METRICS, build_compute_metrics, compute_task_metrics, predictions_from_logits
from .model_card import build_model_card, efficiency_metrics, save_model_card, training_hyperparameters
from .run import RandomStateArguments, evaluate_and_save, random_state_callbacks, setup_run, train_and_save

__all__ = [
    "METRICS",
    "ConfigArguments",
    "RandomStateArguments",
    "RandomStateCallback",
    "build_compute_metrics",
    "build_model_card",
    "compute_task_metrics",
    "efficiency_metrics",
    "evaluate_and_save",
    "enable_cpu_ddp_if_launched",
    "has_random_state",
    "load_config_file",
    "merge_model_configs",
    "parse_args_with_config_files",
    "predictions_from_logits",
    "random_state_callbacks",
    "resample_attention_random_state",
    "save_model_card",
    "setup_run",
    "step_seed",
    "train_and_save",
    "training_hyperparameters",
]
