"""Print the attention table from the registry, or rewrite it in docs: ``python -m hf_efficient.attention
[--update FILE ...]``.

``--update`` replaces the text between the ``<!-- attention-table -->`` and ``<!-- /attention-table -->``
markers of each file with the current table, so the README and docs list exactly what is registered.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from .registry import attention_table


def with_table(text: str, table: str, where: str = "the text", marker: str = "attention-table") -> str:
    """``text`` with its section between ``<!-- marker -->`` and ``<!-- /marker -->`` replaced by ``table``;
    raises if the markers are missing."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    section = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), flags=re.DOTALL)
    if not section.search(text):
        raise ValueError(f"{where} has no {start} ... {end} section to fill.")
    return section.sub(lambda _: f"{start}\n{table}{end}", text)


def table_command(
    table: Callable[[], str], marker: str, description: str, argv: list[str] | None = None
) -> None:
    """The command line of a generated table: print ``table()``, or with ``--update FILE ...`` rewrite the
    ``marker`` section of each file with it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--update", nargs="*", default=[], help="Markdown files whose table to rewrite.")
    args = parser.parse_args(argv)
    text = table()
    if not args.update:
        print(text, end="")
    for name in args.update:
        path = Path(name)
        path.write_text(with_table(path.read_text(encoding="utf-8"), text, name, marker), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    table_command(attention_table, "attention-table", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
