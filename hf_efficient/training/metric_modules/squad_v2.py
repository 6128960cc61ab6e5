"""SQuAD 2.0: exact match and F1 (percentages) over every question, and apart over those with an answer
(``HasAns_*``) and those without (``NoAns_*``, where only the empty prediction is right). Answers are
normalised as the official script does. The predictions' ``no_answer_probability`` is read but, as with
run_qa.py's predictions (always 0), the no-answer decision is the prediction itself (the empty string)."""

import evaluate
import numpy as np

from ._squad import question_scores, squad_info


class SquadV2(evaluate.Metric):
    def _info(self):
        return squad_info("SQuAD 2.0 exact match and F1 (percent), with and without answers.", True)

    def _compute(self, predictions, references):
        scores = list(question_scores(predictions, references, True).values())
        results = {}
        for prefix, kept in (
            ("", scores),
            ("HasAns_", [s for s in scores if s[2]]),
            ("NoAns_", [s for s in scores if not s[2]]),
        ):
            if not kept and prefix:
                continue
            values = np.array([s[:2] for s in kept]) if kept else np.zeros((1, 2))
            results[f"{prefix}exact"] = float(100.0 * values[:, 0].mean())
            results[f"{prefix}f1"] = float(100.0 * values[:, 1].mean())
            results[f"{prefix}total"] = len(kept)
        return results
