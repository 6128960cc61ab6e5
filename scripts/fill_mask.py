"""Fill in masked words with a trained EfficientBert (or any masked-LM checkpoint) through ``pipeline``.

    python scripts/fill_mask.py --model runs/mlm-tiny-longformer "this movie was [MASK] ."
    python scripts/fill_mask.py --model runs/mlm-tiny-longformer --top_k 3 "a [MASK] film ." "it was [MASK] ."

Each text must hold the tokenizer's mask token (``[MASK]`` for BERT-style tokenizers). Prints the top
predictions with their probabilities, one block per text.
"""

from __future__ import annotations

import argparse

from transformers import pipeline

import hf_efficient  # noqa: F401  (registers the efficient_bert Auto classes)
from hf_efficient.cli import run_script
from hf_efficient.data.inputs import check_saved_tokenizer
from hf_efficient.errors import InputError
from hf_efficient.modeling.checkpoint_files import check_pretrained_path


def fill_mask(model: str, texts: list[str], top_k: int = 5) -> list[list[dict]]:
    """The pipeline's predictions per text: ``[[{"token_str", "score", "sequence", ...}, ...], ...]``."""
    check_pretrained_path(
        model, "--model", holds="config.json"
    )  # a missing folder, said as such (not as a hub lookup error)
    if top_k < 1:
        raise InputError(f"--top_k must be >= 1 (the number of predictions per mask), got {top_k}.")
    tokenizer = check_saved_tokenizer(model, "--model", texts, needs=("mask_token",))
    if tokenizer is None:
        raise InputError(
            f"--model {model} holds no tokenizer (tokenizer.json, or vocab.txt with tokenizer_config.json): "
            "save the model's tokenizer beside it (tokenizer.save_pretrained)."
        )
    for text in texts:
        if tokenizer.mask_token not in text:
            raise InputError(
                f"{text!r} holds no mask token; write {tokenizer.mask_token} where a word should be "
                "predicted."
            )
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=top_k)
    return [fill(text) for text in texts]


def main(args: list[str] | None = None) -> list[list[dict]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="a folder saved by pretrain_mlm.py, or a hub id")
    parser.add_argument("--top_k", type=int, default=5)
    parser.add_argument("texts", nargs="+", help="sentences with a mask token")
    parsed = parser.parse_args(args)
    results = fill_mask(parsed.model, parsed.texts, parsed.top_k)
    for text, predictions in zip(parsed.texts, results, strict=True):
        print(f"fill-mask: {text}")
        for prediction in predictions:
            print(f"  {prediction['score']:.3f}  {prediction['token_str']}")
    return results


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
