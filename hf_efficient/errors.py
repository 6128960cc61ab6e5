"""The user-error convention shared by the library and the scripts.

A *user error* is a mistake the user can fix: a flag, a value, a file, a column, a checkpoint that does not
fit. The library raises :class:`InputError` (a ``ValueError``, so ``except ValueError`` keeps working) or
:class:`InputFileNotFoundError` (also a ``FileNotFoundError``) with a message that says what is wrong, where
(the argument, flag, file, row or column) and the fix. A script prints such an error as one line on stderr,
``error: <message>``, and exits with status 2, as argparse does; any other exception is a fault of ours and
keeps its traceback. ``--debug`` (or ``HF_EFFICIENT_DEBUG=1``) shows the traceback of a user error too.
"""

from __future__ import annotations


class InputError(ValueError):
    """A mistake in what the user gave (a flag, value, file, column or checkpoint): the message names what,
    where, and the fix."""


class InputFileNotFoundError(InputError, FileNotFoundError):
    """A path the user gave does not exist: the message names the flag or argument and the path."""
