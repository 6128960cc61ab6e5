"""Data files and folders named on the command line: they exist and hold rows, or a clear error says which.

``datasets.load_dataset`` reports a missing file as "Unable to find '...'" and a file without rows as
"Instruction 'train' corresponds to no data!" or a ``DatasetGenerationError``, without naming the flag.
"""

from __future__ import annotations

from pathlib import Path

import datasets
from datasets import DatasetDict

from ..errors import InputError, InputFileNotFoundError


def check_data_files(files: dict[str, str]) -> None:
    """Each ``{flag: path}`` names an existing, non-empty file.

    Raises:
        FileNotFoundError: a path names no file.
        ValueError: a file has no bytes at all.
    """
    for flag, path in files.items():
        file = Path(path)
        if not file.is_file():
            kind = "a folder, not a file" if file.is_dir() else "no such file"
            raise InputFileNotFoundError(f"{flag} {path}: {kind} ({file.absolute()}).")
        if file.stat().st_size == 0:
            raise InputError(f"{flag} {path} is empty (0 bytes): it holds no rows to train or evaluate on.")


def check_data_folder(flag: str, path: str) -> None:
    """``path`` is an existing folder holding at least one file (an imagefolder's class sub-folders)."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputFileNotFoundError(f"{flag} {path}: no such folder ({folder.absolute()}).")
    if not any(p.is_file() for p in folder.rglob("*")):
        raise InputError(f"{flag} {path} holds no files; an imagefolder has a folder of images per class.")


def load_data_files(builder: str, files: dict[str, tuple[str, list[str]]], **kwargs) -> DatasetDict:
    """``datasets.load_dataset(builder, data_files=...)`` for ``{split: (flag, paths)}``, after
    :func:`check_data_files`; a split without rows raises naming its flag (``streaming=True`` in ``kwargs``:
    an ``IterableDatasetDict``, whose rows are not counted before they are read)."""
    check_data_files({flag: path for flag, paths in files.values() for path in paths})
    data_files = {split: paths for split, (_, paths) in files.items()}
    try:
        loaded = datasets.load_dataset(builder, data_files=data_files, **kwargs)
    except (ValueError, datasets.exceptions.DatasetGenerationError) as error:
        named = ", ".join(f"{flag} {' '.join(paths)}" for flag, paths in files.values())
        raise InputError(f"No rows could be read from {named}: {error}") from error
    if kwargs.get("streaming"):
        return loaded
    for split, (flag, paths) in files.items():
        if len(loaded[split]) == 0:
            raise InputError(f"{flag} {' '.join(paths)} holds no rows (a header only?).")
    return loaded


__all__ = ["check_data_files", "check_data_folder", "load_data_files"]
