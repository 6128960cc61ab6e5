"""Run a serving folder written by ``scripts/export.py`` in ONNX Runtime and print one JSON line per input.

    python scripts/serve_onnx.py --model_dir runs/serving "a fine film" "a dull one"
    python scripts/serve_onnx.py --model_dir runs/serving-vit --images cat.png dog.png
    python scripts/serve_onnx.py --model_dir runs/serving-graph --graphs molecules.jsonl

Texts go through the tokenizer saved beside the model, images through its image processor, graphs (JSON
lines of records with the structural columns the model reads) through its collator; PyTorch is not used to
compute. Classifiers print the label and its probability (per token / node for token and node
classification), masked-LM models the best token at each mask, bare encoders the pooled embedding.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hf_efficient.cli import run_script
from hf_efficient.data.inputs import check_saved_tokenizer
from hf_efficient.onnx_runtime import OnnxRuntimeModel


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def describe(model: OnnxRuntimeModel, inputs: dict, outputs: dict) -> list[dict]:
    """One dict per batch row: what the outputs say (see the module docstring)."""
    config = model.config()
    architecture = (config.architectures or [""])[0]
    if "logits" not in outputs:
        pooled = outputs.get("pooler_output", outputs["last_hidden_state"][:, 0])
        return [{"embedding": row.round(6).tolist()} for row in pooled]
    probs = softmax(outputs["logits"])
    if probs.ndim == 2:  # (b, C): one prediction per text / image / graph
        return [{"label": config.id2label[int(p.argmax())], "score": round(float(p.max()), 6)} for p in probs]
    real = inputs.get("attention_mask", inputs.get("node_mask"))
    if architecture.endswith("ForMaskedLM"):
        from hf_efficient.modeling.checkpoint_files import load_tokenizer

        tokenizer = load_tokenizer(model.folder)
        masked = inputs["input_ids"] == tokenizer.mask_token_id
        return [
            {"masks": tokenizer.convert_ids_to_tokens([int(p.argmax()) for p in row[where]])}
            for row, where in zip(probs, masked, strict=True)
        ]
    return [  # (b, n, C): one label per real token / node
        {"labels": [config.id2label[int(p.argmax())] for p in row[np.asarray(keep, dtype=bool)]]}
        for row, keep in zip(probs, real, strict=True)
    ]


def main(args: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_dir", required=True, help="a folder written by scripts/export.py")
    parser.add_argument("--images", nargs="+", help="image files (vision models)")
    parser.add_argument("--graphs", help="a JSON-lines file of graph records (graph models)")
    parser.add_argument("--threads", type=int, help="ONNX Runtime threads (default: every core)")
    parser.add_argument("texts", nargs="*", help="texts (text models)")
    parsed = parser.parse_args(args)
    if sum(map(bool, (parsed.texts, parsed.images, parsed.graphs))) != 1:
        parser.error("give texts, --images or --graphs (one kind of input).")
    if parsed.texts and Path(parsed.model_dir).is_dir():  # before the session: another tokenizer serves [UNK]
        check_saved_tokenizer(parsed.model_dir, "--model_dir", parsed.texts)
    model = OnnxRuntimeModel(parsed.model_dir, threads=parsed.threads)
    if parsed.texts:
        labels, inputs = parsed.texts, model.encode_texts(parsed.texts)
    elif parsed.images:
        from PIL import Image

        labels = parsed.images
        inputs = model.encode_images([Image.open(path) for path in parsed.images])
    else:
        lines = Path(parsed.graphs).read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        labels, inputs = (
            [f"{parsed.graphs}:{i + 1}" for i in range(len(records))],
            model.collate_graphs(records),
        )
    results = [
        {"input": label, **result}
        for label, result in zip(labels, describe(model, inputs, model.run(**inputs)), strict=True)
    ]
    for result in results:
        print(json.dumps(result))
    return results


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
