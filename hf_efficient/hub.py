"""Remote code: a saved model that ``trust_remote_code=True`` loads where hf_efficient is not installed.

transformers' own copy (``register_for_auto_class`` + ``save_pretrained``) takes the modeling file and the
``from .x import`` siblings it names into one flat folder; this package's ``from ...modeling.blocks import``
breaks that copy. :func:`export_remote_code` writes the flat folder itself: every hf_efficient module the
model needs (plus every attention core, so any ``attention_type`` can be set on the loaded config) under a
flat name (``hf_efficient.attention.linear`` -> ``hfe_attention_linear.py``) with its hf_efficient imports
rewritten to flat relative ones, and an ``auto_map`` naming every Auto class the model family has, so a
saved MLM checkpoint also opens with ``AutoModel``. ``EfficientPreTrainedModel.save_pretrained`` calls it
when the model or its config is registered for an Auto class, so ``push_to_hub`` ships the same folder.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import pkgutil
import re
import sys
from pathlib import Path

from .clients import fits_sentence_transformers, write_sentence_transformers_files
from .compat import (
    auto_class_hidden,
    auto_class_of,
    auto_model_mapping,
    files_timestamps,
    upload_modified_files,
)

_ROOT = "hf_efficient"
_PREFIX = "hfe_"
# Shipped whole: the attention package registers every core in its __init__, and a loaded config may name
# any of them (per layer, too), so all cores travel with every model.
_ALWAYS_SHIPPED = (f"{_ROOT}.attention",)
# The only relative imports transformers follows when it fetches remote code (dynamic_module_utils).
_TRANSFORMERS_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\S+)\s+import", flags=re.MULTILINE)
_DYNAMIC_MODULES = "transformers_modules."  # where trust_remote_code puts the files it loads


def flat_module_name(module: str) -> str:
    """``hf_efficient.attention.linear`` -> ``hfe_attention_linear``; a module already flat keeps its name."""
    if module.startswith(f"{_ROOT}."):
        return _PREFIX + module[len(_ROOT) + 1 :].replace(".", "_")
    return module.rpartition(".")[2]


def _import_target(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    """The absolute hf_efficient module an ``ImportFrom`` reads from, or None for any other library."""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        return f"{base}.{node.module}" if node.module else base
    if node.module and (node.module == _ROOT or node.module.startswith(f"{_ROOT}.")):
        return node.module
    return None


def _submodules(package: str) -> list[str]:
    path = importlib.import_module(package).__path__
    # not __main__ (a command-line entry point, never imported by a model)
    return [f"{package}.{info.name}" for info in pkgutil.iter_modules(path) if info.name != "__main__"]


def _flat_sources(start_modules: set[str]) -> dict[str, str]:
    """Flat file name -> rewritten source, for the start modules and every hf_efficient module they import."""
    parsed: dict[str, tuple[object, str, ast.Module]] = {}
    todo = sorted(start_modules | {m for p in _ALWAYS_SHIPPED for m in (p, *_submodules(p))})
    while todo:  # first pass: the import closure, so the second knows which package __init__s are shipped
        name = todo.pop()
        if name in parsed:
            continue
        module = importlib.import_module(name)
        source = Path(module.__file__).read_text(encoding="utf-8")
        parsed[name] = (module, source, ast.parse(source))
        for node in ast.walk(parsed[name][2]):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == _ROOT for a in node.names):
                raise ValueError(f"{name}: use `from {_ROOT}.x import y`, not `import {_ROOT}.x`.")
            if isinstance(node, ast.ImportFrom) and (
                target := _import_target(node, name, hasattr(module, "__path__"))
            ):
                if node.module is None:
                    raise ValueError(f"{name}: `from . import x` cannot be flattened; import names.")
                todo.append(target)

    packages = {name for name, (module, _, _) in parsed.items() if hasattr(module, "__path__")}
    flat = {}
    for name, (_, source, tree) in parsed.items():
        is_package = name in packages
        edits = []  # (first line, last line, replacement lines), 1-based and inclusive like ast's
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (target := _import_target(node, name, is_package)):
                indent = " " * node.col_offset
                # Python runs a package's __init__ before a submodule imported from outside it; keep that for
                # shipped packages (importing attention.registry must also register every core).
                lines = [
                    f"{indent}from .{flat_module_name(pkg)} import __name__ as _{flat_module_name(pkg)}"
                    "  # noqa: F401  (runs the package __init__)"
                    for pkg in sorted(packages)
                    if target.startswith(f"{pkg}.") and not (name == pkg or name.startswith(f"{pkg}."))
                ]
                new = ast.ImportFrom(module=flat_module_name(target), names=node.names, level=1)
                edits.append((node.lineno, node.end_lineno, [*lines, indent + ast.unparse(new)]))
            elif is_package and isinstance(node, ast.For) and "iter_modules" in ast.unparse(node.iter):
                # transformers fetches only files named by `from .x import` lines: an import loop over
                # pkgutil.iter_modules becomes one explicit import per submodule, in the loop's order.
                imports = [
                    f"from .{flat_module_name(sub)} import __name__ as _{flat_module_name(sub)}  # noqa: F401"
                    for sub in _submodules(name)
                ]
                edits.append((node.lineno, node.end_lineno, imports))
        lines = source.splitlines()
        for first, last, replacement in sorted(edits, reverse=True):
            lines[first - 1 : last] = replacement
        header = f"# {name}, flattened for trust_remote_code by hf_efficient.hub.export_remote_code.\n"
        flat[f"{flat_module_name(name)}.py"] = header + "\n".join(lines) + "\n"

    for file_name, text in flat.items():  # what transformers will fetch must be exactly what we ship
        ast.parse(text, filename=file_name)
        missing = {m for m in _TRANSFORMERS_RELATIVE_IMPORT.findall(text) if f"{m}.py" not in flat}
        if missing:
            raise ValueError(f"{file_name}: transformers would fetch files that do not exist: {missing}")
    return flat


def _auto_classes(model) -> dict[str, type]:
    """Auto class name -> class: the config, the class registered by the user, and every Auto class the
    model's config is registered with (AutoModel, AutoModelForMaskedLM, ... for EfficientBert)."""
    from transformers.models.auto import modeling_auto

    config_class = type(model.config)
    classes = {"AutoConfig": config_class}
    for name, auto_class in sorted(vars(modeling_auto).items()):
        mapping = auto_model_mapping(auto_class)
        if name.startswith("AutoModel") and mapping is not None and config_class in mapping:
            registered = mapping[config_class]  # a class, or a tuple chosen from by architectures
            if isinstance(registered, tuple):
                registered = type(model) if type(model) in registered else registered[0]
            classes[name] = registered
    if auto_class_of(type(model)) is not None:
        classes[auto_class_of(type(model)).rpartition(".")[2]] = type(model)
    processor = _image_processor_class(config_class)
    if processor is not None:  # AutoImageProcessor / pipeline(trust_remote_code=True) read it from auto_map
        classes["AutoImageProcessor"] = processor
    return classes


