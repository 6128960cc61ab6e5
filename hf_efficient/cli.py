"""How every script in ``scripts/`` ends: a user error is one line on stderr and exit status 2.

A script adopts it in one line, ``if __name__ == "__main__": run_script(main)``. :func:`run_script` calls
``main(args)`` and, when a user error stops it (an :class:`~hf_efficient.errors.InputError`, an argparse or
``HfArgumentParser`` error, a file named on the command line that does not exist), prints one line,
``error: <message>``, on stderr and exits with status 2, as argparse does; the traceback of a user error
only with ``--debug`` (taken off the command line before ``main`` sees it) or ``HF_EFFICIENT_DEBUG=1``. Any
other exception is a fault of ours: it keeps its traceback and exit status.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn
from unittest import mock

from .errors import InputError

DEBUG_FLAG = "--debug"
DEBUG_ENVIRONMENT_VARIABLE = "HF_EFFICIENT_DEBUG"
USER_ERROR_STATUS = 2  # argparse's
# The fix every argparse message gets: argparse says what is wrong and where, not what to do.
HELP_HINT = "--help lists the flags and their values"


def run_script(main: Callable[[list[str]], Any], args: Sequence[str] | None = None) -> None:
    """Run ``main(args)`` (default: ``sys.argv[1:]``) as a command: a user error becomes one ``error: ...``
    line on stderr and ``SystemExit(2)``; at the end of a multi-process run, the process group is closed.

    Raises:
        SystemExit: status 2 after a user error.
    """
    args = list(sys.argv[1:] if args is None else args)
    ours = _our_debug_flags(args)
    debug = bool(ours) or os.environ.get(DEBUG_ENVIRONMENT_VARIABLE, "") not in ("", "0")
    args = [arg for position, arg in enumerate(args) if position not in ours]
    try:
        with mock.patch.object(argparse.ArgumentParser, "error", _raise_input_error):
            main(args)
    except Exception as error:
        message = user_error_message(error, args)
        if message is None:
            raise  # a fault of ours: its traceback and exit status
        if debug:
            traceback.print_exc()
        # One write per process, so the lines of processes started by a launcher do not interleave.
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
        raise SystemExit(USER_ERROR_STATUS) from None
    import torch.distributed  # imported by main already; the scripts' gloo threads must not outlive the group

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from .training.distributed import end_distributed_run

        end_distributed_run()


def _our_debug_flags(args: Sequence[str]) -> set[int]:
    """The positions of ``--debug`` in ``args`` that ask for tracebacks: all but those followed by a value of
    TrainingArguments' own ``--debug`` (``--debug underflow_overflow``)."""
    from transformers.debug_utils import DebugOption

    theirs = {option.value for option in DebugOption}
    return {
        position
        for position, arg in enumerate(args)
        if arg == DEBUG_FLAG and (position + 1 == len(args) or args[position + 1] not in theirs)
    }


def user_error_message(error: BaseException, args: Sequence[str]) -> str | None:
    """The one-line message of a user error (lines joined), or None for any other exception.

    A user error is an :class:`InputError`, or a ``FileNotFoundError`` for a path given in ``args`` (named
    with the flag before it).
    """
    if isinstance(error, InputError):
        message = str(error)
    elif isinstance(error, FileNotFoundError) and error.filename is not None and str(error.filename) in args:
        path = str(error.filename)
        position = list(args).index(path)
        before = args[position - 1] if position else ""
        named = f"{before} {path}" if before.startswith("--") else path
        message = f"{named}: no such file or folder ({Path(path).absolute()}); check the path."
    else:
        return None
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def unknown_flags_error(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> InputError:
    """The error for command-line words ``parser`` does not take: each unknown flag with the closest of the
    parser's flags (``unknown flag --label_column; did you mean --label_column_name?``)."""
    every = set(_flags(parser))
    # HfArgumentParser adds --max-steps beside --max_steps: suggest the spelling with underscores
    flags = sorted(
        flag for flag in every if _underscored(flag) in (flag, None) or _underscored(flag) not in every
    )
    said = []
    for word in unknown:
        name = word.split("=", 1)[0]
        if not name.startswith("-"):
            continue  # the value of an unknown flag
        close = difflib.get_close_matches(name, flags, n=1)
        said.append(f"unknown flag {name}" + (f"; did you mean {close[0]}?" if close else f" ({HELP_HINT})"))
    if not said:
        said = [f"unexpected argument(s) {' '.join(unknown)} ({HELP_HINT})"]
    return InputError("; ".join(said))


def _underscored(flag: str) -> str | None:
    """``--max-steps`` -> ``--max_steps`` (None for a short flag such as ``-h``)."""
    return "--" + flag[2:].replace("-", "_") if flag.startswith("--") else None


def _flags(parser: argparse.ArgumentParser):
    """The option strings of ``parser`` and of its sub-commands' parsers."""
    for action in parser._actions:
        yield from action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _flags(sub)


def _raise_input_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """``ArgumentParser.error`` while :func:`run_script` runs: raise the message (an unknown flag with its
    closest match) instead of printing the usage and exiting."""
    unrecognized = "unrecognized arguments: "  # argparse's message for words that match no flag
    if message.startswith(unrecognized):
        raise unknown_flags_error(parser, message.removeprefix(unrecognized).split())
    # "argument --max_steps/--max-steps: invalid int value: 'x'" -> "--max_steps: invalid int value: 'x'"
    message = re.sub(r"^argument ([^/: ]+)(/\S+)?: ", r"\1: ", message)
    raise InputError(f"{message} ({HELP_HINT})")
