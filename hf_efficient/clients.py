"""What the libraries users bring to our models need to know about them, told once, generically: every config
class ``hf_efficient.models`` registers with ``AutoConfig`` gets the same treatment, so a new model family
needs nothing here.

* PEFT keys its default target modules (LoRA's ``["query", "value"]`` for ``bert``, IA3's, ...) by
  ``model_type``, and knows ``bert`` and ``vit``, not ``efficient_bert``: without them
  ``LoraConfig(task_type=...)`` raised "Please specify `target_modules` in `peft_config`". Our model types
  get the defaults of the upstream type their config maps onto (the config class's
  ``compatible_model_types``: its weights keep those names), in every mapping PEFT has, once PEFT is
  imported (:func:`when_imported`: importing PEFT costs half a second, which a user without it should not
  pay).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Iterable
from types import ModuleType

PEFT_MAPPINGS = "peft.utils.constants"  # PEFT's TRANSFORMERS_MODELS_TO_<METHOD>_..._MAPPING dicts
PEFT_MAPPING_PREFIX = "TRANSFORMERS_MODELS_TO_"


def register_peft_defaults(config_classes: Iterable[type], constants: ModuleType) -> None:
    """Give each model type of ``config_classes`` the PEFT defaults of the first of its config's
    ``compatible_model_types`` that a mapping of PEFT's ``constants`` knows, in every such mapping (target
    modules of each method, feed-forward modules, layer names...); a model type PEFT already knows keeps its
    entry."""
    for name, mapping in vars(constants).items():
        if not (name.startswith(PEFT_MAPPING_PREFIX) and isinstance(mapping, dict)):
            continue
        for config_class in config_classes:
            upstream = next((t for t in config_class.compatible_model_types if t in mapping), None)
            if upstream is not None:
                mapping.setdefault(config_class.model_type, mapping[upstream])


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` once the module ``name`` is imported: now if it already is, else right after
    its import (a finder placed first on ``sys.meta_path`` wraps that one import, then leaves)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the module ``name``, takes the spec the other finders give and runs
    ``callback`` after its loader has executed it."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; and find_spec below asks the others
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call
        return spec


def register_with_peft(config_classes: Iterable[type]) -> None:
    """:func:`register_peft_defaults` for ``config_classes`` (read then) when PEFT's mappings are imported."""
    when_imported(PEFT_MAPPINGS, lambda constants: register_peft_defaults(config_classes, constants))
