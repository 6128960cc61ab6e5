"""Export a trained model for serving: a ``torch.export`` program (``.pt2``) and an ONNX file that ONNX
Runtime runs on the CPU, both with a dynamic batch and (text) sequence length / (graphs) node and edge
counts.

    from hf_efficient.export import OnnxRuntimeModel, export_folder

    report = export_folder("runs/imdb-longformer", "runs/imdb-longformer-serving")
    model = OnnxRuntimeModel("runs/imdb-longformer-serving")
    logits = model.run(**model.encode_texts(["a fine film", "dull"]))["logits"]

(``OnnxRuntimeModel`` lives in :mod:`hf_efficient.onnx_runtime`, which needs only onnxruntime), or from the
shell (both commands are in docs/serving.md)::

    python scripts/export.py --model_name_or_path runs/imdb-longformer --output_dir runs/serving
    python scripts/serve_onnx.py --model_dir runs/serving "a fine film" "dull"

What is exported: the model's ``forward`` on the serving inputs of its modality, as positional tensors in
the order of :func:`serving_inputs`, returning the tensor fields of its output (``logits``, or
``last_hidden_state`` and ``pooler_output`` for the bare encoders) in the order of ``export.json``:

=========  ============================================================  ==================================
modality   inputs (shape)                                                dynamic dimensions
=========  ============================================================  ==================================
text       input_ids, attention_mask, token_type_ids (batch, sequence)    batch >= 1, 2 <= sequence <= max
                                                                         position embeddings
vision     pixel_values (batch, channels, image_size, image_size)         batch >= 1 (the image size is the
                                                                         model's)
graph      node_feat (batch, nodes, F), node_mask (batch, nodes),         batch >= 1, nodes >= 2, edges >= 1
           edge_index (2, edges), edge_attr (edges, edge_dim) and the
           structural inputs the config reads (spatial_pos, degrees...)
=========  ============================================================  ==================================

Every attention core computes in one piece while traced (no branch on tensor values, no loop over a
number of chunks; see :mod:`hf_efficient.attention.inputs`), so one program serves every size in range.
An exported program trusts its inputs: the value checks of eager mode (a 0/1 padding mask, edges inside
their own graph and away from padding, categorical node features in range) are not part of it. What is
baked in: the configured global tokens of ``longformer`` (``global_token_indices``; a per-example
``global_attention_mask`` is not a serving input), the eval-mode rotations of ``reformer_lsh`` (which
needs a fixed ``num_buckets``), the random features of ``performer`` / ``rfa`` (buffers, as in eager
mode). What cannot be exported raises :class:`NotExportableError` naming the type and why
(:meth:`~hf_efficient.modeling.pretrained.EfficientPreTrainedModel.tracing_blockers`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig

from .compat import attn_implementation, size_oblivious_tracing
from .extras import import_extra
from .modeling.pretrained import EfficientPreTrainedModel
from .onnx_runtime import ONNX_FILE, OnnxRuntimeModel, to_numpy

PROGRAM_FILE = "model.pt2"
MANIFEST_FILE = "export.json"
# Output fields that are not served: the loss needs labels, the per-layer tensors are for analysis.
_UNSERVED_OUTPUTS = ("loss", "hidden_states", "attentions")
# Kernels of exact attention that trace to ONNX operators (FlexAttention and flash kernels do not).
_TRACEABLE_KERNELS = ("eager", "sdpa")
# Log lines of the ONNX exporter that say nothing about this export: torchvision's detection ops it skips
# registering (torchvision is not needed) and onnx_ir's default of INTS for an empty list attribute (an empty
# list of axes or of a shape, which INTS is). {logger: start of the message}.
_EXPORTER_NOISE = {
    "torch.onnx._internal.exporter._registration": "torchvision is not installed",
    "onnx_ir._convenience": "Attribute type is ambiguous because it is an empty sequence",
}


class _DropMessages(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Drop the log lines of :data:`_EXPORTER_NOISE` (only those) while the ONNX exporter runs."""
    filters = {name: _DropMessages(start) for name, start in _EXPORTER_NOISE.items()}
    for name, dropper in filters.items():
        logging.getLogger(name).addFilter(dropper)
    try:
        yield
    finally:
        for name, dropper in filters.items():
            logging.getLogger(name).removeFilter(dropper)


