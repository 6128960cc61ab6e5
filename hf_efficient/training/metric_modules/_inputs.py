"""What the metric modules of this folder share: the description of their inputs and the ``MetricInfo``.

``evaluate.load("<this folder>/<name>.py")`` copies a module, and the files of this folder it names in a
relative import, into evaluate's module cache: each module loads offline on its own.
"""

import datasets
import evaluate
import numpy as np

INPUTS = """
Args:
    predictions: one prediction per example (a class id, or a value for regression).
    references: the true label of each example, in the same order.
    ignore_index: references equal to it are left out, with their predictions (default -100: the
        padding and unlabelled positions of Hugging Face collators). Regression metrics have none.
"""


def metric_info(description: str, value_type: str, citation: str = "") -> evaluate.MetricInfo:
    """``MetricInfo`` of a metric over scalar predictions and references of ``value_type`` ("int64" class
    ids, or "float64" values: float32 would round regression targets before the metric sees them)."""
    value = datasets.Value(value_type)
    return evaluate.MetricInfo(
        description=description,
        citation=citation,
        inputs_description=INPUTS,
        features=datasets.Features({"predictions": value, "references": value}),
    )


def kept(predictions, references, ignore_index):
    """(predictions, references) as arrays without the positions whose reference is ``ignore_index``."""
    predictions, references = np.asarray(predictions), np.asarray(references)
    if ignore_index is None:
        return predictions, references
    keep = references != ignore_index
    return predictions[keep], references[keep]
