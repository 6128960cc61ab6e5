"""docs/graphs.md's Python example runs as written (its bash commands are run, at tiny sizes, by
tests/benchmarks/test_graph_attention_benchmark.py and test_graph_scale_benchmark.py)."""

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "graphs.md"


def test_the_python_example_runs_and_prints_what_its_comment_says():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], str(DOC), "exec"), {})
    # logits per node, sparse attention (1 graph, 4 heads, 5 x 5) with 10 edges + 5 self loops per head
    assert printed.getvalue().strip() == "torch.Size([1, 5, 3]) torch.Size([1, 4, 5, 5]) 60"
