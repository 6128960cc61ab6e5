"""Print the attention table from the registry, or rewrite it in docs: ``python -m hf_efficient.attention
[--update FILE ...]``.

``--update`` replaces the text between the ``<!-- attention-table -->`` and ``<!-- /attention-table -->``
markers of each file with the current table, so the README and docs list exactly what is registered.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from .registry import attention_table

START, END = "<!-- attention-table -->", "<!-- /attention-table -->"
_SECTION = re.compile(re.escape(START) + r"\n.*?" + re.escape(END), flags=re.DOTALL)


def with_table(text: str, table: str, where: str = "the text") -> str:
    """``text`` with its marked section replaced by ``table``; raises if the markers are missing."""
    if not _SECTION.search(text):
        raise ValueError(f"{where} has no {START} ... {END} section to fill.")
    return _SECTION.sub(lambda _: f"{START}\n{table}{END}", text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", nargs="*", default=[], help="Markdown files whose table to rewrite.")
    args = parser.parse_args(argv)
    table = attention_table()
    if not args.update:
        print(table, end="")
    for name in args.update:
        path = Path(name)
        path.write_text(with_table(path.read_text(encoding="utf-8"), table, name), encoding="utf-8")


if __name__ == "__main__":
    main()
