"""transformers' own test mixins, imported from its source distribution (``make upstream-tests`` fetches it).

The sdist of the installed transformers version ships ``tests/test_modeling_common.py`` (ModelTesterMixin) and
``tests/test_configuration_common.py`` (ConfigTester), but not the modules they import from
``tests/exporters/``, ``tests/generation/`` and ``tests/utils/``: small stand-ins fill those in. Its
``tests`` package would clash with ours by name, so it is imported as :data:`PACKAGE`. :func:`load` returns
None when the sdist is absent (the tests then skip, naming the make target); nothing here downloads anything.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import transformers
from transformers.models.auto import modeling_auto

PACKAGE = "transformers_sdist_tests"
MAKE_TARGET = "make upstream-tests"
ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = ROOT / "build" / "upstream" / f"transformers-{transformers.__version__}" / "tests"

# config_common_kwargs (the sdist lacks tests/utils/test_configuration_utils.py): fields every
# PreTrainedConfig takes, each set to a value other than its default; ConfigTester checks each one survives
# construction.
CONFIG_COMMON_KWARGS = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "problem_type": "regression",
    "id2label": {0: "negative", 1: "positive"},
    "label2id": {"negative": 0, "positive": 1},
    "is_encoder_decoder": False,
}


class ExportTesterMixin:
    """Stand-in for tests/exporters/test_export.py (not in the sdist): no export tests from upstream; our
    own export tests are tests/test_export.py."""


class GenerationTesterMixin:
    """Stand-in for tests/generation/test_utils.py (not in the sdist): no generate() tests from upstream;
    ours are tests/models/text/test_generation*.py."""


STAND_INS = {
    "exporters": {},
    "exporters.test_export": {"ExportTesterMixin": ExportTesterMixin},
    "generation": {},
    "generation.test_utils": {"GenerationTesterMixin": GenerationTesterMixin},
    "utils": {},
    "utils.test_configuration_utils": {"config_common_kwargs": CONFIG_COMMON_KWARGS},
}


def _install_package() -> None:
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(TESTS_DIR)]  # the sdist's own modules are found here
    sys.modules[PACKAGE] = package
    for name, contents in STAND_INS.items():
        module = types.ModuleType(f"{PACKAGE}.{name}")
        module.__dict__.update(contents)
        if "." not in name:
            module.__path__ = []  # a package holding only stand-ins
        sys.modules[module.__name__] = module


def _register_auto_names(common: types.ModuleType) -> None:
    """Add the classes registered with the Auto classes (``AutoModelForMaskedLM.register``: ours) to the
    ``MODEL_FOR_*_MAPPING_NAMES`` tables the common tests read (which labels a class gets, which class is a
    base model): copies in the loaded module only, transformers' own tables stay as they are."""
    for mapping in vars(modeling_auto).values():
        if not isinstance(mapping, modeling_auto._LazyAutoMapping):
            continue
        names, registered = mapping._model_mapping, mapping._extra_content
        for attribute, value in vars(common).items():
            if value is names and registered:
                # a tuple entry (DeiT's two classifiers) is a tuple of names, as transformers' own tables have
                extra = {
                    config.model_type: tuple(m.__name__ for m in model)
                    if isinstance(model, tuple)
                    else model.__name__
                    for config, model in registered.items()
                }
                setattr(common, attribute, {**names, **extra})


def load() -> types.SimpleNamespace | None:
    """The sdist's test modules (``modeling``, ``configuration``), or None without the sdist.

    Not ``test_pipeline_mixin.py``: at import it reads ``tests/utils/tiny_model_summary.json`` and
    ``src/transformers``, which the sdist's tests folder lacks, and its tests load tiny models from the Hub
    and run the per-task classes of ``tests/pipelines/`` (absent too). Our pipelines are tested in
    tests/models/*/test_pipelines*.py."""
    if not (TESTS_DIR / "test_modeling_common.py").is_file():
        return None
    if PACKAGE not in sys.modules:
        # test_configuration_common.py runs tests/__init__.py (empty upstream, absent from the sdist)
        (TESTS_DIR / "__init__.py").touch()
        _install_package()
    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    _register_auto_names(modeling)
    return types.SimpleNamespace(
        modeling=modeling,
        configuration=importlib.import_module(f"{PACKAGE}.test_configuration_common"),
    )
