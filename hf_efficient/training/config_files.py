"""Config files for the scripts: a base file per model size, an override per attention type, flags last.

A config file is JSON with two sections::

    {"model": {"hidden_size": 256, "attention_type": "full", ...},   # EfficientBertConfig fields
     "training": {"learning_rate": 5e-4, "block_size": 512, ...}}    # script flags, TrainingArguments

Merge order is fixed: the base file (``--config``), then the attention type's settings for the base file's
config family (the name of its folder: ``configs/text/base_tiny.json`` is family ``text``; without a base
file, the script's own family): ``attention/<attention_type>.json`` beside the base file where there is one
(a folder of your own), else the type core's ``script_configs`` entry of that family. They are the type's
defaults, so the ``attention_config`` keys a base file sets for its own attention type keep the base file's
values. Then the command line: ``--attention_type``, ``--attention_config '{"attention_window": 64}'``
(merged into the file's ``attention_config`` when the type is unchanged), ``--config_overrides
hidden_size=128,...`` and every other flag. Unknown keys raise, naming the file (or the core) and the close
matches.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from ..attention import list_attention_types
from ..attention.registry import get_attention_class, validate_attention_config
from ..cli import unknown_flags_error
from ..errors import InputError, InputFileNotFoundError
from ..modeling.loading import dropped_log_message
from .arguments import translate_upstream_flags
from .distributed import has_accelerator

SECTIONS = ("model", "training")
# The values HfArgumentParser's boolean flags take (transformers.hf_argparser.string_to_bool).
SWITCH_VALUES = ("yes", "no", "true", "false", "t", "f", "y", "n", "1", "0")
# TrainingArguments' warning about --torch_compile without a GPU, which says neither the cost nor the fix.
TORCH_COMPILE_WITHOUT_GPU = ("transformers.training_args", "The speedups for torchdynamo mostly come with")


@dataclass
class ConfigArguments:
    """Flags every script shares for choosing the model configuration."""

    config: str | None = field(
        default=None,
        metadata={
            "help": "Base config ({'model': {...}, 'training': {...}}), e.g. configs/text/base_tiny.json"
        },
    )
    attention_type: str | None = field(
        default=None,
        metadata={
            "help": "Attention type (hf_efficient.list_attention_types(modality)); adds attention/<type>.json"
        },
    )
    attention_config: str | None = field(
        default=None,
        metadata={"help": "JSON hyperparameters of the attention, e.g. '{\"attention_window\": 64}'."},
    )
    config_overrides: str | None = field(
        default=None, metadata={"help": "Model config fields, e.g. 'hidden_size=128,num_hidden_layers=2'."}
    )


def _check_keys(keys, valid, where: str, section: str) -> None:
    for key in keys:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=3)
            hint = f" Did you mean {close}?" if close else ""
            raise InputError(f"{where}: unknown {section} key {key!r}.{hint}")


def load_config_file(path: str | Path, model_keys, training_keys) -> dict[str, dict[str, Any]]:
    """Read a config file, checking its keys (sections ``model``, ``training``; optional ``description``)."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise InputError(
            f"{path} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}."
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config file holds a JSON object with sections {SECTIONS}.")
    _check_keys([k for k in data if k != "description"], SECTIONS, str(path), "section")
    return _checked_sections(data, str(path), model_keys, training_keys)


def _checked_sections(data: dict, where: str, model_keys, training_keys) -> dict[str, dict[str, Any]]:
    config = {section: dict(data.get(section) or {}) for section in SECTIONS}
    _check_keys(config["model"], sorted(model_keys), where, "model")
    _check_keys(config["training"], sorted(training_keys), where, "training")
    return config


