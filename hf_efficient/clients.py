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
* sentence-transformers reads a folder as an embedder from its ``modules.json`` (the modules: the
  transformer, its pooling...) and ``sentence_bert_config.json`` (``max_seq_length``). Without them it
  guesses: mean pooling (a sentence-transformers checkpoint's own pooling and normalisation are lost) and a
  ``max_seq_length`` of the tokenizer's ``model_max_length`` (a 4,096-position model saved with BERT's
  tokenizer reads 512 tokens). The save of a text encoder (the family's ``AutoModel`` class, not a decoder)
  writes them (:func:`write_sentence_transformers_files`): the modules of the checkpoint it was loaded from,
  else mean pooling, and ``max_seq_length`` = the tokens its position table holds
  (``max_position_embeddings``, less RoBERTa's two rows before the first position).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

from .compat import auto_model_mapping

SENTENCE_TRANSFORMERS_MODULES = "modules.json"
SENTENCE_TRANSFORMERS_CONFIG = "sentence_bert_config.json"
POOLING_FOLDER = "1_Pooling"
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


def register_with_peft(config_classes: Callable[[], Iterable[type]]) -> None:
    """:func:`register_peft_defaults` for the ``config_classes()`` there are when PEFT's mappings are
    imported."""
    when_imported(PEFT_MAPPINGS, lambda constants: register_peft_defaults(config_classes(), constants))


def fits_sentence_transformers(model) -> bool:
    """Whether ``model`` is a text encoder that sentence-transformers embeds with: its family's ``AutoModel``
    class (not a head), and not a decoder."""
    from transformers import AutoModel

    config = model.config
    if getattr(config, "modality", None) != "text" or getattr(config, "is_decoder", False):
        return False
    mapping = auto_model_mapping(AutoModel)
    return mapping is not None and type(config) in mapping and mapping[type(config)] is type(model)


def write_sentence_transformers_files(model, folder: str | Path) -> None:
    """Write into ``folder`` what sentence-transformers reads to embed with the saved ``model``: the
    ``modules.json`` (and module folders) of the sentence-transformers checkpoint it was loaded from (its
    ``name_or_path``: all-MiniLM-L6-v2's mean pooling and normalisation), else a transformer and mean
    pooling; and ``sentence_bert_config.json`` with ``max_seq_length`` = ``max_position_embeddings``."""
    folder, config = Path(folder), model.config
    source = Path(str(config.name_or_path or ""))
    from_checkpoint = (
        source / SENTENCE_TRANSFORMERS_MODULES
    ).is_file() and source.resolve() != folder.resolve()
    lower_case = False
    if from_checkpoint:
        modules = json.loads((source / SENTENCE_TRANSFORMERS_MODULES).read_text())
        for module in modules:
            if module.get("path") and (source / module["path"]).is_dir():
                shutil.copytree(source / module["path"], folder / module["path"], dirs_exist_ok=True)
        if (source / SENTENCE_TRANSFORMERS_CONFIG).is_file():
            lower_case = json.loads((source / SENTENCE_TRANSFORMERS_CONFIG).read_text()).get(
                "do_lower_case", False
            )
    elif not (folder / SENTENCE_TRANSFORMERS_MODULES).is_file():
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": POOLING_FOLDER, "type": "sentence_transformers.models.Pooling"},
        ]
        pooling = {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}
        (folder / POOLING_FOLDER).mkdir(exist_ok=True)
        (folder / POOLING_FOLDER / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    else:  # saved again into its own folder: its modules stay
        modules = json.loads((folder / SENTENCE_TRANSFORMERS_MODULES).read_text())
    (folder / SENTENCE_TRANSFORMERS_MODULES).write_text(json.dumps(modules, indent=2) + "\n")
    # the tokens the position table holds: RoBERTa's first rows (padding, and the one before) hold none
    settings = {"max_seq_length": model.max_input_tokens, "do_lower_case": lower_case}
    (folder / SENTENCE_TRANSFORMERS_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")
