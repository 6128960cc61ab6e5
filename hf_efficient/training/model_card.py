"""Model cards for trained models, filled from a template per modality shipped in the package
(``hf_efficient/training/model_cards/``: ``efficient_bert_template.md`` for text,
``efficient_vit_template.md`` for vision, ``efficient_graph_template.md`` for graphs; package data, so a
wheel install has them).

:func:`build_model_card` collects what a reader needs (attention types and their papers, the exact
``attention_config``, data, hyperparameters from ``TrainingArguments``, metrics, efficiency, limitations, how
to load) and renders it through ``huggingface_hub.ModelCard.from_template`` (metadata in ``ModelCardData``).
The scripts save it as ``README.md`` next to the weights, so ``push_to_hub`` publishes it.
"""

from __future__ import annotations

import json
import platform
import resource
import sys
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import PreTrainedModel, TrainingArguments

from ..attention.base import AttentionCore
from ..attention.registry import get_attention_class

MODEL_CARDS = Path(__file__).resolve().parent / "model_cards"  # package data (pyproject.toml)
TEMPLATE_PATHS = {  # config.modality -> template
    "text": MODEL_CARDS / "efficient_bert_template.md",
    "vision": MODEL_CARDS / "efficient_vit_template.md",
    "graph": MODEL_CARDS / "efficient_graph_template.md",
}
TEMPLATE_PATH = TEMPLATE_PATHS["text"]
_AUTO = {  # architecture suffix -> (Auto class, pipeline tag)
    "ForCausalLM": ("AutoModelForCausalLM", "text-generation"),
    "ForMaskedLM": ("AutoModelForMaskedLM", "fill-mask"),
    "ForSequenceClassification": ("AutoModelForSequenceClassification", "text-classification"),
    "ForTokenClassification": ("AutoModelForTokenClassification", "token-classification"),
    "ForQuestionAnswering": ("AutoModelForQuestionAnswering", "question-answering"),
    "ForImageClassification": ("AutoModelForImageClassification", "image-classification"),
    "MAEForPreTraining": ("AutoModelForPreTraining", "image-feature-extraction"),
    "BertForPreTraining": ("AutoModelForPreTraining", "fill-mask"),  # as BERT's own checkpoints
    "ForNextSentencePrediction": ("AutoModelForNextSentencePrediction", "feature-extraction"),
    "ForMultipleChoice": ("AutoModelForMultipleChoice", "feature-extraction"),
    "ForMaskedImageModeling": ("AutoModelForMaskedImageModeling", "image-feature-extraction"),
    "ForGraphClassification": ("AutoModelForSequenceClassification", "graph-ml"),
    "ForNodeClassification": ("AutoModelForTokenClassification", "graph-ml"),
}
_DEFAULT_AUTO = {
    "text": ("AutoModel", "feature-extraction"),
    "vision": ("AutoModel", "image-feature-extraction"),
    "graph": ("AutoModel", "graph-ml"),
}


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def training_hyperparameters(args: TrainingArguments, extra: dict[str, Any] | None = None) -> dict[str, str]:
    """The hyperparameters a reader needs to reproduce a Trainer run (plus script-specific ``extra`` ones)."""
    total_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    values = {
        "learning_rate": args.learning_rate,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "processes (world size)": args.world_size,
        "total_train_batch_size": total_batch,
        "max_steps" if args.max_steps > 0 else "num_train_epochs": args.max_steps
        if args.max_steps > 0
        else args.num_train_epochs,
        "optimizer": f"{args.optim.value if hasattr(args.optim, 'value') else args.optim} (betas "
        f"{args.adam_beta1}, {args.adam_beta2}, eps {args.adam_epsilon})",
        "weight_decay": args.weight_decay,
        "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type),
        "warmup_steps": args.warmup_steps,
        "max_grad_norm": args.max_grad_norm,
        "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        "seed": args.seed,
        **(extra or {}),
    }
    return {name: _format(value) for name, value in values.items()}


