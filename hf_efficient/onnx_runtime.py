"""Serve an exported folder with ONNX Runtime on the CPU: :class:`OnnxRuntimeModel` runs ``model.onnx``
with the tokenizer / image processor / graph collator saved beside it. :mod:`hf_efficient.export` writes
such folders (and re-exports this class: ``from hf_efficient.export import OnnxRuntimeModel`` works).

    model = OnnxRuntimeModel("runs/imdb-longformer-serving")
    logits = model.run(**model.encode_texts(["a fine film", "dull"]))["logits"]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

from .errors import InputFileNotFoundError
from .extras import import_extra

ONNX_FILE = "model.onnx"
# The dtype of each ONNX input type a model declares (tokenizers give int32 on some platforms).
_ONNX_TYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32, "tensor(bool)": np.bool_}


def to_numpy(x) -> np.ndarray:
    """A tensor (any device) or array-like as a NumPy array."""
    return x.detach().cpu().numpy() if torch.is_tensor(x) else np.asarray(x)


def _feed(value, onnx_type: str) -> np.ndarray:
    """A tensor or array in the dtype the ONNX input declares, contiguous."""
    return np.ascontiguousarray(to_numpy(value), dtype=_ONNX_TYPES.get(onnx_type))


class OnnxRuntimeModel:
    """An exported folder in an ONNX Runtime session, with the model's pre-processing.

    Args:
        path: a folder written by :func:`hf_efficient.export.export_folder` (or an ONNX file).
        threads: ONNX Runtime's intra-op threads (None: its default, every core).
        providers: ONNX Runtime execution providers.

    ``run(**arrays)`` returns {output name: array}; ``encode_texts`` / ``encode_images`` /
    ``collate_graphs`` turn raw inputs into the arrays ``run`` takes, with the tokenizer, image processor or
    collator saved beside the model.
    """

    def __init__(self, path: str | Path, threads: int | None = None, providers=("CPUExecutionProvider",)):
        onnxruntime = import_extra("onnxruntime", "export", "hf_efficient.export.OnnxRuntimeModel")
        path = Path(path)
        self.folder = path if path.is_dir() else path.parent
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        onnx_file = path / ONNX_FILE if path.is_dir() else path
        if not onnx_file.is_file():
            raise InputFileNotFoundError(
                f"{onnx_file}: no such file. A serving folder is written by scripts/export.py (with its ONNX "
                "file unless --no_onnx); give that folder."
            )
        self.session = onnxruntime.InferenceSession(str(onnx_file), options, providers=list(providers))
        self.input_names = [node.name for node in self.session.get_inputs()]
        self.output_names = [node.name for node in self.session.get_outputs()]
        self._types = {node.name: node.type for node in self.session.get_inputs()}

    def run(self, **inputs) -> dict[str, np.ndarray]:
        """Run on named inputs (tensors or arrays; extra names are ignored): {output name: array}."""
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise ValueError(f"missing serving input(s) {missing}; this model takes {self.input_names}.")
        feeds = {name: _feed(inputs[name], self._types[name]) for name in self.input_names}
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))

    def config(self):
        return AutoConfig.from_pretrained(self.folder)

    def encode_texts(self, texts: list[str], max_length: int | None = None) -> dict[str, np.ndarray]:
        """Tokenize with the tokenizer saved beside the model (padding to the longest, truncation)."""
        from .modeling.checkpoint_files import load_tokenizer

        tokenizer = load_tokenizer(self.folder)
        limit = max_length or self.config().max_position_embeddings
        return dict(tokenizer(texts, padding=True, truncation=True, max_length=limit, return_tensors="np"))

    def encode_images(self, images) -> dict[str, np.ndarray]:
        """Pixel values from the image processor saved beside the model (PIL images or arrays)."""
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(self.folder)
        return dict(processor(images, return_tensors="np"))

    def collate_graphs(self, records: list[dict]) -> dict[str, np.ndarray]:
        """A padded batch of graph records (with the structural columns the config reads), as the model's
        :class:`~hf_efficient.models.graph.GraphCollator` builds it."""
        from .models.graph import GraphCollator

        batch = GraphCollator.for_config(self.config())(records)
        return {name: value.numpy() for name, value in batch.items() if name in self.input_names}