def _image_processor_class(config_class: type) -> type | None:
    """The image processor ``AutoImageProcessor`` has for ``config_class`` (EfficientViT's), or None."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING

    if config_class not in IMAGE_PROCESSOR_MAPPING:
        return None
    registered = IMAGE_PROCESSOR_MAPPING[config_class]  # {"pil": class, ...} or a class
    return next(iter(registered.values())) if isinstance(registered, dict) else registered


def _our_pipelines(classes: dict[str, type]) -> dict[str, tuple[type, dict]]:
    """The pipelines of this package (registered with transformers' ``PIPELINE_REGISTRY``: the
    ``question-answering`` one transformers 5 removed) that load one of the Auto ``classes`` of the model:
    ``{task: (pipeline class, its custom_pipelines entry)}``. transformers builds a pipeline named in a
    model's ``config.json`` ``custom_pipelines`` from the model's remote code (where hf_efficient is
    absent)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    found = {}
    for task, info in PIPELINE_REGISTRY.supported_tasks.items():
        impl, autos = info.get("impl"), [getattr(auto, "__name__", auto) for auto in info.get("pt", ())]
        ours = isinstance(impl, type) and impl.__module__.startswith(f"{_ROOT}.")  # built-ins: "module.Class"
        if ours and set(autos) & set(classes):
            entry = {"impl": f"{flat_module_name(impl.__module__)}.{impl.__qualname__}", "pt": autos}
            found[task] = (impl, {**entry, "tf": [], "type": info.get("type", "text")})
    return found


