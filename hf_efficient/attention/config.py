"""Hyperparameters of a core (its ``attention_config``): parsing a JSON-like dict, with type checks.

Every core declares a dataclass of its hyperparameters (a subclass of :class:`AttentionConfig`). Models save
them as a plain dict in ``config.json`` (``attention_config``); :meth:`AttentionConfig.from_dict` turns that
dict back into the dataclass, refusing unknown keys (listing the valid ones) and values of the wrong type,
then runs the subclass's range checks (:meth:`AttentionConfig.validate`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any


@dataclass
class AttentionConfig:
    """Base of every core's hyperparameters (its ``attention_config``). Subclasses add fields.

    Attributes:
        implementation: how the core computes (see :mod:`hf_efficient.attention.base`): ``"auto"`` the
            fastest path for each call, ``"reference"`` the mechanism's maths in one piece, or the name of
            one of the core's kernels. Checked against the core's kernels when the core is built.
    """

    implementation: str = "auto"

    def validate(self) -> None:
        """Check value ranges; raise ValueError naming the field. Subclasses extend."""

    @classmethod
    def from_dict(cls, attention_type: str, values: dict[str, Any] | None) -> AttentionConfig:
        if values is not None and not isinstance(values, dict):
            raise ValueError(
                f"attention_config for attention_type={attention_type!r} must be a dict of hyperparameters "
                f"(or None for the defaults), got {type(values).__name__}: {values!r}."
            )
        values = dict(values or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            valid = ", ".join(names) if names else "(none: this attention has no hyperparameters)"
            raise ValueError(
                f"Unknown attention_config key(s) {unknown} for attention_type={attention_type!r}. "
                f"Valid keys: {valid}."
            )
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            check_type(attention_type, name, value, hints[name])
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_UnionType = type(int | None)


def check_type(attention_type: str, name: str, value: Any, hint: Any) -> None:
    """Light runtime type check of a JSON-ish attention_config value against its annotation.

    JSON has no tuples and writes every number as int or float: an int is a valid float, a list a valid
    tuple; a bool is never a number.
    """
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else (hint,)
    for option in allowed:
        origin = typing.get_origin(option) or option
        if option is type(None) and value is None:
            return
        if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if origin in (list, tuple) and isinstance(value, (list, tuple)):
            return
        if origin is typing.Literal and value in typing.get_args(option):
            return
        if isinstance(origin, type) and origin not in (float, int) and isinstance(value, origin):
            return
    expected = hint.__name__ if isinstance(hint, type) else str(hint)
    raise ValueError(
        f"attention_config[{name!r}] for attention_type={attention_type!r} must be {expected}, got "
        f"{type(value).__name__} {value!r}."
    )


__all__ = ["AttentionConfig", "check_type"]