class NotExportableError(ValueError):
    """The model, as configured, cannot be exported; the message names the attention type or option, why,
    and the fix."""


@dataclass(frozen=True)
class ServingInput:
    """One input of an exported program: its name, its shape (a dimension is a size, or the name of a
    dynamic dimension of :data:`DYNAMIC_DIMS`) and its dtype."""

    name: str
    shape: tuple[int | str, ...]
    dtype: torch.dtype


# Dynamic dimensions: (minimum, maximum or None). "sequence" is capped by the position embeddings. The
# minimum of sequence and nodes is 2: exported graphs hold broadcasts that torch.export specialises for
# a size of 1 (a tokenizer's output always holds [CLS] and [SEP]; pad a one-node batch to two slots).
DYNAMIC_DIMS = {"batch": (1, None), "sequence": (2, None), "nodes": (2, None), "edges": (1, None)}
_UNBOUNDED = 2**62  # torch.export.Dim's maximum for a dimension with no bound


def serving_inputs(model: EfficientPreTrainedModel) -> list[ServingInput]:
    """The inputs an exported ``model`` takes, in order (see the module docstring's table)."""
    config = model.config
    modality = getattr(config, "modality", None)
    if modality == "text":
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if config.type_vocab_size > 1 else [])
        return [ServingInput(name, ("batch", "sequence"), torch.int64) for name in names]
    if modality == "vision":
        shape = ("batch", config.num_channels, config.image_size, config.image_size)
        return [ServingInput("pixel_values", shape, torch.float32)]
    if modality == "graph":
        node_dtype = torch.float32 if config.node_vocab_size is None else torch.int64
        inputs = [
            ServingInput("node_feat", ("batch", "nodes", config.node_feature_dim), node_dtype),
            ServingInput("node_mask", ("batch", "nodes"), torch.bool),
        ]
        if config.needs_edges() or config.edge_dim is not None:
            inputs.append(ServingInput("edge_index", (2, "edges"), torch.int64))
        if config.edge_dim is not None:
            inputs.append(ServingInput("edge_attr", ("edges", config.edge_dim), torch.float32))
        structural = {
            "spatial_pos": (("batch", "nodes", "nodes"), torch.int64),
            "in_degree": (("batch", "nodes"), torch.int64),
            "out_degree": (("batch", "nodes"), torch.int64),
            "lap_pe": (("batch", "nodes", config.lap_pe_dim), torch.float32),
            "rw_pe": (("batch", "nodes", config.rw_pe_dim), torch.float32),
            "wl_colors": (("batch", "nodes"), torch.int64),
        }
        return inputs + [ServingInput(name, *structural[name]) for name in config.structural_inputs()]
    raise NotExportableError(
        f"{type(model).__name__} has no serving inputs: exported models are the text, vision and graph "
        f"encoders of hf_efficient (config.modality 'text', 'vision' or 'graph', got {modality!r})."
    )


def dimension_range(model: EfficientPreTrainedModel, name: str) -> tuple[int, int | None]:
    """(minimum, maximum or None) of a dynamic dimension of ``model``'s serving inputs."""
    low, high = DYNAMIC_DIMS[name]
    if name == "sequence":  # (graph configs have no position embeddings: their sequence is "nodes")
        high = getattr(model.config, "max_position_embeddings", None)
    return low, high


def example_inputs(
    model: EfficientPreTrainedModel, sizes: dict[str, int], seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random valid serving inputs of the given dynamic sizes (``{"batch": 2, "sequence": 11}``), to trace
    with and to compare an export with its model. Row i of a batch is padded: text keeps max(2, L - 3 i) of
    L tokens, graph i has max(1, nodes - i) real nodes joined in a ring with self loops."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    inputs = {}
    for spec in serving_inputs(model):
        if any(isinstance(d, str) and d not in sizes for d in spec.shape):
            continue  # sized by the data (the edges of the graphs below)
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in spec.shape)
        if spec.dtype.is_floating_point:
            inputs[spec.name] = torch.randn(shape, generator=generator)
        elif spec.dtype == torch.bool:
            inputs[spec.name] = torch.ones(shape, dtype=torch.bool)
        else:
            inputs[spec.name] = torch.zeros(shape, dtype=spec.dtype)
    modality = config.modality
    if modality == "text":
        b, n = sizes["batch"], sizes["sequence"]
        inputs["input_ids"] = torch.randint(0, config.vocab_size, (b, n), generator=generator)
        lengths = torch.tensor([max(2, n - 3 * i) for i in range(b)])
        inputs["attention_mask"] = (torch.arange(n)[None] < lengths[:, None]).long()
    if modality == "graph":
        inputs.update(_example_graphs(model, sizes["batch"], sizes["nodes"], inputs, generator))
    return inputs


