"""Data files and folders named on the command line: they exist and hold rows, or a clear error says which.

``datasets.load_dataset`` reports a missing file as "Unable to find '...'", a file without rows as
"Instruction 'train' corresponds to no data!", and a malformed record, or files whose columns hold different
types, as "An error occurred while generating the dataset", without naming the flag, the file or the line.
:func:`load_data_files` says which file, which line or column, and what to do.
"""

from __future__ import annotations

import json
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
        raise unreadable_files_error(builder, files, error, **kwargs) from error
    if kwargs.get("streaming"):
        return loaded
    for split, (flag, paths) in files.items():
        if len(loaded[split]) == 0:
            raise InputError(f"{flag} {' '.join(paths)} holds no rows (a header only?).")
    return loaded


def unreadable_files_error(
    builder: str, files: dict[str, tuple[str, list[str]]], error: Exception, **kwargs
) -> InputError:
    """Why ``datasets.load_dataset(builder, ...)`` could not read ``files`` (``{split: (flag, paths)}``),
    found by reading each file on its own: the first line of a JSON file that is not a JSON record, a CSV
    file's row of another width (pandas' message names its line), text that is not UTF-8, or a column whose
    type differs between the files; else the innermost error ``datasets`` gave."""
    named = [(flag, path) for flag, paths in files.values() for path in paths]
    features = {}
    for flag, path in named:
        if builder == "json":
            bad_line = _first_bad_json_line(Path(path))
            if bad_line is not None:
                return InputError(f"{flag} {path}, {bad_line}")
        try:
            alone = datasets.load_dataset(builder, data_files={"train": [path]}, **kwargs)["train"]
        except (ValueError, datasets.exceptions.DatasetGenerationError) as own:
            cause = _innermost(own)
            if "corresponds to no data" in cause:  # datasets' words for a file without rows
                return InputError(f"{flag} {path} holds no rows (a header only?).")
            fix = {
                "csv": "every row needs as many cells as the header (quote a cell that holds the delimiter)",
                "text": "save the file as UTF-8",
            }.get(builder, "fix that record")
            return InputError(f"{flag} {path} cannot be read: {cause}; {fix}.")
        features[(flag, path)] = alone.features
    for column in dict.fromkeys(c for found in features.values() for c in found):
        types = {where: found[column] for where, found in features.items() if column in found}
        if len({str(feature) for feature in types.values()}) > 1:
            said = " but ".join(f"{_feature_kind(f)} in {flag} {path}" for (flag, path), f in types.items())
            return InputError(
                f"The column {column!r} holds {said}: every file must hold the same kind of values there "
                "(class names in all of them, or class ids in all, or numbers in all)."
            )
    sources = ", ".join(f"{flag} {path}" for flag, path in named)
    return InputError(f"No rows could be read from {sources}: {_innermost(error)}")


def _first_bad_json_line(path: Path) -> str | None:
    """Where ``path`` is not JSON records (``line N: ...``), or None: one JSON document (a list or an object
    of records) that parses, or JSON lines of one object each."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        json.loads(text)
        return None  # one JSON document: what it holds is for the reader to judge
    except ValueError as whole:
        document = whole
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if text.lstrip().startswith("[") or not _parses(lines[0][1]):  # one document, not JSON lines
        return f"line {document.lineno}, column {document.colno}: not valid JSON ({document.msg})."
    for number, line in lines:
        try:
            record = json.loads(line)
        except ValueError as error:
            return (
                f"line {number}: not a JSON record ({error.msg} at column {error.colno}); every line of a "
                "JSON lines file is one object, {...}."
            )
        if not isinstance(record, dict):
            shown = line.strip()[:40]
            return f"line {number}: {type(record).__name__} {shown!r} is not a JSON object {{...}}."
    return None


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _innermost(error: BaseException) -> str:
    """The message of the error at the bottom of ``error``'s chain (the parser's own), with its type, on one
    line."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    return " ".join(f"{type(error).__name__}: {error}".split())


def _feature_kind(feature) -> str:
    """A column's type as the messages say it: ``strings``, ``integers``, ``class labels`` ..."""
    if isinstance(feature, datasets.ClassLabel):
        return "class labels"
    dtype = str(getattr(feature, "dtype", ""))
    kinds = {"string": "strings", "large_string": "strings", "bool": "booleans"}
    if dtype in kinds:
        return kinds[dtype]
    if dtype.startswith(("int", "uint")):
        return "integers"
    if dtype.startswith("float"):
        return "floats"
    return "values of mixed types" if type(feature).__name__ == "Json" else f"{type(feature).__name__} values"


__all__ = ["check_data_files", "check_data_folder", "load_data_files", "unreadable_files_error"]
