"""Import a script from scripts/ as a module, so tests can call its ``main(args)`` in-process.

tests/conftest.py also serves each script as a session fixture of the same name (``pretrain_mlm``,
``finetune_glue``, ...).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CONFIGS = ROOT / "configs"
SCRIPT_NAMES = (
    "pretrain_mlm",
    "pretrain_clm",
    "finetune_glue",
    "finetune_qa",
    "fill_mask",
    "distill_attention",
    "pretrain_mae",
    "finetune_image_classification",
    "train_graph",
    "export",
    "serve_onnx",
)
# Arguments of every in-process training run in the tests: no reporting integration, a fixed seed.
QUIET = ["--report_to", "none", "--seed", "0"]


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``<name>`` (registered in ``sys.modules`` for its dataclasses)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
