"""Every code block of README.md, docs/*.md and the lab's pages (benchmarks/README.md, benchmarks/docs/*.md)
runs, so the documentation cannot rot.

The python blocks of a page run in one namespace of their own, in order (a later block may use what an
earlier one defined), in the test's process; the README's also run in a fresh interpreter, as a newcomer
runs them. The bash blocks of a page run one group per test (tests/docs_blocks.py::block_groups: a block
with the earlier blocks whose outputs it reads, so independent blocks run in parallel), in order, each in
one shell, every command as documented with its outputs moved into a temporary folder, one seed, and, for
long commands, the budget flags of the block's marker appended (tests/docs_blocks.py; the markers are
described in docs/contributing.md, "Documentation"). Each Python command runs in the test's process, as
``python`` runs it (tests/docs_commands.py). A block that does not run here says why (set-up, the network, a
GPU), or names the test that runs it with checks of what it produces.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from .docs_blocks import (
    ANY_MARKER,
    LAB,
    MARKER,
    PAGES,
    ROOT,
    Block,
    block_groups,
    page_blocks,
    python_script,
    run_bash_block,
    run_python_blocks,
    runnable_commands,
    without_comment,
)
from .processes import run_python

# Pages whose commands a test of their own runs in order, with checks of what they produce.
OWN_TEST = {"generation.md": "tests/test_docs_generation.py"}


def runnable(page: Path, language: str) -> list[Block]:
    return [block for block in page_blocks(page) if block.language == language and block.kind != "skip"]


def pages_with(language: str) -> list[Path]:
    return [page for page in PAGES if any(block.language == language for block in page_blocks(page))]


def test_every_marker_is_well_formed_and_sits_on_a_block():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        markers = [line for line in text.splitlines() if ANY_MARKER.search(line)]
        assert all(MARKER.search(line) for line in markers), page  # kind known, value in parentheses
        assert len(markers) == sum(block.kind is not None for block in page_blocks(page)), page
        for block in page_blocks(page):
            assert block.kind is None or block.value, f"{block.where}: a marker needs its reason or flags"
            assert block.kind != "budget" or block.language == "bash", f"{block.where}: budgets are for bash"


def test_every_run_by_marker_names_an_existing_test():
    for page in PAGES:
        for block in page_blocks(page):
            if block.kind == "run-by":
                path, _, name = block.value.partition("::")
                source = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).is_file() else ""
                defined = re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE)
                assert defined, f"{block.where}: no test {block.value}"


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of the headings of ``page``: lower case, punctuation dropped, spaces -> hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)  # outside code blocks
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_and_anchor_resolves():
    for page in PAGES:
        for match in LINK.finditer(page.read_text(encoding="utf-8")):
            path, _, anchor = match.group("target").partition("#")
            if path.startswith(("http://", "https://")):
                continue
            target = (page.parent / path).resolve() if path else page
            assert target.exists(), f"{page.name}: {match.group('target')} does not exist"
            if anchor and target.suffix == ".md":
                assert anchor in heading_anchors(target), f"{page.name}: no heading {match.group('target')}"


def linked_pages(page: Path) -> set[Path]:
    """The files ``page`` links to."""
    targets = {match.group("target").partition("#")[0] for match in LINK.finditer(page.read_text("utf-8"))}
    return {(page.parent / target).resolve() for target in targets if target}


def test_the_index_links_every_page_and_the_lab_its_own():
    index = ROOT / "docs" / "index.md"
    assert set((ROOT / "docs").glob("*.md")) - {index} <= linked_pages(index)
    assert set((LAB / "docs").glob("*.md")) <= linked_pages(LAB / "README.md")


def test_every_committed_result_plot_is_shown_by_a_page():
    """benchmarks/results/reference/ keeps results.json and summaries; a plot stays only where a page
    (README.md, docs/, the lab's pages) shows it: rerunning a command draws the others."""
    shown = set().union(*(linked_pages(page) for page in PAGES))
    plots = set((LAB / "results" / "reference").rglob("*.png"))
    assert plots and plots <= shown, sorted(str(p.relative_to(ROOT)) for p in plots - shown)


# a relative path that climbs out of its folder: "../x/y.md"
PARENT_PATH = re.compile(r"(?<![\w./])((?:\.\./)+[\w.-][\w./-]*)")


def test_no_page_points_outside_the_repository():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        targets = [match.group("target").partition("#")[0] for match in LINK.finditer(text)]
        for target in targets:
            if target and not target.startswith(("http://", "https://")):
                assert (page.parent / target).resolve().is_relative_to(ROOT), f"{page.name}: {target}"
        for path in PARENT_PATH.findall(text):  # in prose or code: a file of this repository, from the page
            resolved = [(start / path).resolve() for start in (page.parent, ROOT)]  # or from the root
            assert any(p.is_relative_to(ROOT) and p.exists() for p in resolved), f"{page.name}: {path}"


def test_bash_commands_are_read_as_a_shell_reads_them(tmp_path):
    """Continuation lines joined, comments dropped (not a ``#`` inside quotes), the budget appended to what
    runs a script or a module only, every output path in the scratch folder."""
    block = Block(
        page=ROOT / "docs" / "example.md",
        line=1,
        language="bash",
        code="# a comment line\nX=$(.venv/bin/python -c \"print('runs/x')\")\n"
        "python scripts/train.py --tag '#1' \\\n    --output_dir runs/a  # trailing comment\n"
        ".venv/bin/python -m benchmarks.attention --out benchmarks/results/b\n",
        kind="budget",
        value="--max_steps 2 --out runs/budget",
    )
    assert block.commands() == [
        "X=$(.venv/bin/python -c \"print('runs/x')\")",
        "python scripts/train.py --tag '#1' --output_dir runs/a",
        ".venv/bin/python -m benchmarks.attention --out benchmarks/results/b",
    ]
    assignment, script, module = runnable_commands(block, tmp_path)
    assert assignment == f"X=$(.venv/bin/python -c \"print('{tmp_path}/runs/x')\")"  # no budget for -c
    assert shlex.split(script)[-4:] == ["--max_steps", "2", "--out", f"{tmp_path}/runs/budget"]
    assert f"--output_dir {tmp_path}/runs/a" in script
    assert module.startswith(f".venv/bin/python -m benchmarks.attention --out {tmp_path}/benchmarks/results/")
    assert without_comment("echo 'a # b' # c") == "echo 'a # b' "
    seeds = Block(
        page=block.page, line=1, language="bash", code="python -m benchmarks.seeds --seeds 0 1 2 --out x"
    )
    assert runnable_commands(seeds, tmp_path) == ["python -m benchmarks.seeds --seeds 0 --out x"]  # one seed


@pytest.mark.slow  # tiny models built and run, the README's with a real checkpoint
@pytest.mark.parametrize("page", pages_with("python"), ids=lambda p: p.name)
def test_python_blocks_run(page, tmp_path, monkeypatch):
    blocks = runnable(page, "python")
    if not blocks:
        pytest.skip(f"every python block of {page.name} is marked skip")
    monkeypatch.chdir(ROOT)
    run_python_blocks(blocks, tmp_path)


@pytest.mark.slow  # a fresh interpreter
def test_the_readme_quick_start_runs_in_a_fresh_interpreter(tmp_path):
    """The README's python blocks as a newcomer runs them: one new interpreter, nothing imported before
    (in the test's process, a block that forgot an import of hf_efficient would still pass)."""
    blocks = runnable(ROOT / "README.md", "python")
    assert len(blocks) == 4  # text, vision, graphs, causal LM
    run_python(python_script(blocks, tmp_path), cwd=ROOT)


# Blocks of many commands, each a whole grid run that resumes from the folder it shares with the others, so
# any part of the block runs alone: (page, text of the block) -> the number of tests its commands run in.
# results.md's MQAR sweep is eleven commands of ~10 s each (the interpreter and the registry's import).
IN_PARTS = {("results.md", "benchmarks.studies.mqar run --causal"): 3}


def in_parts(page: Path, group: list[Block]) -> list[list[Block]]:
    """``group`` as one test, or, for a block of :data:`IN_PARTS`, its commands in consecutive parts."""
    parts = next(
        (n for (name, text), n in IN_PARTS.items() if name == page.name and text in group[0].code), 1
    )
    if len(group) > 1 or parts == 1:
        return [group]
    commands = group[0].commands()
    size = -(-len(commands) // parts)
    return [
        [dataclasses.replace(group[0], code="\n".join(commands[i : i + size]), part=(i // size + 1, parts))]
        for i in range(0, len(commands), size)
    ]


def bash_groups() -> list[tuple[Path, list[Block]]]:
    """The groups of bash blocks the docs tests run (pages with a test of their own left out)."""
    return [
        (page, part)
        for page in pages_with("bash")
        if page.name not in OWN_TEST
        for group in block_groups([block for block in runnable(page, "bash") if block.kind != "run-by"])
        for part in in_parts(page, group)
    ]


def group_id(page_and_group) -> str:
    page, group = page_and_group
    part = f"-part{group[0].part[0]}of{group[0].part[1]}" if group[0].part else ""
    return f"{page.name}:{'+'.join(str(block.line) for block in group)}{part}"


def test_every_block_run_in_parts_exists():
    ids = {group_id(item) for item in bash_groups()}
    for (name, text), parts in IN_PARTS.items():
        (page,) = [page for page in PAGES if page.name == name]
        lines = [block.line for block in page_blocks(page) if text in block.code]
        assert lines, (name, text)
        # found by its text, not a line number: a section added above the block must not break the test
        assert {f"{name}:{lines[0]}-part1of{parts}", f"{name}:{lines[0]}-part{parts}of{parts}"} <= ids


def test_blocks_that_read_earlier_outputs_share_a_group():
    """The fine-tunes of results.md read the pretrained model, the long-document runs their data, the
    summaries the runs; independent blocks are groups of their own."""
    groups = [(page.name, [block.code for block in blocks]) for page, blocks in bash_groups()]

    def group_of(name: str, text: str) -> int:  # the index of the group holding the block with ``text``
        (index,) = [
            i for i, (page, codes) in enumerate(groups) if page == name and any(text in c for c in codes)
        ]
        return index  # exactly one

    for name, writer, reader in (  # pairs of blocks named by their text, not their lines (pages change)
        ("results.md", "--out runs/seeds/demo_mlm", "runs/seeds/demo_mlm/seed_{seed}"),
        ("results.md", "long_documents write --variant majority3", "long_documents summarize"),
        ("benchmarks.md", "--output_dir runs/listops/longformer", "benchmarks.studies.listops"),
        ("benchmarks.md", "benchmarks.studies.mqar run", "benchmarks.studies.mqar summarize"),
        ("text.md", "--output_dir runs/distill/performer", "--model_name_or_path runs/distill/performer"),
    ):
        assert group_of(name, writer) == group_of(name, reader), (name, writer, reader)
    independent = group_of("results.md", "--output_dir runs/rt/longformer")
    assert len(groups[independent][1]) == 1


@pytest.mark.slow  # tiny training runs and benchmarks
@pytest.mark.parametrize("page_and_group", bash_groups(), ids=group_id)
def test_bash_blocks_run(page_and_group, tmp_path, monkeypatch):
    """The blocks of one group (the test id: the page and their first lines) in order, each command as
    documented, in this process (tests/docs_commands.py), at the budget its marker gives. The longest
    groups, results.md's long-document runs (five commands, each reading what the one before wrote) and
    its pretrain-then-fine-tune, take 10-20 s on a loaded 2-core machine."""
    _, group = page_and_group
    monkeypatch.chdir(ROOT)
    for block in group:
        run_bash_block(block, tmp_path)
