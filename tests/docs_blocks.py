"""The code blocks of README.md and docs/*.md, and how the docs tests run them.

A fenced ``python`` or ``bash`` block may carry, on the line right before its fence, one marker saying how the
tests treat it (docs/contributing.md, "Documentation"):

    <!-- docs-test: skip (why: set-up, the network, a GPU) -->
    <!-- docs-test: budget (--max_steps 2 --max_train_samples 16) -->
    <!-- docs-test: run-by (tests/scripts/test_text.py::test_name) -->

A bash block's commands are its lines with continuation lines joined and comments dropped. They run in this
process from the repository root, one shell per block (tests/docs_commands.py: its variables, environment
prefixes, and each Python command as ``python`` runs it), with the outputs of the docs moved into a scratch
folder: every path that starts with ``runs/`` or ``benchmarks/results/`` is rewritten to start inside it, so
a documented command never writes into the checkout (nor over a committed reference result). A budget's
flags are appended to every command that runs a script (``scripts/*.py``) or a module (``-m name``);
argparse keeps the last value of a flag, so they override the documented ones. A page's python blocks run
in one namespace of their own, in order, in this process too.

Every command runs one seed: ``--seeds 0 1 2`` (the seeds runner ``benchmarks.seeds``, the grid of
``benchmarks.studies.mqar``) becomes ``--seeds 0``. That the command as documented parses and runs needs one
seed; running several, resuming and the summary over seeds are the runner's own tests
(benchmarks/tests/test_seeds.py::test_three_seeds_aggregated_by_hand,
::test_resumes_only_what_is_missing_and_refuses_another_command).

A later block of a page may read what an earlier one wrote (a fine-tune of the pretrained model under
``runs/seeds/demo_mlm``). :func:`block_groups` keeps such blocks together: two blocks belong to one group when
a path under ``runs/`` or ``benchmarks/results/`` of one is the other's or inside it. The tests run one group
at a time, its blocks in order in one scratch folder, so independent blocks can run in parallel.
"""

from __future__ import annotations

import builtins
import linecache
import re
from dataclasses import dataclass
from pathlib import Path

from hf_efficient.attention import ATTENTION_REGISTRY

from .docs_commands import Shell, no_interpreter_of_our_stack
from .processes import ROOT

LAB = ROOT / "benchmarks"  # the lab's pages: its README and its docs/
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    LAB / "README.md",
    *sorted((LAB / "docs").glob("*.md")),
]
FENCE = re.compile(r"^```(?P<language>python|bash)\n(?P<code>.*?)^```", flags=re.MULTILINE | re.DOTALL)
# The marker's value runs to the last ")" before "-->", so a reason may hold parentheses itself.
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<kind>skip|budget|run-by)\s*\((?P<value>.*)\)\s*-->")
ANY_MARKER = re.compile(r"^\s*<!--\s*docs-test")  # a line that is a marker (well formed or not)
OUTPUT_PATH = re.compile(r"(?<![\w/.-])(?=(?:runs|benchmarks/results)/)")
RUNS_PROGRAM = re.compile(r"(?:^|\s)(?:\S*/)?scripts/\S+\.py(?:\s|$)|(?:^|\s)-m\s+\S")
# not a placeholder such as benchmarks.seeds' "{output_dir}", which the runner fills in under its --out
# "--seeds 0 1 2" -> "--seeds 0": the docs tests run one seed (module docstring)
SEVERAL_SEEDS = re.compile(r"(--seeds\s+\d+)(?:\s+\d+)+(?=\s|$)")
# a path the docs' outputs live under, up to a placeholder ("seed_{seed}" -> "seed_") or a shell character
DOCS_PATH = re.compile(r"(?<![\w/.-])(?:runs|benchmarks/results)/[^\s'\"{}$;)]*")
OUTPUT_FLAG = re.compile(r"--(?:output_dir|out)\s+(?P<path>(?!\{)\S+)")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a docs page and the marker before it."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str  # "python" or "bash"
    code: str
    kind: str | None = None  # "skip", "budget", "run-by", or None: the block runs as written
    value: str | None = None  # the skip reason, the budget's flags, or the test that runs the block
    part: tuple[int, int] | None = None  # (i, n): the i-th of n parts of the block's commands, run apart

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[str]:
        """A bash block's commands: continuation lines joined, comment lines and trailing comments dropped."""
        commands = []
        for line in self.code.replace("\\\n", " ").splitlines():
            command = " ".join(without_comment(line).split())
            if command:
                commands.append(command)
        return commands


