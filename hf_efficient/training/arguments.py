"""Command-line arguments the training scripts share, named as in transformers' example scripts.

``ModelArguments`` holds where the model comes from and how to fetch it (``--model_name_or_path``,
``--config_name``, ``--tokenizer_name``, ``--cache_dir``, ``--model_revision``, ``--token``,
``--trust_remote_code``, ``--torch_dtype``) plus the random-state flags, and loads the model
(:meth:`ModelArguments.load_model`); each script subclasses it to say what its checkpoint may be.
``VisionModelArguments`` adds ``--image_processor_name``; ``DataCacheArguments`` is ``--overwrite_cache``
for the scripts that preprocess with ``datasets.map``.
``SampleLimitArguments`` caps the examples of each phase (``--max_train_samples`` ...).
:func:`decide_phases` gives ``--do_train`` / ``--do_eval`` / ``--do_predict`` their transformers meaning
when any is given, and keeps the scripts' default (train, then evaluate) when none is.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, TrainingArguments

TORCH_DTYPES = ("auto", "bfloat16", "float16", "float32")
PHASE_FLAGS = ("do_train", "do_eval", "do_predict")


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
        """
        if self.config_name is not None:
            config_class = model_class.config_class
            config = config_class.from_pretrained(self.config_name, **self.download_kwargs(), **config_kwargs)
        elif self.model_name_or_path is None:
            config = model_class.config_class(**config_kwargs)
        if self.model_name_or_path is None:
            return model_class(config)
        overrides = {"config": config} if self.config_name is not None else config_kwargs
        return model_class.from_pretrained(self.model_name_or_path, **overrides, **self.model_kwargs())


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
        raise ValueError(f"--{flag} must be at least 1, got {limit}; leave it out to use every example.")
    return dataset.select(range(min(limit, len(dataset))))


def decide_phases(training_args: TrainingArguments, args: list[str] | None) -> None:
    """With none of ``--do_train`` / ``--do_eval`` / ``--do_predict`` on the command line (``args``, or
    ``sys.argv``), the script trains and evaluates (``do_predict`` stays off); with any of them, exactly the
    phases given run, as in transformers' examples (``--eval_strategy`` other than ``no`` turns
    ``do_eval`` on there too)."""
    given = {arg.removeprefix("--").split("=")[0] for arg in (sys.argv[1:] if args is None else args)}
    if not given & set(PHASE_FLAGS):
        training_args.do_train = training_args.do_eval = True
