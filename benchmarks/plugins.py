"""``--plugin MODULE``: benchmark attention types registered outside the package.

A plugin is a module, given by dotted name or by the path of a ``.py`` file, that registers attention types
when imported (``@register_attention("my_type")`` on an ``AttentionCore`` subclass). A CLI parses its options
with :func:`parse_args_with_plugins`, which imports the plugins before the parser is built, so the
registry's type lists (defaults, choices) include their types; :func:`benchmarks.harness.launch` passes them
on to every worker process, which imports them again before measuring its point.

    python -m benchmarks.attention --preset smoke --plugin my_attention.py --plugin my_package.more_types
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType


def load_plugin(name_or_path: str) -> ModuleType:
    """Import a module that registers attention types: a dotted name, or a ``.py`` file's path.

    A file already imported (by path or as a module) is not executed again, so its registrations are not
    repeated.
    """
    path = Path(name_or_path)
    if path.suffix != ".py":
        return importlib.import_module(name_or_path)
    path = path.resolve()
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    spec = importlib.util.spec_from_file_location(f"benchmark_plugin_{path.stem}", path)
    if spec is None:
        raise FileNotFoundError(f"--plugin {name_or_path}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look their module up here
    spec.loader.exec_module(module)
    return module


def load_plugins(plugins: Sequence[str]) -> None:
    """:func:`load_plugin` each, in order."""
    for plugin in plugins:
        load_plugin(plugin)


def add_plugin_argument(parser: argparse.ArgumentParser) -> None:
    """``--plugin MODULE``, repeatable (parse with :func:`parse_args_with_plugins`)."""
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module (dotted name or .py path) that registers extra attention types; repeatable",
    )


def parse_args_with_plugins(
    make_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """Load the ``--plugin`` modules first, then build the parser (its defaults and choices may list the
    registered types, plugins' included) and parse."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    load_plugins(pre.parse_known_args(argv)[0].plugin)
    return make_parser().parse_args(argv)
