"""One seed of the long-document study's frozen-encoder protocol: a linear probe on an encoder's features.

Fine-tuning a 2,048-token encoder for long enough to learn the long-document task takes hours per seed on a
CPU thread; a frozen encoder's features cost one forward pass per document, shared by every seed. This asks
the same question, "does a model that reads more classify better?", of what each encoder already represents:

1. every document of ``--train_file`` and ``--validation_file`` (JSON lines with ``text`` and ``label``) goes
   through the encoder once, truncated to ``--max_seq_length`` (what exact attention must do at 512), and
   becomes the mean of its last hidden states over its tokens (all-MiniLM-L6-v2's own sentence pooling).
   The features are cached in ``--features_dir`` (written atomically), so the other seeds and a rerun after
   a kill read them instead of running the encoder again;
2. the seed draws ``--train_fraction`` of the training documents (without replacement), and a logistic
   regression on the standardised features is fitted on them, its L2 strength chosen by 5-fold
   cross-validation inside that draw: nothing is chosen on the test documents;
3. ``all_results.json`` in ``--output_dir`` holds the test accuracy (``eval_accuracy``) and the encoder's
   seconds per document (as samples per second, the names the Trainer uses, so ``benchmarks.seeds`` and the
   study's ``summarize`` read it as they read a fine-tune).

The seed spread is the variation that comes from which training documents the probe sees; the encoder is
the same in every seed. Run through ``python -m benchmarks.studies.long_documents run --protocol probe``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

SPLITS = {"train": "train_file", "test": "validation_file"}
C_GRID = np.logspace(-4, 2, 13)  # the L2 strengths cross-validation chooses from (sklearn's C = 1 / strength)


def read_documents(path: Path) -> tuple[list[str], np.ndarray]:
    """(texts, labels) of a JSON-lines file."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows or any("text" not in row or "label" not in row for row in rows):
        raise ValueError(f"{path}: expected JSON lines with 'text' and 'label' fields (the study's data).")
    return [row["text"] for row in rows], np.array([row["label"] for row in rows])


def mean_pooled_features(
    checkpoint: str, texts: list[str], max_length: int, batch_size: int, desc: str
) -> tuple[np.ndarray, float]:
    """(features (documents, hidden), seconds per document) of ``checkpoint``'s encoder, no gradients.
    Documents run longest first in batches of similar length, so padding costs little."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModel, AutoTokenizer

    import hf_efficient  # noqa: F401  (registers the package's model types with the Auto classes)

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModel.from_pretrained(checkpoint).eval()
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    order = np.argsort(lengths)[::-1]
    features = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
    start = time.perf_counter()
    with torch.inference_mode():
        for first in tqdm(range(0, len(texts), batch_size), desc=desc, unit="batch"):
            rows = order[first : first + batch_size]
            chosen = [texts[i] for i in rows]  # longest first
            batch = tokenizer(
                chosen, truncation=True, max_length=max_length, padding=True, return_tensors="pt"
            )
            hidden = model(**batch).last_hidden_state  # (batch, tokens, hidden)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (batch, tokens, 1)
            features[rows] = ((hidden * mask).sum(1) / mask.sum(1)).float().numpy()
    return features, (time.perf_counter() - start) / len(texts)


def cache_key(args: argparse.Namespace, texts: list[str]) -> str:
    """What a split's features depend on: the encoder, the length read and the documents themselves."""
    checkpoint = Path(args.model_name_or_path)
    documents = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    return json.dumps(
        {
            "checkpoint": str(checkpoint.resolve()) if checkpoint.exists() else args.model_name_or_path,
            "max_seq_length": args.max_seq_length,
            "documents": documents,
        },
        sort_keys=True,
    )