def peak_memory() -> tuple[str, float]:
    """(what was measured, MiB): the torch CUDA allocator's peak on GPU, else the process's peak RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return "peak GPU memory (torch allocator, MiB)", torch.cuda.max_memory_allocated() / 2**20
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
    return "peak process RSS (MiB; Python, libraries and data included)", rss


def efficiency_metrics(
    train_metrics: dict[str, float], tokens_per_example: float | None = None
) -> dict[str, str]:
    """Throughput and memory of a ``trainer.train()`` run from its metrics.

    Args:
        train_metrics: ``TrainOutput.metrics`` (``train_runtime``, ``train_samples_per_second``).
        tokens_per_example: tokens in one training example (the block size for MLM, the mean length for
            fine-tuning), to turn examples/s into tokens/s.
    """
    result: dict[str, str] = {}
    samples = train_metrics.get("train_samples_per_second")
    if samples is not None:
        result["training examples/s (all processes)"] = _format(samples)
        if tokens_per_example:
            result["training tokens/s (all processes)"] = f"{samples * tokens_per_example:,.0f}"
    if "train_runtime" in train_metrics:
        result["training time (s)"] = _format(train_metrics["train_runtime"])
    what, mib = peak_memory()
    result[what] = f"{mib:,.0f}"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "CPU"
    threads = f" ({torch.get_num_threads()} CPU threads)" if not torch.cuda.is_available() else ""
    result["device"] = device + threads
    return result


def attention_rows(config) -> list[dict[str, str]]:
    """One row per run of consecutive layers sharing an attention type: layers, type, paper."""
    rows: list[dict[str, Any]] = []
    for layer in range(config.num_hidden_layers):
        name = config.attention_for_layer(layer)[0]
        if rows and rows[-1]["attention_type"] == name:
            rows[-1]["last"] = layer
        else:
            rows.append({"attention_type": name, "first": layer, "last": layer})
    for row in rows:
        row["layers"] = str(row["first"]) if row["first"] == row["last"] else f"{row['first']}-{row['last']}"
        row["paper"] = get_attention_class(row["attention_type"]).paper
    return rows


def _input_size_note(model: PreTrainedModel, modality: str) -> str:
    """What happens with inputs of another size (positions are learned or fixed to the trained size)."""
    config = model.config
    if modality == "graph":
        bias = "; Graphormer's bias costs O(E n^2) per batch with edge features" if config.graph_bias else ""
        cost = f"the cost in nodes is that of each attention type above{bias}"
        return (
            f"Graphs of any size ({cost}); inputs must carry the structural columns the model reads, "
            "computed by the same `hf_efficient.data.graph_transforms` functions as in training."
        )
    if modality == "vision":
        size = f"{config.image_size}x{config.image_size}"
        return (
            f"Trained on {size} images ({config.patch_size}x{config.patch_size} patches, "
            f"{config.num_channels} channel(s)); the image processor resizes other images to {size}. "
            "`interpolate_pos_encoding=True` accepts other sizes (positions resized), untested here."
        )
    if model.get_position_embeddings() is None:  # ModernBERT's rotary positions
        return (
            f"Rotary positions (no table): inputs up to {config.max_position_embeddings} tokens, the "
            "config's max_position_embeddings; longer ones run, untested."
        )
    rows = f" ({config.max_position_embeddings} position rows)" if model.position_offset else ""
    return (
        f"Learned absolute positions: inputs longer than {model.max_input_tokens} tokens{rows} raise. "
        "`model.resize_position_embeddings(rows)` extends the table by copying it; fine-tune afterwards."
    )


_DATA_KIND = {"text": "text", "vision": "images", "graph": "graphs"}


def limitations(model: PreTrainedModel) -> list[str]:
    """What a user of this model must know, derived from the attention cores' declared capabilities."""
    config = model.config
    modality = getattr(config, "modality", "text")
    items = [_input_size_note(model, modality)]
    seen = set()
    for core in (m for m in model.modules() if isinstance(m, AttentionCore)):
        name, caps = core.attention_type, core.capabilities
        if name in seen:
            continue
        seen.add(name)
        if caps.fixed_max_length:
            items.append(
                f"`{name}` has parameters sized by the maximum length: longer inputs need new training."
            )
        if not caps.output_attentions:
            items.append(f"`{name}` never forms the attention matrix: `output_attentions=True` raises.")
        if type(core).resample_random_state is not AttentionCore.resample_random_state:
            items.append(
                f"`{name}` uses random features redrawn during training; inference uses those saved with "
                "the weights, and its outputs approximate exact attention."
            )
    items.append(
        "Trained only on the data above, for the steps listed: quality on other "
        f"{_DATA_KIND.get(modality, 'data')} is unknown, and the model has not been audited for bias."
    )
    return items


