"""The files ``from_pretrained`` reads from a local folder, checked before transformers opens them.

transformers treats a path that does not exist as a hub repository id ("Repo id must be in the form ...",
"couldn't connect to huggingface.co"), and a ``model.safetensors`` cut short by a killed process or a full
disk fails inside safetensors' Rust parser without naming the file ("incomplete metadata, file not fully
covered"). These checks say what is wrong with which file, and what to do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import InputFileNotFoundError

SAFETENSORS_WEIGHTS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_HEADER_LENGTH_BYTES = 8  # a safetensors file opens with its header's length, a little-endian uint64
_CORRUPT_FIX = (
    "It was probably cut short while being written (a killed process, a full disk) or while being copied: "
    "save the model again (save_pretrained), or copy or download it again. A training run's checkpoint-N "
    "folders hold earlier copies (--resume_from_checkpoint last picks the newest complete one)."
)


def looks_like_local_path(name: str) -> bool:
    """Whether ``name`` can only mean a local path, never a hub id (``namespace/repo``): absolute, relative
    to ``.`` / ``..`` / ``~``, or with more than one path separator."""
    return (
        os.path.isabs(name)
        or name.startswith(("./", "../", "~", ".\\", "..\\"))
        or name in (".", "..")
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def check_pretrained_path(name_or_path, what: str, holds: str | None = None) -> Path | None:
    """The local folder or file ``from_pretrained`` will read, or None for a hub id.

    Args:
        what: who reads it, for the message (``"EfficientBertModel.from_pretrained"``,
            ``"--model_name_or_path"``).

    Args:
        holds: a file a folder given must hold (``config.json`` for a model).

    Raises:
        FileNotFoundError: ``name_or_path`` can only be a local path, and nothing is there; or it is a folder
            without ``holds``.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        return None
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir() and holds is not None and not (path / holds).is_file():
        raise InputFileNotFoundError(
            f"{what} {name}: the folder holds no {holds}. Give a folder written by save_pretrained: a "
            "training script's --output_dir once it has saved, or one of its checkpoint-N folders."
        )
    if path.exists():
        return path
    if looks_like_local_path(name):
        raise InputFileNotFoundError(
            f"{what}: no such folder {name!r} ({path.absolute()} does not exist). Check the path: a model "
            "saved with save_pretrained, or by a training script in its --output_dir, is a folder holding "
            "config.json and model.safetensors."
        )
    return None


def not_found_locally_note(name_or_path) -> str | None:
    """For an error of a hub lookup: the note that ``name_or_path`` is not a local folder either, when it is
    a string naming nothing on disk (a relative path such as ``runs/model`` reads as a hub id)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        return None
    path = Path(os.fspath(name_or_path)).expanduser()
    if path.exists():
        return None
    name = os.fspath(name_or_path)
    return f"{name!r} is not a local folder ({path.absolute()} does not exist), so the hub was asked for it"


def check_safetensors_file(path: str | Path) -> None:
    """Read ``path``'s header and check that the file holds every byte its tensors need.

    Raises:
        OSError: naming the file, when it is shorter than its header says or the header is not valid.
    """
    path = Path(path)
    size = path.stat().st_size
    problem = None
    with open(path, "rb") as f:
        length_bytes = f.read(_HEADER_LENGTH_BYTES)
        header_length = int.from_bytes(length_bytes, "little")
        start = _HEADER_LENGTH_BYTES + header_length
        if len(length_bytes) < _HEADER_LENGTH_BYTES:
            problem = f"it has {size} bytes, too few for the 8-byte header length"
        elif start > size:
            problem = f"its header says {header_length:,} bytes of metadata follow, but the file has {size:,}"
        else:
            try:
                header = json.loads(f.read(header_length))
                end = max(
                    (int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"),
                    default=0,
                )
            except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                problem = "its header is not valid safetensors metadata"
            else:
                if start + end > size:
                    problem = f"its tensors need {start + end:,} bytes but the file has {size:,}"
    if problem is not None:
        raise OSError(f"{path} is truncated or corrupt: {problem}. {_CORRUPT_FIX}")


TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# The files one of which a folder holding a tokenizer has.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


def check_tokenizer_files(name_or_path) -> None:
    """For a local folder: every tokenizer JSON file in it parses, else an OSError naming the file.

    A ``tokenizer.json`` cut short fails inside transformers with a bare ``JSONDecodeError`` ("Unterminated
    string starting at: line 1 column 990") that names no file."""
    folder = Path(name_or_path) if name_or_path is not None else None
    if folder is None or not folder.is_dir():
        return
    for name in TOKENIZER_JSON_FILES:
        path = folder / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as error:
                raise OSError(
                    f"{path} is not valid JSON ({error}), so the tokenizer cannot be loaded. It was "
                    "probably cut short while being written or copied: save the tokenizer again "
                    "(tokenizer.save_pretrained), or copy it again (a training run's checkpoint-N folders "
                    "hold one)."
                ) from None


def load_tokenizer(name_or_path, **kwargs):
    """``AutoTokenizer.from_pretrained(name_or_path, **kwargs)``, with a local folder's tokenizer files
    checked first (:func:`check_tokenizer_files`)."""
    from transformers import AutoTokenizer

    check_tokenizer_files(name_or_path)
    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def check_weights_files(folder: Path) -> None:
    """The safetensors weights of a local model folder (one file, or the shards its index names) are there
    and whole; a folder without safetensors weights is left to transformers (other formats, errors)."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError):
            raise OSError(f"{index} is not a valid safetensors index: {_CORRUPT_FIX}") from None
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if missing:
            raise OSError(f"{index} names weight shards that are not in {folder}: {missing}. {_CORRUPT_FIX}")
        for shard in shards:
            check_safetensors_file(folder / shard)
    elif (folder / SAFETENSORS_WEIGHTS).is_file():
        check_safetensors_file(folder / SAFETENSORS_WEIGHTS)


__all__ = [
    "check_pretrained_path",
    "check_safetensors_file",
    "check_weights_files",
    "looks_like_local_path",
    "not_found_locally_note",
]
