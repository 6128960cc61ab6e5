"""The python code blocks of README.md and docs/*.md run, so the documentation cannot rot.

Each fenced ``python`` block runs in a fresh interpreter (offline, one thread) from the repository root,
blocks of one page in order in one script (a later block may use what an earlier one defined). A block that
must not run here carries, on the line right before its fence, a marker with the reason:

    <!-- docs-test: skip (needs a hub checkpoint) -->

Not covered yet: ``bash`` blocks (the training commands need tiny-budget flags appended; they are run by
the script tests in tests/scripts with the same flags instead).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .processes import run_python

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->")
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", flags=re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, skip reason or None) of every fenced python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in BLOCK.finditer(text):
        before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
        skip = SKIP.search(before)
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, match.group("code"), skip.group("reason") if skip else None))
    return blocks


def test_every_skipped_block_says_why():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert len(re.findall(r"docs-test:\s*skip", text)) == len(SKIP.findall(text)), page


@pytest.mark.slow  # a fresh interpreter per page
@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(page, tmp_path):
    runnable = [(line, code) for line, code, reason in python_blocks(page) if reason is None]
    if not runnable:
        pytest.skip(f"every python block of {page.name} is marked skip")
    script = "\n".join(f"# {page.name}, line {line}\n{code}" for line, code in runnable)
    run_python(script, env={"HF_HOME": str(tmp_path / "hf_home")}, cwd=ROOT)
