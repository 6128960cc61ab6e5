"""docs/families.md's table of the attention types each family's positions allow is the registry's."""

from pathlib import Path

from hf_efficient.attention._catalog import relative_position_types, rotary_attention_types

PAGE = Path(__file__).resolve().parents[1] / "docs" / "families.md"


def positions_table() -> dict[str, set[str]]:
    """{positions column: the attention types listed} of the page's positions table."""
    section = PAGE.read_text().split("## Which attention types")[1].split("\n## ")[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): {t.strip() for t in cells[2].split(",")} for cells in rows[1:]}


def test_the_page_lists_the_types_the_registry_lets_each_kind_of_position_use():
    table = positions_table()
    assert table["rotary"] == set(rotary_attention_types("text"))
    assert table["relative_key, relative_key_query"] == set(relative_position_types("text"))