def page_blocks(page: Path) -> list[Block]:
    """Every fenced python and bash block of ``page``, in order, with its marker."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
        marker = MARKER.search(before)
        blocks.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                language=match.group("language"),
                code=match.group("code"),
                kind=marker.group("kind") if marker else None,
                value=marker.group("value").strip() if marker else None,
            )
        )
    return blocks


def without_comment(line: str) -> str:
    """``line`` up to a ``#`` that starts a shell comment: at the start of a word, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def one_seed(command: str) -> str:
    """``command`` with ``--seeds a b c`` cut to ``--seeds a`` (the docs tests run one seed)."""
    return SEVERAL_SEEDS.sub(r"\1", command)


def docs_paths(block: Block) -> set[str]:
    """The paths under ``runs/`` and ``benchmarks/results/`` that ``block`` (its budget too) names."""
    text = block.code + (f" {block.value}" if block.kind == "budget" else "")
    return {path.rstrip("/") for path in DOCS_PATH.findall(text)}


def shares_a_path(a: set[str], b: set[str]) -> bool:
    """Whether a path of ``a`` is a path of ``b`` or a folder above or below one."""
    return any(x == y or x.startswith(f"{y}/") or y.startswith(f"{x}/") for x in a for y in b)


def block_groups(blocks: list[Block]) -> list[list[Block]]:
    """``blocks`` (of one page, in order) in groups that share no path under ``runs/`` or
    ``benchmarks/results/``: a block that reads what another writes is in the other's group. Each group
    keeps the page's order and the groups are ordered by their first block."""
    groups: list[list[Block]] = []
    for block in blocks:
        paths = docs_paths(block)
        joined = [group for group in groups if any(shares_a_path(paths, docs_paths(b)) for b in group)]
        merged = [b for group in joined for b in group] + [block]
        groups = [group for group in groups if group not in joined] + [sorted(merged, key=lambda b: b.line)]
        groups.sort(key=lambda group: group[0].line)
    return groups


def in_scratch(code: str, scratch: Path) -> str:
    """``code`` with its output paths (``runs/...``, ``benchmarks/results/...``) inside ``scratch``."""
    return OUTPUT_PATH.sub(f"{scratch}/", code)


def with_budget(command: str, budget: str | None) -> str:
    """``command`` with the budget's flags appended when it runs a script or a module."""
    return f"{command} {budget}" if budget and RUNS_PROGRAM.search(command) else command


def runnable_commands(block: Block, scratch: Path, replacements: dict[str, str] | None = None) -> list[str]:
    """The commands of a bash block as the tests run them: ``replacements`` (documented text -> text) applied,
    the budget appended, one seed, outputs (the budget's too) in ``scratch``."""
    budget = block.value if block.kind == "budget" else None
    commands = []
    for command in block.commands():
        for documented, replacement in (replacements or {}).items():
            command = command.replace(documented, replacement)
        commands.append(in_scratch(one_seed(with_budget(command, budget)), scratch))
    return commands


def run_bash_block(block: Block, scratch: Path, replacements: dict[str, str] | None = None) -> list[str]:
    """Run a bash block's commands in order in one shell (a variable one command sets serves the next), in
    this process; fail with the failing command and the end of its output. Every ``--output_dir`` /
    ``--out`` of the commands must then be a folder in ``scratch`` with something in it. Returns what each
    command printed."""
    commands = runnable_commands(block, scratch, replacements)
    shell = Shell()
    printed = []
    for command in commands:
        try:
            printed.append(shell.run(command))
        except Exception as error:
            raise AssertionError(f"{block.where}: {error}") from error
    for command in commands:
        for match in OUTPUT_FLAG.finditer(command):
            output = Path(match.group("path"))
            assert output.is_relative_to(scratch), f"{block.where}: {command} writes outside {scratch}"
            assert output.is_dir() and any(output.iterdir()), f"{block.where}: {command} wrote nothing"
    return printed


def python_script(blocks: list[Block], scratch: Path) -> str:
    """The python blocks as one script, each headed by where it comes from, outputs in ``scratch``."""
    return "\n".join(f"# {block.where}\n{in_scratch(block.code, scratch)}" for block in blocks)


def run_python_blocks(blocks: list[Block], scratch: Path, then: str = "") -> dict:
    """The python blocks (of one page, in order) as one script in a namespace of its own, in this process,
    then the code ``then`` (a test's checks); returns the namespace. What a block registers in the
    attention registry is gone after (contributing.md registers a toy: it must not stay if a block fails)."""
    script = f"{python_script(blocks, scratch)}\n{then}"
    filename = f"<the python blocks of {blocks[0].page.name}>"
    linecache.cache[filename] = (len(script), None, script.splitlines(keepends=True), filename)  # tracebacks
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    registered = dict(ATTENTION_REGISTRY)
    try:
        with no_interpreter_of_our_stack(filename):
            exec(compile(script, filename, "exec"), namespace)
    finally:
        ATTENTION_REGISTRY.clear()
        ATTENTION_REGISTRY.update(registered)
    return namespace
