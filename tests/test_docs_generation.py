"""Every command of docs/generation.md runs, in the page's order, at tiny sizes, and produces what the page
says.

The page's blocks are read from the file itself (tests/docs_blocks.py): each bash block with the budget of its
marker (a few IMDB texts and training steps on a tiny model, the generation benchmark's smoke preset), outputs
in a temporary folder; the tokenizer command, which takes no flags, is shrunk by replacing its text. Then the
pipeline block, which needs the trained model. The generation benchmark, independent of the rest, is a test
of its own. What the commands produce is checked: a perplexity table with
full as its reference row, a generation plot, a pipeline that generates.
"""

from __future__ import annotations

import pytest

from .docs_blocks import ROOT, page_blocks, run_bash_block, run_python_blocks

PAGE = ROOT / "docs" / "generation.md"
# The tokenizer command: a few hundred reviews and a small vocabulary instead of 25,000 and 8,000.
SMALL_TOKENIZER = {
    "load_movie_reviews('imdb')": "load_movie_reviews('imdb').select(range(300))",
    "'text', 8000, 128)": "'text', 600, 128)",
}


def test_the_page_has_the_commands_this_test_expects():
    blocks = page_blocks(PAGE)
    bash = [command for block in blocks if block.language == "bash" for command in block.commands()]
    assert sum("scripts/pretrain_clm.py" in line for line in bash) == 5  # one run per causal type
    assert sum(all(text in line for text in SMALL_TOKENIZER) for line in bash) == 1
    assert any("benchmarks.studies.clm_perplexity" in line for line in bash)
    assert any("benchmarks.generation" in line for line in bash)
    assert [block.kind for block in blocks if block.language == "bash"] == ["budget", None, "budget"]
    assert sum(block.language == "python" for block in blocks) == 3  # generating, the pipeline, bert2bert
    assert "PERPLEXITY_TABLE" not in PAGE.read_text() and "GENERATION_TABLE" not in PAGE.read_text()


def is_generation_benchmark(block) -> bool:
    return "benchmarks.generation" in block.code


@pytest.mark.slow  # five tiny training runs, the perplexity table, the pipeline
def test_every_command_of_the_page_runs(tmp_path, monkeypatch):
    """The tokenizer, the five training runs, the table of them and the pipeline of the trained model, in
    order: each needs what the one before wrote. The generation benchmark, which needs none of it, is
    test_the_generation_benchmark_runs, so the two run side by side. Eight commands in this process (the
    tokenizer, five training runs of two steps, the table, the pipeline); their order cannot be split."""
    monkeypatch.chdir(ROOT)
    blocks = page_blocks(PAGE)
    for block in blocks:
        if block.language == "bash" and not is_generation_benchmark(block):
            run_bash_block(block, tmp_path, replacements=SMALL_TOKENIZER)
    summary = (tmp_path / "benchmarks/results/reference/clm_perplexity/summary.md").read_text()
    assert "`full` (reference)" in summary and "Warning" not in summary  # one budget for the five runs
    for attention_type in ("linear", "performer", "rfa", "longformer"):
        assert f"| `{attention_type}` |" in summary

    # the pipeline block (marked skip for tests/test_docs.py: it needs the model trained above)
    pipeline = [block for block in blocks if block.language == "python" and "pipeline(" in block.code]
    assert len(pipeline) == 1 and pipeline[0].kind == "skip"
    generated = "generator('this movie was', max_new_tokens=3)[0]['generated_text']"
    run_python_blocks(
        pipeline, tmp_path, then=f"assert {generated}.startswith('this movie was'), {generated}"
    )


@pytest.mark.slow  # the generation benchmark's smoke preset
def test_the_generation_benchmark_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    (block,) = [
        block for block in page_blocks(PAGE) if block.language == "bash" and is_generation_benchmark(block)
    ]
    run_bash_block(block, tmp_path)
    assert (tmp_path / "benchmarks/results/reference/generation/generation.png").exists()