def loading_note(config, auto_class: str, pipeline_tag: str, repo_id: str, remote_code: bool) -> str:
    """Markdown for the top of "How to load": what to install, and the ``trust_remote_code`` way when the
    repository ships the modeling code (``--hub_remote_code`` / ``register_for_auto_class``)."""
    install = (
        "Loading needs `pip install hf_efficient`: transformers alone does not know the model type "
        f"`{config.model_type}`, and `import hf_efficient` registers it with the Auto classes."
    )
    if not remote_code:
        return install
    lines = [f"from transformers import {auto_class}", ""]
    if getattr(config, "modality", "text") == "vision":
        lines[0] = f"from transformers import AutoImageProcessor, {auto_class}, pipeline"
        lines.append(f'processor = AutoImageProcessor.from_pretrained("{repo_id}", trust_remote_code=True)')
    lines.append(f'model = {auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)')
    if pipeline_tag == "image-classification":
        lines.append(f'classify = pipeline("{pipeline_tag}", model="{repo_id}", trust_remote_code=True)')
    code = "\n".join(lines)
    return (
        f"{install}\n\nThis repository also ships that code (the `hfe_*.py` files): where hf_efficient is "
        "not installed, `trust_remote_code=True` loads it (read it first: it runs on your machine).\n\n"
        f"```python\n{code}\n```\n\nWith hf_efficient installed:"
    )


def dataset_name(dataset: str) -> str:
    """How the card names a dataset: a local file or folder by its name, never by its path (which means
    nothing on the hub and tells the machine's layout); anything else (a hub id, an offline set) as given."""
    path = Path(dataset)
    return path.name if path.is_absolute() or path.exists() else dataset


