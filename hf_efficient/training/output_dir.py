"""One run per output folder: a lock two runs cannot both hold, and no silent overwrite of an earlier run.

Two runs started on the same ``--output_dir`` would write their checkpoints, their model and their
tokenizer into one folder, each overwriting the other's files, and ``--resume_from_checkpoint last`` would
then mix them. :func:`claim_output_dir` (called by :func:`hf_efficient.training.setup_run`) therefore

* takes ``<output_dir>/_run.lock``, an exclusive ``flock`` held until the run ends: the script's ``main``
  returns or raises (:func:`releases_output_dirs`), or the process exits. The kernel drops it when the
  process dies, ``kill -9`` included, so a lock is never stale; the file records the holder (pid, host,
  start time, command line) for the message a second run gets;
* refuses a folder that already holds a model or checkpoints of an earlier run unless the run resumes it
  (``--resume_from_checkpoint``) or asks to replace it (``--overwrite_output_dir``, which then deletes the
  earlier run's checkpoints so that they cannot mix with the new ones).

Only the process that saves (``should_save``: rank 0) takes the lock; under ``torch.distributed`` its
verdict is broadcast, so every rank stops with the same error instead of waiting at a barrier.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import json
import logging
import os
import socket
import sys
from pathlib import Path

import torch.distributed as dist

from ..errors import InputError
from .checkpoints import checkpoint_folders, checkpoint_problem, discard_checkpoint

try:  # POSIX; without it (Windows) runs are not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_FILE = "_run.lock"  # "_*" files are left out when Trainer pushes the folder to the hub
_MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_held: dict[Path, int] = {}  # output folder -> file descriptor of the lock this process holds


class OutputDirInUseError(InputError, RuntimeError):
    """Another live run holds the output folder's lock."""


class OutputDirNotEmptyError(InputError, FileExistsError):
    """The output folder holds an earlier run's model or checkpoints, and this run neither resumes it nor
    asks to overwrite it."""


def lock_output_dir(output_dir: str | Path) -> Path:
    """Hold ``<output_dir>/_run.lock`` until this process exits (again: a no-op); returns the lock's path.

    Raises:
        OutputDirInUseError: another process holds it; the message names that process.
    """
    folder = Path(output_dir).expanduser().resolve()
    path = folder / LOCK_FILE
    if folder in _held or fcntl is None:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(path)
            os.close(fd)
            raise OutputDirInUseError(
                f"--output_dir {folder} is in use by another run ({holder}; lock file {path}). Two runs "
                "writing one folder would overwrite each other's checkpoints and model. Wait for that run to "
                "end, or give this one another --output_dir."
            ) from None
        # The holder before us may have removed the file between our open and our lock: then we locked a
        # deleted file, and must lock the one now at the path.
        if path.exists() and os.fstat(fd).st_ino == os.stat(path).st_ino:
            break
        os.close(fd)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
    }
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(record).encode())
    if not _held:
        atexit.register(release_output_dirs)
    _held[folder] = fd
    return path


def release_output_dirs() -> None:
    """Release every output folder lock this process holds (at exit; also callable earlier)."""
    while _held:
        _release(next(iter(_held)))


def releases_output_dirs(main):
    """Decorates a script's ``main``: the output folder locks its run took are released when it returns or
    raises. A process that runs several trainings in turn (a notebook, the tests) would otherwise keep each
    finished run's folder locked, and its descriptor open, until it exits. Locks held before the call stay."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        held_before = set(_held)
        try:
            return main(*args, **kwargs)
        finally:
            for folder in [folder for folder in _held if folder not in held_before]:
                _release(folder)

    return run


def _release(folder: Path) -> None:
    fd = _held.pop(folder)
    (folder / LOCK_FILE).unlink(missing_ok=True)  # while still locked: no one can take the file meanwhile
    os.close(fd)


def _describe_holder(path: Path) -> str:
    try:
        record = json.loads(path.read_text())
        return (
            f"pid {record['pid']} on {record['host']}, started {record['started']}: "
            f"{record['command'] or 'unknown command'}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its details yet"


def earlier_run_files(output_dir: str | Path) -> list[str]:
    """What in ``output_dir`` belongs to a trained model or a run's checkpoints (empty: nothing)."""
    folder = Path(output_dir)
    found = []
    if (folder / "config.json").is_file() and any((folder / name).is_file() for name in _MODEL_FILES):
        found.append("a saved model (config.json and its weights)")
    checkpoints = [path.name for _, path in checkpoint_folders(folder)]
    if checkpoints:
        found.append(f"checkpoints {', '.join(checkpoints)}")
    return found


def check_output_dir_free(output_dir: str | Path, resuming: bool, overwrite: bool) -> None:
    """Refuse a folder holding an earlier run's model or checkpoints unless ``resuming`` it; with
    ``overwrite``, delete that run's checkpoints (its model files are replaced when this run saves).

    Raises:
        OutputDirNotEmptyError: the folder holds an earlier run and neither flag is set.
    """
    found = earlier_run_files(output_dir)
    if not found or resuming:
        return
    if not overwrite:
        checkpoints = [path for _, path in checkpoint_folders(output_dir)]
        if any(checkpoint_problem(path) is None for path in checkpoints):
            ways = "Continue that run with --resume_from_checkpoint last, replace it"
        else:  # nothing --resume_from_checkpoint could continue from
            why = "incomplete checkpoints only" if checkpoints else "no checkpoint (--save_strategy no?)"
            ways = f"It holds {why}, so it cannot be continued: replace it"
        raise OutputDirNotEmptyError(
            f"--output_dir {output_dir} already holds {' and '.join(found)} of an earlier run. {ways} with "
            "--overwrite_output_dir, or give this run another --output_dir."
        )
    for _, path in checkpoint_folders(output_dir):
        logger.warning("--overwrite_output_dir: deleting %s of the earlier run.", path)
        discard_checkpoint(path)


def claim_output_dir(training_args, overwrite: bool = False) -> None:
    """Lock ``training_args.output_dir`` for this run and check that it may write there (see the module
    docstring); every process of a distributed run raises the same error, or none does."""
    error = None
    if training_args.should_save:
        try:
            lock_output_dir(training_args.output_dir)
            resuming = training_args.resume_from_checkpoint not in (None, False, "")
            check_output_dir_free(training_args.output_dir, resuming, overwrite)
        except (OutputDirInUseError, OutputDirNotEmptyError) as caught:
            error = caught
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        verdict = [error]
        dist.broadcast_object_list(verdict, src=0)
        error = verdict[0]
    if error is not None:
        raise error


__all__ = [
    "LOCK_FILE",
    "OutputDirInUseError",
    "OutputDirNotEmptyError",
    "check_output_dir_free",
    "claim_output_dir",
    "earlier_run_files",
    "lock_output_dir",
    "release_output_dirs",
    "releases_output_dirs",
]
