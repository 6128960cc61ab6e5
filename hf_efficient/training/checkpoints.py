"""Checkpoints that a killed run cannot spoil: a completeness marker, and resuming from complete ones only.

transformers' ``Trainer`` writes ``checkpoint-N`` in place, file after file (weights, optimizer, scheduler,
RNG states, ``trainer_state.json``), and ``get_last_checkpoint`` picks the highest N whatever it holds: a run
killed while writing (``kill -9``, an out-of-memory kill, a pre-empted node) leaves a folder that resuming
then loads, failing on a missing file or a weights file cut short. Here:

* :class:`~hf_efficient.training.EfficientTrainer` writes :data:`COMPLETE_MARKER` into a checkpoint once
  every process has written every file (atomically: a temporary file renamed, after the files are synced to
  disk), and deletes old checkpoints (``save_total_limit``) only after that;
* :func:`last_checkpoint` (``--resume_from_checkpoint last`` / ``True``) takes the newest *complete*
  checkpoint and says which incomplete ones it skipped; a checkpoint written by plain ``Trainer`` (no marker)
  counts as complete when its ``trainer_state.json``, the file ``Trainer`` writes last, is whole, and so is
  its weights file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..errors import InputError
from ..modeling.checkpoint_files import check_weights_files
from ..modeling.loading import ATTENTION_FIELDS
from .arguments import differing_fields

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "checkpoint_complete.json"
TRAINER_STATE = "trainer_state.json"
_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def checkpoint_folders(output_dir: str | Path) -> list[tuple[int, Path]]:
    """The ``checkpoint-N`` folders of ``output_dir`` as (N, path), oldest step first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(_CHECKPOINT_NAME.match(p.name), p) for p in folder.iterdir() if p.is_dir()]
    return sorted((int(match.group(1)), path) for match, path in found if match)


def checkpoint_problem(folder: str | Path) -> str | None:
    """None when ``folder`` is a complete checkpoint, else what is wrong with it (for messages)."""
    folder = Path(folder)
    marker = folder / COMPLETE_MARKER
    if marker.is_file():
        try:
            sizes = json.loads(marker.read_text())["files"]
        except (ValueError, KeyError, TypeError):
            return f"its {COMPLETE_MARKER} is unreadable"
        for name, size in sizes.items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size:,} bytes, not the {size:,} it was written with"
        return None
    # Not marked: written by transformers' own Trainer (or cut short before the marker). trainer_state.json is
    # the last file Trainer writes, so a whole one means the rest was written.
    state = folder / TRAINER_STATE
    if not state.is_file():
        return f"it has no {TRAINER_STATE}: the save was interrupted"
    try:
        json.loads(state.read_text())
        check_weights_files(folder)
    except ValueError:
        return f"its {TRAINER_STATE} is cut short: the save was interrupted"
    except OSError as error:
        return str(error)
    return None