def cached_features(args: argparse.Namespace, split: str, texts: list[str]) -> tuple[np.ndarray, float]:
    """The split's features from ``--features_dir``, computed and saved there first if absent or made from
    another encoder, length or document set (then recomputed, and the reason printed)."""
    path, key = args.features_dir / f"{split}.npz", cache_key(args, texts)
    if path.exists():
        stored = np.load(path)
        if "key" in stored and str(stored["key"]) == key:
            return stored["features"], float(stored["seconds_per_document"])
        print(f"{path} holds features of another encoder, length or document set: computing them again.")
    args.features_dir.mkdir(parents=True, exist_ok=True)
    features, seconds = mean_pooled_features(
        args.model_name_or_path, texts, args.max_seq_length, args.batch_size, desc=f"{split} features"
    )
    partial = path.with_name(f"{path.stem}.partial.npz")  # renamed when complete: a kill leaves no half file
    np.savez(partial, features=features, seconds_per_document=seconds, key=key)
    os.replace(partial, path)
    return features, seconds


def fit_probe(features: np.ndarray, labels: np.ndarray, seed: int):
    """Standardise, then an L2 logistic regression whose strength 5-fold cross-validation (accuracy) picks
    from ``C_GRID``, refitted on all of ``features`` (fewer folds when a label has fewer than 5 documents, as
    in the suite's tiny runs). The scaler is fitted inside each fold, so no fold sees its held-out part."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    counts = np.unique(labels, return_counts=True)[1]
    smallest_class = int(counts.min()) if len(counts) > 1 else 0
    if smallest_class < 2:
        raise ValueError(
            f"The probe's {len(labels)} training documents need at least 2 of each label for "
            f"cross-validation (fewest: {smallest_class}): write more training documents (--train_size) or "
            "raise --train_fraction."
        )
    folds = StratifiedKFold(n_splits=min(5, smallest_class), shuffle=True, random_state=seed)
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    search = GridSearchCV(pipeline, {"logisticregression__C": C_GRID}, cv=folds, scoring="accuracy")
    return search.fit(features, labels)


def probe(args: argparse.Namespace) -> dict:
    texts, labels = {}, {}
    for split, flag in SPLITS.items():
        texts[split], labels[split] = read_documents(Path(getattr(args, flag)))
    features, seconds = {}, {}
    for split in SPLITS:
        features[split], seconds[split] = cached_features(args, split, texts[split])
    train_count = len(texts["train"])
    drawn = np.random.default_rng(args.seed).choice(
        train_count, size=max(2, round(args.train_fraction * train_count)), replace=False
    )
    model = fit_probe(features["train"][drawn], labels["train"][drawn], args.seed)
    metrics = {
        "eval_accuracy": float((model.predict(features["test"]) == labels["test"]).mean()),
        "train_accuracy": float((model.predict(features["train"][drawn]) == labels["train"][drawn]).mean()),
        "probe_C": float(model.best_params_["logisticregression__C"]),
        "train_documents": len(drawn),
        "eval_documents": len(texts["test"]),
        "train_samples_per_second": 1 / seconds["train"],
        "eval_samples_per_second": 1 / seconds["test"],
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "all_results.json").write_text(json.dumps(metrics, indent=1))
    print(json.dumps(metrics), flush=True)
    return metrics


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_name_or_path", required=True, help="the encoder (any BERT-style checkpoint)")
    parser.add_argument("--max_seq_length", type=int, required=True, help="tokens read per document")
    parser.add_argument("--train_file", required=True, help="JSON lines: text, label")
    parser.add_argument("--validation_file", required=True, help="the documents the accuracy is measured on")
    parser.add_argument("--features_dir", type=Path, required=True, help="cache shared by the seeds")
    parser.add_argument("--seed", type=int, required=True, help="draws the probe's training documents")
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--train_fraction", type=float, default=0.8, help="drawn per seed")
    parser.add_argument("--batch_size", type=int, default=8, help="documents per encoder forward")
    args = parser.parse_args(argv)
    if not 0 < args.train_fraction <= 1:
        parser.error(f"--train_fraction {args.train_fraction}: give a fraction in (0, 1], e.g. 0.8.")
    return probe(args)


if __name__ == "__main__":
    main()