def attention_type_settings(
    attention_type: str, attention_dir: Path, model_keys, training_keys
) -> dict[str, dict[str, Any]]:
    """What the config family of ``attention_dir`` (``configs/<family>/attention``) sets for
    ``attention_type``, as a config file's sections: ``attention_dir/<attention_type>.json`` where it exists,
    else the core's ``script_configs[family]``, else its defaults (an empty ``attention_config``, which
    replaces another type's hyperparameters that a checkpoint holds)."""
    path = attention_dir / f"{attention_type}.json"
    if path.exists():
        return load_config_file(path, model_keys, training_keys)
    family = attention_dir.parent.name
    entry = get_attention_class(attention_type).script_configs.get(family, {})
    model = {**entry.get("model", {}), "attention_type": attention_type}
    model["attention_config"] = dict(entry.get("attention_config", {}))
    where = f"{attention_type}'s script_configs[{family!r}]"
    return _checked_sections(
        {"model": model, "training": entry.get("training")}, where, model_keys, training_keys
    )


def merge_model_configs(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` wins; ``attention_config`` is merged key by key unless the attention type changes."""
    merged = {**base, **override}
    same_type = override.get("attention_type", base.get("attention_type")) == base.get("attention_type")
    if same_type and "attention_config" in base and "attention_config" in override:
        merged["attention_config"] = {
            **(base["attention_config"] or {}),
            **(override["attention_config"] or {}),
        }
    elif not same_type and "attention_config" not in override:
        merged.pop("attention_config", None)  # the old type's hyperparameters mean nothing to the new one
    return merged


def parse_overrides(text: str | None) -> dict[str, Any]:
    """``'hidden_size=128,hidden_act=gelu'`` -> ``{'hidden_size': 128, 'hidden_act': 'gelu'}``."""
    result = {}
    for item in filter(None, (text or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--config_overrides items look like key=value; got {item!r}.")
        try:
            result[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            result[key.strip()] = value
    return result


def parse_attention_config(text: str) -> dict[str, Any]:
    """``--attention_config``: a JSON object of the attention type's hyperparameters."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"--attention_config {text!r} is not valid JSON ({error.msg} at character {error.pos}). Write a "
            """JSON object, quoted for the shell: --attention_config '{"attention_window": 64}'."""
        ) from None
    if not isinstance(values, dict):
        raise InputError(
            f"--attention_config must be a JSON object of hyperparameters ({{...}}), got "
            f"{type(values).__name__}: {text}."
        )
    return values


def parse_args_with_config_files(
    parser: HfArgumentParser,
    model_config_class: type,
    attention_dir: str | Path | None = None,
    args: list[str] | None = None,
) -> tuple[tuple, dict[str, Any]]:
    """Parse the command line on top of the config files.

    Args:
        parser: an ``HfArgumentParser`` over the script's dataclasses; one of them must be
            :class:`ConfigArguments`.
        model_config_class: the config class whose fields the ``model`` section may set.
        attention_dir: where attention overrides live when no base config is given (``None``: none).
        args: the command line (default ``sys.argv[1:]``).

    Returns:
        (the parsed dataclasses, in the parser's order; the merged model config kwargs).

    Flags of transformers' example scripts that the script names otherwise are read as its own, or refused
    saying why (:func:`~hf_efficient.training.arguments.translate_upstream_flags`).
    """
    known = {option[2:] for action in parser._actions for option in action.option_strings}
    args = translate_upstream_flags(sys.argv[1:] if args is None else list(args), known)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--attention_type")
    known, _ = pre.parse_known_args(args)
    model_keys = {f.name for f in fields(model_config_class)}
    training_keys = {a.dest for a in parser._actions} - {"help", *(f.name for f in fields(ConfigArguments))}

    merged = {"model": {}, "training": {}}
    base_dir = Path(attention_dir) if attention_dir is not None else None
    if known.config and not Path(known.config).is_file():
        raise InputFileNotFoundError(
            f"--config {known.config}: no such file ({Path(known.config).absolute()}). The base configs are "
            "configs/<text|vision|graph>/base_*.json."
        )
    if known.config:
        merged = load_config_file(known.config, model_keys, training_keys)
        base_dir = Path(known.config).parent / "attention"
    attention_type = known.attention_type or merged["model"].get("attention_type")
    where = "--attention_type" if known.attention_type else f"--config {known.config}: model.attention_type"
    check_attention_type(attention_type, getattr(model_config_class, "modality", None), where)
    if attention_type and base_dir is not None:
        override = attention_type_settings(attention_type, base_dir, model_keys, training_keys)
        # the type's settings are its defaults: what the base file sets for its own type stays
        own = (
            merged["model"].get("attention_config")
            if merged["model"].get("attention_type") == attention_type
            else None
        )
        merged["model"] = merge_model_configs(merged["model"], override["model"])
        if own:
            merged["model"]["attention_config"] = {**(merged["model"].get("attention_config") or {}), **own}
        merged["training"].update(override["training"])

    parser.set_defaults(**merged["training"])
    check_switch_values(parser, args)
    try:  # --torch_compile on a CPU: said by the scripts' setup (run.check_device_flags), with what to do
        with dropped_log_message(*TORCH_COMPILE_WITHOUT_GPU):
            *parsed, unknown = parser.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
    except ValueError as error:  # a dataclass's own check of the flags (TrainingArguments.__post_init__)
        raise flags_error(error) from error
    if unknown:
        raise unknown_flags_error(parser, unknown)
    config_args = next(p for p in parsed if isinstance(p, ConfigArguments))
    cli_model: dict[str, Any] = {}
    if config_args.attention_type:
        cli_model["attention_type"] = config_args.attention_type
    if config_args.attention_config:
        cli_model["attention_config"] = parse_attention_config(config_args.attention_config)
    cli_model.update(parse_overrides(config_args.config_overrides))
    _check_keys(cli_model, sorted(model_keys), "command line", "model")
    model = merge_model_configs(merged["model"], cli_model)
    check_attention_config(model)
    return tuple(parsed), model


def flags_error(error: ValueError) -> InputError:
    """The user error of a ``ValueError`` that the flags' dataclasses raised while checking themselves
    (``TrainingArguments``' "Your setup doesn't support bf16/gpu"): a flag the machine cannot honour is
    named with the fix; any other is passed on as it is."""
    message = str(error)
    if "bf16" in message and not has_accelerator():
        message = (
            "--bf16 (or --bf16_full_eval) computes in bfloat16 on a GPU, and this machine has none "
            "(torch.cuda.is_available() is False): add --use_cpu to compute in bfloat16 on the CPU "
            "(autocast; on most CPUs no faster than float32), or leave --bf16 out"
        )
    return InputError(message)


def check_attention_config(model: dict[str, Any]) -> None:
    """The model settings' ``attention_config`` read against its ``attention_type``'s own keys and values
    now, before any data loads: a mistyped key is one error naming where attention settings come from."""
    attention_type, attention_config = model.get("attention_type"), model.get("attention_config")
    if attention_type is None or not attention_config:
        return
    try:
        validate_attention_config(attention_type, attention_config)
    except ValueError as error:
        raise InputError(
            f"--attention_config (or --config's model.attention_config) for attention_type "
            f"{attention_type!r}: {error}"
        ) from None


def check_attention_type(name: str | None, modality: str | None, where: str) -> None:
    """``name`` (None: the config's default) is an attention type of ``modality``; else an error naming
    ``where`` it was given, the closest type and the types there are."""
    types = list_attention_types(modality)
    if name is None or name in types:
        return
    close = difflib.get_close_matches(name, types, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise InputError(
        f"{where} {name!r} is not available for {modality or 'any'} models: {hint}"
        f"give one of {', '.join(types)}."
    )


def check_switch_values(parser: HfArgumentParser, args: list[str]) -> None:
    """A value after a boolean flag (a switch) that is no true/false word is refused, saying what the switch
    does, rather than HfArgumentParser's "Truthy value expected" after the usage of every flag."""
    switches = {
        option: action
        for action in parser._actions
        if action.type is string_to_bool
        for option in action.option_strings
    }
    for position, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if not equals and position + 1 < len(args) and not args[position + 1].startswith("-"):
            value = args[position + 1]
        action = switches.get(flag)
        if action is None or not value or value.lower() in SWITCH_VALUES:
            continue
        what = f": {action.help[0].lower()}{action.help[1:]}" if action.help else "."
        raise InputError(
            f"{flag} is a switch and takes no value, got {value!r}. Give {flag} alone to turn it on ({flag} "
            f"false: off){what}"
        )
