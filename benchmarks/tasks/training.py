"""What the training programs of the generated tasks (``train_listops``, ``train_mqar``) share: one run,
trained and evaluated, and the record of it their results JSON holds."""

from __future__ import annotations

from transformers import Trainer

from hf_efficient.training.model_card import efficiency_metrics
from hf_efficient.training.run import evaluate_and_save, train_and_save


def generated_task_run(trainer: Trainer, data: dict, tokens_per_example: float) -> tuple[dict, dict, dict]:
    """Train, then evaluate on the validation and test splits that ``data`` has.

    Returns:
        (metrics: ``eval_*`` and ``test_*`` together, efficiency: :func:`efficiency_metrics` of the training,
        record: what their results JSON holds about the run whatever the task: time, steps, seconds per
        step, model sizes, the schedule and the validation curve as [step, accuracy] pairs).
    """
    train_result = train_and_save(trainer)
    efficiency = efficiency_metrics(train_result.metrics, tokens_per_example)
    metrics: dict[str, float] = {}
    for split, prefix in (("validation", "eval"), ("test", "test")):
        if split in data:
            metrics.update(evaluate_and_save(trainer, data[split], prefix))
    args, config, steps = trainer.args, trainer.model.config, train_result.global_step
    runtime = train_result.metrics.get("train_runtime")
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    schedule = ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "max_steps", "seed")
    # Validation accuracy during training (eval_strategy "steps"), then the final evaluation's.
    curve = [[e["step"], e["eval_accuracy"]] for e in trainer.state.log_history
             if "eval_accuracy" in e and e["step"] < steps]  # fmt: skip
    if "eval_accuracy" in metrics:
        curve.append([steps, metrics["eval_accuracy"]])
    record = {
        "train_runtime": runtime,
        "steps": steps,
        "seconds_per_step": runtime / steps if steps and runtime is not None else None,
        "num_parameters": trainer.model.num_parameters(),
        "model": {key: getattr(config, key) for key in sizes},
        "training": {key: getattr(args, key) for key in schedule},
        "eval_curve": curve,
        "output_dir": str(args.output_dir),
    }
    return metrics, efficiency, record
