"""SQuAD 1.1: exact match and F1 (percentages) of answers normalised as the official script does, each
question scored against its best reference answer."""

import evaluate
import numpy as np

from ._squad import question_scores, squad_info


class Squad(evaluate.Metric):
    def _info(self):
        return squad_info("SQuAD 1.1 exact match and F1 (percent).", with_no_answer_probability=False)

    def _compute(self, predictions, references):
        scores = np.array([s[:2] for s in question_scores(predictions, references, False).values()])
        exact, f1 = 100.0 * scores.mean(axis=0) if len(scores) else (0.0, 0.0)
        return {"exact_match": float(exact), "f1": float(f1)}