def export_remote_code(model, save_directory: str | os.PathLike) -> list[str]:
    """Write the flat remote-code files of ``model`` into ``save_directory`` and its ``config.json`` with
    an ``auto_map`` (and, for a model our pipelines serve, ``custom_pipelines``: ``pipeline(
    "question-answering", model=folder, trust_remote_code=True)`` builds ours from the folder); weights are
    ``save_pretrained``'s job. Returns the python file names written.

    A model loaded with ``trust_remote_code=True`` (already flat) re-exports the flat files it came from.
    """
    classes = _auto_classes(model)
    auto_map = {name: f"{flat_module_name(c.__module__)}.{c.__qualname__}" for name, c in classes.items()}
    pipelines = _our_pipelines(classes)
    module = type(model).__module__
    if module.startswith(f"{_ROOT}."):
        shipped = {cls.__module__ for cls in classes.values()} | {p.__module__ for p, _ in pipelines.values()}
        sources = _flat_sources(shipped)
    elif module.startswith(_DYNAMIC_MODULES):  # loaded from flat files by transformers: ship those unchanged
        folder = Path(sys.modules[module].__file__).parent
        sources = {path.name: path.read_text(encoding="utf-8") for path in folder.glob(f"{_PREFIX}*.py")}
    else:
        raise ValueError(f"{module}.{type(model).__name__} is defined outside {_ROOT}: cannot export it.")
    save_directory = Path(save_directory)
    save_directory.mkdir(parents=True, exist_ok=True)
    for file_name, text in sources.items():
        (save_directory / file_name).write_text(text, encoding="utf-8")

    config = model.config
    written = {
        "auto_map": auto_map,
        "custom_pipelines": {task: entry for task, (_, entry) in pipelines.items()},
    }
    previous = {name: getattr(config, name, None) for name in written}
    for name, values in written.items():
        setattr(config, name, {**(previous[name] or {}), **values})
    try:  # written to disk only: a later plain save must not point at files it does not write
        with auto_class_hidden(model, config):
            config.save_pretrained(save_directory)
    finally:
        for name, value in previous.items():
            setattr(config, name, value)
            if value is None:
                delattr(config, name)
    if "AutoImageProcessor" in auto_map:
        add_image_processor_auto_map(save_directory, auto_map["AutoImageProcessor"])
    return sorted(sources)


def add_image_processor_auto_map(save_directory: str | os.PathLike, class_reference: str) -> bool:
    """Name the remote image processor in ``preprocessor_config.json`` of ``save_directory``, if there is one.

    ``AutoImageProcessor`` reads the processor's own file first: a processor type transformers does not
    know is loaded from that file's ``auto_map`` only (the model's ``config.json`` is not consulted).
    Call it after the processor is saved (``Trainer`` saves the model first, then the processor).

    Returns:
        Whether the file exists and now holds the ``auto_map``.
    """
    path = Path(save_directory) / "preprocessor_config.json"
    if not path.is_file():
        return False
    values = json.loads(path.read_text(encoding="utf-8"))
    values["auto_map"] = {**values.get("auto_map", {}), "AutoImageProcessor": class_reference}
    path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return True


def names_remote_code(config) -> bool:
    """Whether ``config.auto_map`` names our flat remote code (``hfe_*`` modules, as
    :func:`export_remote_code` writes them; a hub copy's ``"repo--hfe_..."`` too): a model loaded from a
    folder that ships it (a zoo checkpoint) keeps that ``auto_map``, so every folder it is saved to must
    carry the files it names, or ``trust_remote_code=True`` fails there on a missing ``hfe_*.py``."""
    references = (getattr(config, "auto_map", None) or {}).values()
    flat = [ref for value in references for ref in (value if isinstance(value, (list, tuple)) else [value])]
    return any(str(ref).rpartition("--")[2].startswith(_PREFIX) for ref in flat if ref)


def save_pretrained_with_remote_code(
    model, save, save_directory, is_main_process=True, state_dict=None, push_to_hub=False, **kwargs
):
    """``save`` (transformers' ``save_pretrained``), with our flat folder in place of transformers' copy when
    the model or its config is registered for an Auto class, or its config's ``auto_map`` already names the
    flat files (:func:`names_remote_code`: a model fine-tuned from a checkpoint that ships them), and, for a
    text encoder, the files sentence-transformers embeds with
    (:func:`~hf_efficient.clients.write_sentence_transformers_files`); uploads afterwards, as transformers
    does."""
    registered = auto_class_of(type(model)) or auto_class_of(type(model.config))
    remote, embedder = bool(registered or names_remote_code(model.config)), fits_sentence_transformers(model)
    if not (remote or embedder):
        return save(save_directory, is_main_process, state_dict, push_to_hub=push_to_hub, **kwargs)
    hub_keys = ("repo_id", "commit_message", "create_pr", "private", "token")
    hub_kwargs = {key: kwargs.pop(key) for key in hub_keys if key in kwargs}
    os.makedirs(save_directory, exist_ok=True)
    timestamps = files_timestamps(model, save_directory)  # upload only what this save changes
    with auto_class_hidden(model, model.config):
        save(save_directory, is_main_process, state_dict, push_to_hub=False, **kwargs)
    if not model.should_save_on_this_rank(is_main_process):
        return None
    if remote:
        export_remote_code(model, save_directory)
    if embedder:
        write_sentence_transformers_files(model, save_directory)
    if push_to_hub:
        from huggingface_hub import create_repo

        repo_id = hub_kwargs.pop("repo_id", Path(save_directory).name)
        token = hub_kwargs.get("token")
        repo_id = create_repo(repo_id, exist_ok=True, private=hub_kwargs.get("private"), token=token).repo_id
        upload_modified_files(
            model,
            save_directory,
            repo_id,
            timestamps,
            commit_message=hub_kwargs.get("commit_message"),
            token=token,
            create_pr=hub_kwargs.get("create_pr", False),
        )
    return None
