"""Training utilities shared by the scripts: trainer, callbacks, metrics, config files, cards, distilling."""

from .arguments import (
    DataCacheArguments,
    ModelArguments,
    SampleLimitArguments,
    VisionModelArguments,
    decide_phases,
    first_examples,
)
from .callbacks import (
    OneProgressBarCallback,
    RandomStateCallback,
    has_random_state,
    resample_attention_random_state,
    step_seed,
)
from .checkpoints import last_checkpoint, resolve_resume_checkpoint
from .config_files import ConfigArguments, load_config_file, merge_model_configs, parse_args_with_config_files
from .distillation import (
    AttentionDistillationTrainer,
    attention_settings,
    check_attention_changed,
    layer_relative_errors,
)
from .distributed import enable_cpu_ddp_if_launched, end_distributed_run
from .language_modeling import (
    LanguageModelArguments,
    LanguageModelDataArguments,
    evaluate_perplexity,
    language_model,
    language_model_blocks,
    language_model_tokenizer,
    pretrain_language_model,
)
from .metrics import (
    METRICS,
    build_compute_metrics,
    combine_metrics,
    compute_task_metrics,
    load_metric,
    masked_lm_accuracy,
    masked_lm_predictions,
    metric_path,
    predictions_from_logits,
)
from .model_card import build_model_card, efficiency_metrics, save_model_card, training_hyperparameters
from .output_dir import OutputDirInUseError, OutputDirNotEmptyError, claim_output_dir
from .run import (
    EfficientTrainingArguments,
    RandomStateArguments,
    evaluate_and_save,
    finish_run,
    random_state_callbacks,
    random_state_settings,
    setup_run,
    train_and_save,
)
from .trainer import EfficientTrainer, no_weight_decay_parameter_names

__all__ = [
    "METRICS",
    "ModelArguments",
    "VisionModelArguments",
    "DataCacheArguments",
    "SampleLimitArguments",
    "decide_phases",
    "first_examples",
    "AttentionDistillationTrainer",
    "ConfigArguments",
    "EfficientTrainer",
    "EfficientTrainingArguments",
    "LanguageModelArguments",
    "LanguageModelDataArguments",
    "OutputDirInUseError",
    "OutputDirNotEmptyError",
    "RandomStateArguments",
    "OneProgressBarCallback",
    "RandomStateCallback",
    "attention_settings",
    "build_compute_metrics",
    "check_attention_changed",
    "claim_output_dir",
    "combine_metrics",
    "load_metric",
    "masked_lm_accuracy",
    "masked_lm_predictions",
    "metric_path",
    "build_model_card",
    "compute_task_metrics",
    "efficiency_metrics",
    "evaluate_and_save",
    "evaluate_perplexity",
    "enable_cpu_ddp_if_launched",
    "end_distributed_run",
    "finish_run",
    "has_random_state",
    "language_model",
    "language_model_blocks",
    "language_model_tokenizer",
    "last_checkpoint",
    "layer_relative_errors",
    "load_config_file",
    "merge_model_configs",
    "no_weight_decay_parameter_names",
    "parse_args_with_config_files",
    "predictions_from_logits",
    "pretrain_language_model",
    "random_state_callbacks",
    "random_state_settings",
    "resample_attention_random_state",
    "resolve_resume_checkpoint",
    "save_model_card",
    "setup_run",
    "step_seed",
    "train_and_save",
    "training_hyperparameters",
]