def build_model_card(
    model: PreTrainedModel,
    *,
    summary: str,
    data_description: str,
    model_name: str | None = None,
    repo_id: str | None = None,
    datasets: list[str] | None = None,
    base_model: str | None = None,
    training_args: TrainingArguments | None = None,
    extra_hyperparameters: dict[str, Any] | None = None,
    eval_metrics: dict[str, float] | None = None,
    eval_description: str = "On the held-out data described above.",
    eval_dataset: str | None = None,
    efficiency: dict[str, str] | None = None,
    template_path: str | Path | None = None,
    remote_code: bool = False,
    extra_limitations: list[str] | None = None,
) -> ModelCard:
    """Render the model card of ``model`` (see the module docstring). Metrics are given as Trainer reports
    them (``eval_accuracy``); ``eval_dataset`` also puts them in the card's machine-readable model index.
    ``base_model`` (a hub id: the card's ``base_model`` / finetuned-from metadata) and ``datasets`` (hub
    ids or names; a local path by its name, :func:`dataset_name`) go in the metadata; ``remote_code`` says
    the repository ships the modeling code and how to load it with ``trust_remote_code=True``. Without a
    ``repo_id`` the loading code names ``training_args.output_dir`` (and says a hub id replaces it).
    Without ``training_args`` the hyperparameter table lists ``extra_hyperparameters`` alone (a model built
    by several runs, e.g. ``scripts/build_checkpoint.py``); ``extra_limitations`` come after the derived
    ones."""
    config = model.config
    modality = getattr(config, "modality", "text")
    architecture = type(model).__name__
    datasets = list(dict.fromkeys(dataset_name(d) for d in datasets)) if datasets else None
    eval_dataset = dataset_name(eval_dataset) if eval_dataset else None
    auto_class, pipeline_tag = next(
        (v for suffix, v in _AUTO.items() if architecture.endswith(suffix)),
        _DEFAULT_AUTO.get(modality, _DEFAULT_AUTO["text"]),
    )
    model_name = model_name or (Path(repo_id).name if repo_id else architecture)
    rows = attention_rows(config)
    types = [row["attention_type"] for row in rows]
    metrics = {k.removeprefix("eval_"): v for k, v in (eval_metrics or {}).items()}
    skip = ("runtime", "samples_per_second", "steps_per_second", "epoch")
    metrics = {k: v for k, v in metrics.items() if not k.endswith(skip)}
    results = [
        EvalResult(
            task_type=pipeline_tag,
            dataset_type=eval_dataset,
            dataset_name=eval_dataset,
            metric_type=name,
            metric_value=float(value),
        )
        for name, value in metrics.items()
        if eval_dataset and not name.endswith("loss")
    ]
    hub_base_model = base_model if base_model and not Path(base_model).exists() else None  # hub ids only
    card_data = ModelCardData(
        language="en" if modality == "text" else None,
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=["hf_efficient", "efficient-attention", modality, *dict.fromkeys(types)],
        datasets=datasets,
        base_model=hub_base_model,
        model_name=model_name,
        eval_results=results or None,
    )
    attention = {"attention_type": config.attention_type, "attention_config": config.attention_config or {}}
    if config.layer_attention_types:
        attention["layer_attention_types"] = config.layer_attention_types
        attention["layer_attention_configs"] = config.layer_attention_configs
    path = Path(template_path or TEMPLATE_PATHS.get(modality, TEMPLATE_PATH))
    if not path.exists():
        raise FileNotFoundError(
            f"Model card template {path} not found; pass template_path= to build_model_card."
        )
    note = ""
    if repo_id is None:  # a local card: the folder as the run was given it; a hub id once pushed
        folder = training_args.output_dir if training_args is not None and training_args.output_dir else None
        repo_id = folder or "path/to/this/model"
        note = (
            f"`{repo_id}` below is the folder this model was saved in (relative to where the run started); "
            "once it is pushed to the hub, its repository id (`your-name/model-name`) loads it the same "
            "way.\n\n"
        )
    return ModelCard.from_template(
        card_data,
        template_path=str(path),
        loading_note=note + loading_note(config, auto_class, pipeline_tag, repo_id, remote_code),
        model_name=model_name,
        summary=summary,
        architecture=architecture,
        auto_class=auto_class,
        pipeline_tag=pipeline_tag,
        repo_id=repo_id,
        attention_rows=rows,
        attention_json=json.dumps(attention, indent=2, sort_keys=True),
        config=config,
        num_parameters=f"{model.num_parameters():,}",
        data_description=data_description,
        hyperparameters=training_hyperparameters(training_args, extra_hyperparameters)
        if training_args
        else {name: _format(value) for name, value in (extra_hyperparameters or {}).items()},
        eval_metrics={k: _format(v) for k, v in metrics.items()},
        eval_description=eval_description,
        efficiency=efficiency or {},
        limitations=[*limitations(model), *(extra_limitations or [])],
        structural_inputs=config.structural_inputs() if hasattr(config, "structural_inputs") else [],
        decoding_state=decoding_state(model),
    )


def decoding_state(model: PreTrainedModel) -> list[dict[str, str]]:
    """For a causal model, what generation keeps per layer (one row per attention type); [] otherwise."""
    if not getattr(model.config, "is_decoder", False) or not hasattr(model, "new_cache"):
        return []
    rows: dict[str, str] = {}
    for core, layer in zip(model.attention_cores(), model.new_cache().layers, strict=True):
        rows.setdefault(core.attention_type, layer.describe())
    return [{"attention_type": name, "state": state} for name, state in rows.items()]


def save_model_card(card: ModelCard, output_dir: str | Path) -> Path:
    """Write the card as ``README.md`` in ``output_dir`` (where ``save_pretrained`` put the model)."""
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path