def last_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (None if there is none); incomplete ones newer
    than it are skipped with a warning naming them."""
    skipped = []
    for _, folder in reversed(checkpoint_folders(output_dir)):
        problem = checkpoint_problem(folder)
        if problem is None:
            if skipped:
                logger.warning(
                    "Resuming from %s; skipped incomplete checkpoints: %s.", folder, "; ".join(skipped)
                )
            return folder
        skipped.append(f"{folder.name} ({problem})")
    return None


def check_resumes_same_attention(config, checkpoint: str | Path) -> None:
    """The model a run resumes is built as its ``checkpoint`` was: the same attention, and the same sizes
    (``num_hidden_layers`` and the config class's ``weight_shape_fields``). Flags that change the attention
    (``--attention_type performer`` on a Longformer run) would load Longformer's weights into Performer's
    layers, with only transformers' "missing keys ... projection_matrix" line, and resume its optimizer over
    other parameters; other sizes would fail inside ``load_state_dict``.

    Raises:
        InputError: naming the fields, the checkpoint's values, this run's and the two fixes.
    """
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        return
    saved = json.loads(path.read_text())
    if not any(name in saved for name in ATTENTION_FIELDS):
        return  # a checkpoint of a model without these fields
    fields = (*ATTENTION_FIELDS, "num_hidden_layers", *getattr(type(config), "weight_shape_fields", ()))
    built = {name: getattr(config, name, None) for name in fields}
    differ, theirs, ours = differing_fields([name for name in fields if name in saved], saved, built)
    if not differ:
        return
    raise InputError(
        f"--resume_from_checkpoint {checkpoint}: the checkpoint was trained with {theirs}, but this run "
        f"builds {ours} (--attention_type, --attention_config, --config or --config_overrides): its weights "
        "and optimizer state belong to the checkpoint's model. Resume with the flags of the run that wrote "
        f"it, or start a new run from its weights: --model_name_or_path {checkpoint} with these settings and "
        "another --output_dir."
    )


def resolve_resume_checkpoint(value: str | bool | None, output_dir: str | Path) -> str | None:
    """The checkpoint folder to resume from for ``resume_from_checkpoint`` = ``value``.

    ``True`` or ``"last"``: the newest complete checkpoint in ``output_dir``, raising as transformers does for
    ``True`` when there is none; a path: that folder, which must be a complete checkpoint; None / False: None.

    Raises:
        ValueError: no complete checkpoint to resume from, naming the incomplete ones.
    """
    if value is None or value is False or value == "":
        return None
    if value is True or (isinstance(value, str) and value.lower() == "last"):
        found = last_checkpoint(output_dir)
        if found is None:
            incomplete = [f"{p.name} ({checkpoint_problem(p)})" for _, p in checkpoint_folders(output_dir)]
            details = (
                f" Incomplete ones (a run killed while saving): {'; '.join(incomplete)}."
                if incomplete
                else ""
            )
            raise InputError(
                f"No valid checkpoint found in output directory ({output_dir}).{details} Start the run "
                "without --resume_from_checkpoint, or point it at a complete checkpoint-N folder."
            )
        return str(found)
    folder = Path(value)
    if not folder.is_dir():
        raise InputError(f"Can't find a valid checkpoint at {value}: no such folder.")
    problem = checkpoint_problem(folder)
    if problem is not None:
        raise InputError(
            f"Cannot resume from {value}: {problem}. It is an incomplete checkpoint (a run killed while "
            "saving); --resume_from_checkpoint last picks the newest complete one."
        )
    return str(folder)


def discard_checkpoint(folder: str | Path) -> None:
    """Remove a checkpoint folder about to be written again (a stale or incomplete one of the same step), so
    that no file or marker of the old one survives into the new one."""
    folder = Path(folder)
    if folder.exists():
        (folder / COMPLETE_MARKER).unlink(missing_ok=True)  # first: a half-removed folder is never complete
        shutil.rmtree(folder)


def mark_checkpoint_complete(folder: str | Path, step: int) -> Path:
    """Sync every file of ``folder`` to disk, then write :data:`COMPLETE_MARKER` (each file's size)
    atomically: a temporary file, synced, renamed. Returns the marker's path."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
    for path in files:
        _fsync(path)
    marker = folder / COMPLETE_MARKER
    temporary = folder / f".{COMPLETE_MARKER}.tmp"
    record = {"global_step": step, "files": {str(p.relative_to(folder)): p.stat().st_size for p in files}}
    temporary.write_text(json.dumps(record, indent=2))
    _fsync(temporary)
    os.replace(temporary, marker)
    _fsync(folder)  # the rename itself
    return marker


def rotate_checkpoints(
    output_dir: str | Path, limit: int | None, keep: str | Path | None = None
) -> list[Path]:
    """Delete the oldest complete checkpoints beyond ``limit`` (``save_total_limit``), never the newest one
    nor ``keep`` (the best model's); incomplete folders are not counted. Returns the deleted folders."""
    if not limit or limit <= 0:
        return []
    complete = [path for _, path in checkpoint_folders(output_dir) if checkpoint_problem(path) is None]
    protected = {complete[-1].resolve()} if complete else set()
    if keep is not None:
        protected.add(Path(keep).resolve())
    deletable = [path for path in complete if path.resolve() not in protected]
    excess = len(complete) - max(limit, len(protected & {p.resolve() for p in complete}))
    deleted = deletable[: max(excess, 0)]
    for path in deleted:
        discard_checkpoint(path)
    return deleted


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a folder) to disk; a no-op where the platform cannot sync it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = [
    "COMPLETE_MARKER",
    "checkpoint_folders",
    "checkpoint_problem",
    "discard_checkpoint",
    "last_checkpoint",
    "mark_checkpoint_complete",
    "resolve_resume_checkpoint",
    "rotate_checkpoints",
]
