"""Markdown tables as the package writes them (the zoo's model cards) and the lab's summaries read them."""

from __future__ import annotations


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table: ``header`` and one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]
