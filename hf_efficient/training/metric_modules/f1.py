"""F1 as GLUE scores it: of the positive class (id 1) when every id is 0 or 1, else the unweighted mean of
the per-class F1 (macro), computed by scikit-learn. With no positive example among references and
predictions (a tiny evaluation split, or a model that never predicts class 1) the binary F1 is 0, without
scikit-learn's warning."""

import evaluate
import numpy as np
from sklearn.metrics import f1_score

from ._inputs import kept, metric_info


class F1(evaluate.Metric):
    def _info(self):
        return metric_info("F1 of class 1 (binary tasks), else macro F1 over the classes.", "int64")

    def _compute(self, predictions, references, ignore_index=-100):
        predictions, references = kept(predictions, references, ignore_index)
        binary = set(np.unique(references)) | set(np.unique(predictions)) <= {0, 1}
        return {
            "f1": float(
                f1_score(references, predictions, average="binary" if binary else "macro", zero_division=0.0)
            )
        }