def _example_graphs(
    model, b: int, n: int, inputs: dict, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Node masks, ring edges with self loops, and structural inputs of matching sizes for
    :func:`example_inputs` (random values of the right ranges: they only need to be valid)."""
    config = model.config
    real = [max(1, n - g) for g in range(b)]
    node_mask = torch.arange(n)[None] < torch.tensor(real)[:, None]  # (b, n)
    sources, targets = [], []
    for g, count in enumerate(real):
        nodes = torch.arange(count)
        ring = (nodes + 1) % count
        sources += [nodes, ring, nodes]
        targets += [ring, nodes, nodes]
        sources[-3:] = [s + g * n for s in sources[-3:]]
        targets[-3:] = [t + g * n for t in targets[-3:]]
    edge_index = torch.stack([torch.cat(sources), torch.cat(targets)])  # (2, E)
    graphs = {"node_mask": node_mask}
    names = {spec.name for spec in serving_inputs(model)}
    if "edge_index" in names:
        graphs["edge_index"] = edge_index
    if "edge_attr" in names:
        graphs["edge_attr"] = torch.randn(edge_index.shape[1], config.edge_dim, generator=generator)
    if config.node_vocab_size is not None:
        shape = inputs["node_feat"].shape
        graphs["node_feat"] = torch.randint(0, config.node_vocab_size, shape, generator=generator)
    pair_mask = node_mask[:, :, None] & node_mask[:, None, :]
    bounded = {
        "spatial_pos": config.max_spatial_distance + 2,
        "in_degree": (config.max_degree or 1) + 1,
        "out_degree": (config.max_degree or 1) + 1,
        "wl_colors": config.wl_vocab_size or 1,
    }
    for name, high in bounded.items():
        if name in names:
            values = torch.randint(0, high, inputs[name].shape, generator=generator)
            graphs[name] = values.masked_fill(~(pair_mask if name == "spatial_pos" else node_mask), 0)
    if "spatial_pos" in names:
        graphs["spatial_pos"] = graphs["spatial_pos"].masked_fill(~pair_mask, -1)  # padded: unreachable
    return graphs


class ServingModule(nn.Module):
    """A model's forward on positional serving inputs, returning a tuple of its served outputs: the module
    that is traced (``torch.export`` and ONNX need a fixed, flat signature)."""

    def __init__(self, model: EfficientPreTrainedModel, input_names: list[str], output_names: list[str]):
        super().__init__()
        self.model, self.input_names, self.output_names = model, list(input_names), list(output_names)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.model(**dict(zip(self.input_names, tensors, strict=True)))
        return tuple(outputs[name] for name in self.output_names)


def served_outputs(model: EfficientPreTrainedModel, inputs: dict[str, torch.Tensor]) -> list[str]:
    """The names of the tensor fields a forward on ``inputs`` returns (without loss and per-layer tensors)."""
    with torch.no_grad():
        outputs = model(**inputs)
    return [
        name for name, value in outputs.items() if name not in _UNSERVED_OUTPUTS and torch.is_tensor(value)
    ]


def check_exportable(model: EfficientPreTrainedModel) -> None:
    """Raise :class:`NotExportableError` listing every reason ``model`` cannot be exported to ONNX (the
    attention types or options, why, and the fix); return quietly when it can."""
    name = type(model).__name__
    if not isinstance(model, EfficientPreTrainedModel):
        raise NotExportableError(f"{name} is not an hf_efficient model; export hf_efficient's encoders.")
    reasons = list(model.tracing_blockers())
    kernel = attn_implementation(model.config) or "sdpa"
    if kernel not in _TRACEABLE_KERNELS:
        reasons.append(
            f"attn_implementation={kernel!r} has no ONNX form; export with "
            "model.set_attn_implementation('sdpa') (or 'eager')."
        )
    for core in model.attention_cores():
        if getattr(core.config, "implementation", None) == "flex":
            reasons.append(
                f"{core.attention_type}: implementation='flex' runs FlexAttention, which ONNX has no "
                "operator for; export with attention_config implementation='auto' (its native path on the "
                "CPU)."
            )
    serving_inputs(model)  # raises for a model without a serving signature
    if reasons:
        lines = "\n".join(f"  - {reason}" for reason in dict.fromkeys(reasons))
        raise NotExportableError(f"{name} cannot be exported:\n{lines}")


def _dynamic_shapes(model, inputs: list[ServingInput]) -> tuple[tuple[dict[int, Any], ...]]:
    """torch.export's ``dynamic_shapes`` for ServingModule's ``*tensors``: one Dim per named dimension."""
    dims = {}
    for name in DYNAMIC_DIMS:
        low, high = dimension_range(model, name)
        dims[name] = torch.export.Dim(name, min=low, max=high or _UNBOUNDED)
    return (
        tuple({axis: dims[d] for axis, d in enumerate(spec.shape) if isinstance(d, str)} for spec in inputs),
    )


def trace_sizes(model: EfficientPreTrainedModel) -> dict[str, int]:
    """The sizes traced with: none of them 1 or a bound of its range (torch.export would specialise)."""
    high = dimension_range(model, "sequence")[1] or _UNBOUNDED
    return {"batch": 2, "sequence": min(13, high - 1), "nodes": 5}


@dataclass
class ExportedModel:
    """A program from :func:`export_program` with its serving signature.

    Attributes:
        program: the ``torch.export`` program; call ``program.module()(*tensors)`` with the inputs in order.
        inputs: the serving inputs, in order.
        output_names: the names of the returned tensors, in order.
    """

    program: torch.export.ExportedProgram
    inputs: list[ServingInput]
    output_names: list[str]

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def __call__(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the program on named inputs; {output name: tensor}."""
        outputs = self.program.module()(*(inputs[name] for name in self.input_names))
        return dict(zip(self.output_names, outputs, strict=True))


def export_program(model: EfficientPreTrainedModel) -> ExportedModel:
    """``torch.export`` ``model`` (put in eval mode) on its serving inputs with dynamic sizes.

    Raises :class:`NotExportableError` first when some part cannot be traced. Shapes are traced "size
    oblivious" (``backed_size_oblivious``): otherwise a dimension that happens to need no padding, or a
    batch of one, would specialise the program to that case.
    """
    check_exportable(model)
    model.eval()
    specs = serving_inputs(model)
    inputs = example_inputs(model, trace_sizes(model))
    outputs = served_outputs(model, inputs)
    module = ServingModule(model, [s.name for s in specs], outputs)
    args = tuple(inputs[s.name] for s in specs)
    with torch.no_grad(), size_oblivious_tracing():
        program = torch.export.export(
            module, args, dynamic_shapes=_dynamic_shapes(model, specs), strict=False
        )
    return ExportedModel(program, specs, outputs)


def export_onnx(exported: ExportedModel, path: str | Path, optimize: bool = True) -> Path:
    """Convert an :class:`ExportedModel` into an ONNX file (``torch.onnx.export(..., dynamo=True)``), with
    the serving input and output names and the dynamic dimensions named as in :data:`DYNAMIC_DIMS`."""
    onnx = import_extra("onnx", "export", "hf_efficient.export.export_onnx")
    # torch.onnx.export(dynamo=True) translates with onnxscript
    import_extra("onnxscript", "export", "hf_efficient.export.export_onnx")

    with warnings.catch_warnings(), _quiet_exporter():  # the exporter's notes on the ops it decomposes
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(
            exported.program,
            dynamo=True,
            input_names=exported.input_names,
            output_names=exported.output_names,
            optimize=optimize,
            verbose=False,
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx_program.save(str(path))
    proto = onnx.load(str(path))
    names = _dimension_symbols(exported)
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in names:  # (dim_value is the other oneof)
                dim.dim_param = names[dim.dim_param]
    onnx.save(proto, str(path))
    return path


def _dimension_symbols(exported: ExportedModel) -> dict[str, str]:
    """{symbol of the program (``s43``): dimension name (``batch``)}, read off its user inputs."""
    nodes = {node.name: node for node in exported.program.graph.nodes if node.op == "placeholder"}
    user_inputs = exported.program.graph_signature.user_inputs
    names = {}
    for spec, node_name in zip(exported.inputs, user_inputs, strict=True):
        for size, dim in zip(nodes[node_name].meta["val"].shape, spec.shape, strict=True):
            if isinstance(dim, str) and isinstance(size, torch.SymInt):
                names[str(size)] = dim
    return names


def compare_sizes(model: EfficientPreTrainedModel) -> list[dict[str, int]]:
    """Two sizes that :func:`trace_sizes` did not trace: a batch of one and of three, a short and a longer
    sequence (within the position embeddings) or graph."""
    high = dimension_range(model, "sequence")[1] or _UNBOUNDED
    return [
        {"batch": 1, "sequence": min(7, high), "nodes": 3},
        {"batch": 3, "sequence": min(29, high), "nodes": 9},
    ]


def max_difference(model: EfficientPreTrainedModel, run, sizes: list[dict[str, int]], seed: int = 1) -> float:
    """The largest absolute difference between ``run(**inputs)`` ({name: tensor or array}) and the model's own
    served outputs, over every output element, on :func:`example_inputs` of each size."""
    worst = 0.0
    model.eval()
    for index, size in enumerate(sizes):
        inputs = example_inputs(model, size, seed=seed + index)
        with torch.no_grad():
            expected = model(**inputs)
        for name, got in run(**inputs).items():
            difference = np.abs(np.asarray(to_numpy(got), dtype=np.float64) - to_numpy(expected[name]))
            worst = max(worst, float(difference.max()))
    return worst


def load_for_export(model_name_or_path: str | Path) -> EfficientPreTrainedModel:
    """The model a saved folder holds, as its ``config.architectures`` names it (the bare encoder when the
    config names none)."""
    from transformers import AutoModel

    from . import models
    from .modeling.checkpoint_files import check_pretrained_path

    check_pretrained_path(model_name_or_path, "hf_efficient.export (--model_name_or_path)")
    config = AutoConfig.from_pretrained(model_name_or_path)
    architecture = (config.architectures or [None])[0]
    model_class = getattr(models, architecture, None) if architecture else None
    if architecture and model_class is None:
        raise NotExportableError(
            f"{model_name_or_path}: config.architectures names {architecture!r}, which is not an "
            f"hf_efficient model; export hf_efficient's encoders ({', '.join(models.__all__)})."
        )
    if model_class is None:
        return AutoModel.from_pretrained(model_name_or_path)
    return model_class.from_pretrained(model_name_or_path)


@dataclass
class ExportReport:
    """What :func:`export_folder` wrote and measured (also saved as ``export.json``).

    Attributes:
        output_dir: the serving folder.
        architecture: the exported model class.
        attention_types: the attention types of its layers.
        inputs: [{"name", "shape", "dtype"}] in order; shapes name their dynamic dimensions.
        outputs: output names in order.
        dimensions: {name: [minimum, maximum or None]} of the dynamic dimensions.
        program_error: largest |program - model| on two sizes the export did not see, or None.
        onnx_error: largest |ONNX Runtime - model| on the same inputs, or None.
        files: {"program": "model.pt2", "onnx": "model.onnx" or None}.
    """

    output_dir: str
    architecture: str
    attention_types: list[str]
    inputs: list[dict]
    outputs: list[str]
    dimensions: dict[str, list]
    program_error: float | None = None
    onnx_error: float | None = None
    files: dict[str, str | None] = field(default_factory=dict)


def export_folder(
    model_name_or_path: str | Path,
    output_dir: str | Path,
    onnx: bool = True,
    verify: bool = True,
    optimize: bool = True,
    program_tolerance: float = 1e-5,
    onnx_tolerance: float = 1e-4,
    progress: Callable[[str], None] | None = None,
) -> ExportReport:
    """A saved model folder -> a serving folder: ``model.pt2`` (``torch.export``), ``model.onnx``, the config
    and the tokenizer / image processor, and ``export.json`` (the signature and the measured errors).

    With ``verify`` the reloaded program and the ONNX Runtime session run on two sizes the export did not
    see and must match the model within ``program_tolerance`` / ``onnx_tolerance`` (largest absolute
    difference), else a ``ValueError`` gives both numbers. ``progress`` (e.g. ``print``) is called with a
    line as each step starts and with the time the run has taken so far (an export takes from seconds to
    minutes; ``scripts/export.py`` prints them).
    """
    from .modeling.blocks import attention_types_in

    steps = ["loading the model", "torch.export"]
    steps += ["ONNX export" + ("" if optimize else " (not optimised)")] if onnx else []
    steps += ["checking the exported files against the model on new sizes"] if verify else []
    started = time.perf_counter()

    def step(name: str) -> None:
        if progress is not None:
            number = steps.index(name) + 1
            progress(f"[{number}/{len(steps)}] {name} ({time.perf_counter() - started:.0f} s so far)")

    step(steps[0])
    model = load_for_export(model_name_or_path)
    step("torch.export")
    exported = export_program(model)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(exported.program, str(out / PROGRAM_FILE))
    if onnx:
        step(steps[2])
    onnx_path = export_onnx(exported, out / ONNX_FILE, optimize=optimize) if onnx else None
    model.config.save_pretrained(out)
    _copy_preprocessing(model_name_or_path, out)
    report = ExportReport(
        output_dir=str(out),
        architecture=type(model).__name__,
        attention_types=attention_types_in(model.config),
        inputs=[
            {"name": s.name, "shape": list(s.shape), "dtype": str(s.dtype).replace("torch.", "")}
            for s in exported.inputs
        ],
        outputs=exported.output_names,
        dimensions={name: list(dimension_range(model, name)) for name in _used_dimensions(exported.inputs)},
        files={"program": PROGRAM_FILE, "onnx": ONNX_FILE if onnx_path else None},
    )
    if verify:
        step(steps[-1])
        sizes = compare_sizes(model)
        program = ExportedModel(
            torch.export.load(str(out / PROGRAM_FILE)), exported.inputs, exported.output_names
        )
        report.program_error = max_difference(model, program, sizes)
        if onnx_path is not None:
            report.onnx_error = max_difference(model, OnnxRuntimeModel(out).run, sizes)
    (out / MANIFEST_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    for label, error, tolerance in (
        ("exported program", report.program_error, program_tolerance),
        ("ONNX Runtime", report.onnx_error, onnx_tolerance),
    ):
        if error is not None and not error <= tolerance:  # (a NaN fails too)
            raise ValueError(
                f"{label} differs from the model by {error:.3g} (tolerance {tolerance:g}) on inputs of sizes "
                f"{compare_sizes(model)}; see {out / MANIFEST_FILE}."
            )
    return report


def _used_dimensions(inputs: list[ServingInput]) -> list[str]:
    return list(dict.fromkeys(d for spec in inputs for d in spec.shape if isinstance(d, str)))


def _copy_preprocessing(source: str | Path, out: Path) -> None:
    """Copy the tokenizer / image processor files of a local model folder next to the export."""
    source = Path(source)
    if not source.is_dir():
        return
    for pattern in (
        "tokenizer*",
        "vocab.*",
        "special_tokens_map.json",
        "preprocessor_config.json",
        "*.model",
    ):
        for file in source.glob(pattern):
            if file.is_file():
                shutil.copy2(file, out / file.name)


def export_table() -> str:
    """The markdown table of docs/serving.md: for every registered type, whether each encoder exports it at
    the type's default hyperparameters (or which change it needs), and what the exported graph bakes in
    (the core's ``export_note``)."""
    from .attention.base import MODALITIES, AttentionSpec
    from .attention.registry import ATTENTION_REGISTRY, build_attention, list_attention_types

    rows = ["| `attention_type` | text | vision | graph | in the exported graph |", "|---|---|---|---|---|"]
    for name in list_attention_types():
        cls = ATTENTION_REGISTRY[name]
        blocker = build_attention(name, AttentionSpec(2, 8, max_seq_len=64)).tracing_blocker()
        mark = "yes" if blocker is None else "with a change (see notes)"
        cells = [mark if modality in cls.capabilities.modalities else "-" for modality in MODALITIES]
        rows.append(f"| `{name}` | {' | '.join(cells)} | {cls.export_note} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m hf_efficient.export [--update FILE ...]``: print the export table, or rewrite the text
    between the ``<!-- export-table -->`` markers of each file with it."""
    from .attention.__main__ import table_command

    table_command(export_table, "export-table", main.__doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
