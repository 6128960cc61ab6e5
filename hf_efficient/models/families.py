"""The model families: for each checkpoint family (BERT, RoBERTa, ViT, ...), our config class, the upstream
model types whose checkpoints load into it, and its model class per transformers Auto class.

Registering a family (:func:`register_family`, done for every family by ``import hf_efficient``) registers
its config and models with the Auto classes (which also gives a saved model's remote code its ``auto_map``)
and tells the configs which checkpoint types map onto which family, so a checkpoint of one family offered to
another's class is refused naming the class that takes it. :func:`model_class_for` finds a family's class for
a task, which is how the scripts take a checkpoint of any family.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from transformers import AutoConfig, AutoImageProcessor, PretrainedConfig

from ..errors import InputError
from ..modeling.config import CHECKPOINT_CONFIGS


@dataclass(frozen=True)
class ModelFamily:
    """One checkpoint family.

    Attributes:
        config_class: our config (its ``model_type`` and ``compatible_model_types``: the upstream types whose
            checkpoints load into it).
        models: transformers Auto class -> our model class for that task (``AutoModel`` -> the bare model).
        image_processor: the processor ``AutoImageProcessor`` gives for this family's checkpoints (vision).
        alternatives: Auto class -> other classes of that task, which the Auto class gives for checkpoints
            whose ``architectures`` name them (DeiT's classifier with a teacher beside its plain one, as
            transformers registers both); a class says so with ``auto_class_by_architecture = True``.
    """

    config_class: type[PretrainedConfig]
    models: Mapping[type, type] = field(default_factory=dict)
    image_processor: type | None = None
    alternatives: Mapping[type, tuple[type, ...]] = field(default_factory=dict)

    @classmethod
    def collect(cls, config_class: type, module: ModuleType, image_processor: type | None = None):
        """The family of ``config_class`` whose models are the classes of ``module`` built on it that name
        their task (``auto_class``): a head added to a family's module is registered with it."""
        models: dict[type, type] = {}
        alternatives: dict[type, tuple[type, ...]] = {}
        for value in vars(module).values():
            if not (isinstance(value, type) and value.__module__ == module.__name__):
                continue
            auto_class = getattr(value, "auto_class", None)
            if auto_class is None or getattr(value, "config_class", None) is not config_class:
                continue
            if getattr(value, "auto_class_by_architecture", False):
                alternatives[auto_class] = (*alternatives.get(auto_class, ()), value)
                continue
            if auto_class in models:
                raise TypeError(
                    f"{module.__name__}: {models[auto_class].__name__} and {value.__name__} both serve "
                    f"{auto_class.__name__} for {config_class.__name__}; a family has one class per task."
                )
            models[auto_class] = value
        orphans = [classes[0].__name__ for auto, classes in alternatives.items() if auto not in models]
        if orphans:
            raise TypeError(
                f"{module.__name__}: {orphans} have no default class of their task to stand beside."
            )
        return cls(config_class, models, image_processor, alternatives)

    def classes(self) -> tuple[type, ...]:
        """Every model class of the family (each task's, and the alternatives beside them), and its image
        processor."""
        alternatives = (cls for classes in self.alternatives.values() for cls in classes)
        processor = (self.image_processor,) if self.image_processor is not None else ()
        return (*self.models.values(), *alternatives, *processor)

    @property
    def checkpoint_types(self) -> tuple[str, ...]:
        """Every ``model_type`` whose checkpoints load into this family: ours, then upstream's."""
        return (self.config_class.model_type, *self.config_class.compatible_model_types)

    @property
    def name(self) -> str:
        """The upstream family name (``bert``), or ours where there is none (``efficient_graph``)."""
        return self.checkpoint_types[1] if len(self.checkpoint_types) > 1 else self.checkpoint_types[0]


FAMILIES: dict[str, ModelFamily] = {}  # by our model_type, in registration order


def register_family(family: ModelFamily) -> None:
    """Register a family with the Auto classes and the configs' checkpoint map (idempotent: importing the
    package twice is a no-op)."""
    config_class = family.config_class
    FAMILIES[config_class.model_type] = family
    for model_type in family.checkpoint_types:
        CHECKPOINT_CONFIGS[model_type] = config_class
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_class, model_class in family.models.items():
        # transformers' tuple entry: the first class, unless a checkpoint's architectures name another
        others = family.alternatives.get(auto_class, ())
        auto_class.register(config_class, (model_class, *others) if others else model_class, exist_ok=True)
    if family.image_processor is not None:
        processors = {"pil": family.image_processor}
        AutoImageProcessor.register(config_class, image_processor_classes=processors, exist_ok=True)


def family_of(model_type: str) -> ModelFamily:
    """The family whose checkpoints have ``model_type`` (ours, ``efficient_roberta``, or upstream's,
    ``roberta``).

    Raises:
        InputError: no family takes it, listing the types that load.
    """
    for family in FAMILIES.values():
        if model_type in family.checkpoint_types:
            return family
    known = ", ".join(t for family in FAMILIES.values() for t in family.checkpoint_types[1:])
    raise InputError(
        f"No hf_efficient model family takes checkpoints of model_type {model_type!r}. The families load "
        f"checkpoints of: {known} (and the efficient_* types hf_efficient saves)."
    )


def task_of(model_class: type) -> type:
    """The Auto class ``model_class`` is registered with (its task): ``AutoModelForMaskedLM`` for
    ``EfficientBertForMaskedLM``."""
    for family in FAMILIES.values():
        for auto_class, registered in family.models.items():
            if model_class in (registered, *family.alternatives.get(auto_class, ())):
                return auto_class
    raise ValueError(f"{model_class.__name__} is not a registered hf_efficient model.")


def model_class_for(model_class: type, model_type: str) -> type:
    """The class of the family of ``model_type`` for the task of ``model_class``:
    ``model_class_for(EfficientBertForMaskedLM, "roberta")`` is ``EfficientRobertaForMaskedLM``.

    Raises:
        InputError: no family takes ``model_type``, or its family has no model for that task.
    """
    family, task = family_of(model_type), task_of(model_class)
    if task not in family.models:
        tasks = ", ".join(sorted(auto.__name__ for auto in family.models))
        raise InputError(
            f"The {family.name} family has no model for {task.__name__} (a checkpoint of model_type "
            f"{model_type!r}); its models: {tasks}."
        )
    return family.models[task]


def class_for_checkpoint(model_class: type, path: str | Path | None) -> type:
    """The class for ``model_class``'s task of the family whose checkpoint ``path`` holds (its local
    config.json's ``model_type``: a RoBERTa folder and ``EfficientBertForMaskedLM`` give
    ``EfficientRobertaForMaskedLM``); ``model_class`` itself where there is no config to read (no path, a
    hub id: its config class maps or refuses the checkpoint when loading).

    Raises:
        InputError: no family takes that ``model_type``, or its family has no model for the task.
    """
    model_type = checkpoint_model_type(path) if path else None
    return model_class if model_type is None else model_class_for(model_class, model_type)


def checkpoint_model_type(path: str | Path) -> str | None:
    """The ``model_type`` in a local checkpoint folder's (or config file's) config.json, or None where there
    is none to read (a hub id: the config class reads it when loading)."""
    path = Path(path)
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return None  # a broken file: the loader's own error says what is wrong with it
