"""Image datasets for the vision scripts, and the preprocessing they share.

Sources (``--dataset_name`` / ``--train_dir``):

- ``fashion_mnist``: Fashion-MNIST (Xiao et al. 2017; 60,000 train / 10,000 test, 28x28 grey, 10 classes),
  offline from the Debian package ``dataset-fashion-mnist``: ``apt-get download`` + ``dpkg -x`` into a cache
  folder (``~/.cache/hf_efficient/fashion-mnist``, or ``$HF_EFFICIENT_FASHION_MNIST_DIR``), never
  ``apt-get install``; the idx files are parsed with NumPy and cached as Arrow.
- ``digits``: scikit-learn's ``load_digits`` (1,797 8x8 grey digits; a fixed stratified 80/20 split, seed 42),
  a tiny real dataset for tests.
- an ``imagefolder`` directory (``--train_dir``, optional ``--validation_dir``: one sub-folder per class), a
  folder written by ``save_to_disk``, or a hub dataset name through ``datasets.load_dataset``.

Every source gives a ``DatasetDict`` with an image column (``datasets.Image``, PIL on access) and, for
classification, a ``ClassLabel`` column. :func:`with_image_transform` resizes and normalises on the fly with
the model's image processor (``image_size``, ``num_channels``), after an optional light augmentation
(random crop of a zero-padded image, horizontal flip: PIL and torch only, no torchvision).
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features
from filelock import FileLock
from PIL import Image, ImageOps

from ..errors import InputError, InputFileNotFoundError
from ..models.vision import EfficientViTImageProcessor
from .debian import fetch_debian_package
from .files import check_data_folder
from .inputs import label_values, say_image_conversions, say_label_task

FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_ENV = "HF_EFFICIENT_FASHION_MNIST_DIR"
FASHION_MNIST_HUB_ID = "zalando-datasets/fashion_mnist"  # the same data on the hub (model card metadata)
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
_FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
DIGITS_SPLIT_SEED = 42
DIGITS_TEST_FRACTION = 0.2
OFFLINE_DATASETS = ("fashion_mnist", "digits")
EVAL_SPLITS = ("validation", "test")  # the first one a dataset has is evaluated
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an idx file (MNIST's format; ``.gz`` or not): 2 zero bytes, a dtype code, the number of dims,
    one big-endian int32 per dim, then the values."""
    path = Path(path)
    raw = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in _IDX_DTYPES:
        raise InputError(f"{path} is not an idx file (magic bytes {raw[:4].hex()}).")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    return np.frombuffer(raw, _IDX_DTYPES[raw[2]], offset=4 + 4 * ndim).reshape(shape)


def _find_idx_files(root: Path) -> Path | None:
    """The folder under ``root`` holding the four Fashion-MNIST idx files (``.gz`` or not), if any."""
    for candidate in sorted(root.rglob("train-images-idx3-ubyte*")) if root.is_dir() else []:
        folder = candidate.parent
        if all(_idx_path(folder, name) for files in _FASHION_MNIST_FILES.values() for name in files):
            return folder
    return None


def _idx_path(folder: Path, name: str) -> Path | None:
    return next((folder / f for f in (f"{name}.gz", name) if (folder / f).exists()), None)


def fashion_mnist_cache(cache_dir: str | Path | None = None) -> Path:
    """The cache: ``cache_dir``, else ``$HF_EFFICIENT_FASHION_MNIST_DIR``, else ~/.cache/hf_efficient."""
    default = Path.home() / ".cache" / "hf_efficient" / "fashion-mnist"
    return Path(cache_dir or os.environ.get(FASHION_MNIST_ENV) or default).expanduser()


def fashion_mnist_dir(cache_dir: str | Path | None = None) -> Path:
    """The folder with Fashion-MNIST's idx files, fetching the Debian package into the cache on first use.

    Args:
        cache_dir: where to look and unpack; default ``$HF_EFFICIENT_FASHION_MNIST_DIR`` or
            ``~/.cache/hf_efficient/fashion-mnist``.
    """
    root = fashion_mnist_cache(cache_dir)
    found = _find_idx_files(root)
    if found is None:
        hint = (
            "Or put the four idx .gz files of https://github.com/zalandoresearch/fashion-mnist anywhere "
            f"under {root}."
        )
        fetch_debian_package(FASHION_MNIST_PACKAGE, root, hint)
        found = _find_idx_files(root)
    if found is None:
        raise InputFileNotFoundError(f"No Fashion-MNIST idx files under {root} after unpacking the package.")
    return found


def images_to_dataset(images: np.ndarray, labels: np.ndarray, class_names: list[str]) -> Dataset:
    """(n, H, W) uint8 grey images, (n,) int labels -> a ``Dataset`` of PNG-encoded ``image`` + ``label``."""

    def png(image: np.ndarray) -> dict:
        buffer = io.BytesIO()
        Image.fromarray(image, mode="L").save(buffer, format="PNG")
        return {"bytes": buffer.getvalue(), "path": None}

    features = Features({"image": datasets.Image(), "label": ClassLabel(names=class_names)})
    return Dataset.from_dict(
        {"image": [png(image) for image in images], "label": labels.astype(np.int64).tolist()},
        features=features,
    )


def load_fashion_mnist(cache_dir: str | Path | None = None) -> DatasetDict:
    """Fashion-MNIST, offline: ``train`` (60,000) and ``test`` (10,000) with ``image`` (28x28, PIL mode L)
    and ``label`` (ClassLabel of the 10 class names). The first call fetches and converts (about 15 s)."""
    root = fashion_mnist_cache(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    # Runs (or test workers) started together: one fetches and converts, the others wait and load.
    with FileLock(str(root / "convert.lock")):
        return _load_fashion_mnist(root / "arrow", cache_dir)


def _load_fashion_mnist(cached: Path, cache_dir: str | Path | None) -> DatasetDict:
    if (cached / "dataset_dict.json").exists():
        return datasets.load_from_disk(str(cached))
    folder = fashion_mnist_dir(cache_dir)
    splits = DatasetDict(
        {
            split: images_to_dataset(
                read_idx(_idx_path(folder, images)),
                read_idx(_idx_path(folder, labels)),
                FASHION_MNIST_CLASSES,
            )
            for split, (images, labels) in _FASHION_MNIST_FILES.items()
        }
    )
    splits.save_to_disk(str(cached))
    return splits


def load_digits_dataset(
    test_fraction: float = DIGITS_TEST_FRACTION, seed: int = DIGITS_SPLIT_SEED
) -> DatasetDict:
    """scikit-learn's 1,797 8x8 digits as ``train`` / ``test`` (stratified, fixed seed); pixels 0-16 ->
    0-255."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8)
    full = images_to_dataset(images, digits.target, [str(d) for d in range(10)])
    split = full.train_test_split(test_size=test_fraction, seed=seed, stratify_by_column="label")
    return DatasetDict(train=split["train"], test=split["test"])


@dataclass
class ImageDataArguments:
    """The data flags both vision scripts share."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "fashion_mnist (offline, Debian package), digits (scikit-learn), a hub dataset or a "
            "save_to_disk folder."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The hub dataset's config."})
    train_dir: str | None = field(default=None, metadata={"help": "imagefolder: one sub-folder per class."})
    validation_dir: str | None = field(default=None, metadata={"help": "imagefolder to evaluate on."})
    image_column_name: str = field(default="image", metadata={"help": "Column holding the images."})
    label_column_name: str = field(default="label", metadata={"help": "Column holding the class labels."})
    validation_split_percentage: float = field(
        default=10.0, metadata={"help": "Percent of train held out when there is no validation/test split."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Only the first N train images."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Only the first N eval images."})
    augment: bool = field(
        default=False,
        metadata={
            "help": "Random crop (zero padding of a tenth of the side) and left-right flip in training."
        },
    )
    data_cache_dir: str | None = field(
        default=None, metadata={"help": f"Fashion-MNIST cache (default ${FASHION_MNIST_ENV} or ~/.cache)."}
    )


def load_image_datasets(args: ImageDataArguments) -> DatasetDict:
    """The ``DatasetDict`` named by ``args`` (see the module docstring for the sources)."""
    if (args.dataset_name is None) == (args.train_dir is None):
        raise InputError(
            "Give exactly one image dataset: --dataset_name (fashion_mnist, digits, a hub dataset or a "
            "save_to_disk folder) or --train_dir (an imagefolder)."
        )
    name = args.dataset_name
    if args.train_dir is not None:
        check_data_folder("--train_dir", args.train_dir)
        files = {"train": str(Path(args.train_dir) / "**")}
        if args.validation_dir:
            check_data_folder("--validation_dir", args.validation_dir)
            files["validation"] = str(Path(args.validation_dir) / "**")
        return datasets.load_dataset("imagefolder", data_files=files)
    if name == "fashion_mnist":
        return load_fashion_mnist(args.data_cache_dir)
    if name == "digits":
        return load_digits_dataset()
    if Path(name).is_dir() and (Path(name) / "dataset_dict.json").exists():
        return datasets.load_from_disk(name)
    try:
        loaded = datasets.load_dataset(name, args.dataset_config_name)
    except (FileNotFoundError, ConnectionError, ValueError) as error:
        raise InputError(
            f"Unknown dataset {name!r}: not one of the offline datasets ({', '.join(OFFLINE_DATASETS)}), "
            f"not a save_to_disk folder, and the hub could not provide it ({type(error).__name__}: {error}). "
            "Use --train_dir for an imagefolder."
        ) from error
    return loaded if isinstance(loaded, DatasetDict) else DatasetDict(train=loaded)


def check_image_columns(dataset: Dataset, image_column: str, label_column: str | None = None) -> None:
    """Raise a clear error when the image (or label) column is missing, listing the columns there are."""
    for column, flag in ((image_column, "--image_column_name"), (label_column, "--label_column_name")):
        if column is not None and column not in dataset.column_names:
            kind = "image" if column == image_column else "label"
            raise InputError(
                f"The dataset has no {kind} column {column!r}. Its columns are {dataset.column_names}; name "
                f"the {kind} column with {flag}."
            )


@dataclass
class ImageSplits:
    """What the scripts train and evaluate on."""

    train: Dataset
    eval: Dataset | None
    eval_split: str | None
    label_names: list[str] | None
    source: str
    hub_id: str | None


def load_image_splits(args: ImageDataArguments, seed: int, with_labels: bool = True) -> ImageSplits:
    """Train and evaluation splits with checked columns; labels as a ``ClassLabel`` (strings or ints are
    encoded); evaluation on ``validation``, else ``test``, else ``validation_split_percentage`` of train."""
    data = load_image_datasets(args)
    label_column = args.label_column_name if with_labels else None
    if "train" not in data:
        raise InputError(f"The dataset has splits {list(data)}, but no 'train' split.")
    check_image_columns(data["train"], args.image_column_name, label_column)
    label_names = None
    if label_column is not None:
        if not isinstance(data["train"].features[label_column], ClassLabel):
            data = data.class_encode_column(label_column)
        label_names = list(data["train"].features[label_column].names)
        holds = label_values((), label_names)
        say_label_task(
            args.dataset_name or args.train_dir, label_column, holds, f"a {len(label_names)}-class classifier"
        )
    eval_split = next((split for split in EVAL_SPLITS if split in data), None)
    train, evaluation = data["train"], data[eval_split] if eval_split else None
    if evaluation is None and args.validation_split_percentage > 0:
        stratify = label_column if label_column is not None else None
        try:
            held = train.train_test_split(
                test_size=args.validation_split_percentage / 100, seed=seed, stratify_by_column=stratify
            )
        except ValueError as error:  # too few images to hold some of every class out (datasets' stratify)
            raise InputError(
                f"--validation_split_percentage {args.validation_split_percentage:g} of the {len(train)} "
                f"training images cannot be held out with every class in both parts ({error}): give more "
                "images, a larger percentage, or --validation_dir."
            ) from None
        train, evaluation = held["train"], held["test"]
        eval_split = f"{args.validation_split_percentage:g}% of train"
    if args.max_train_samples is not None:
        train = train.select(range(min(args.max_train_samples, len(train))))
    if evaluation is not None and args.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(args.max_eval_samples, len(evaluation))))
    source = args.dataset_name or args.train_dir
    hub_id = FASHION_MNIST_HUB_ID if source == "fashion_mnist" else None
    if hub_id is None and args.train_dir is None and source not in OFFLINE_DATASETS:
        hub_id = None if Path(source).exists() else source
    return ImageSplits(train, evaluation, eval_split, label_names, source, hub_id)


def describe_images(splits: ImageSplits, config, augment: bool = False) -> str:
    """The model card's data line: source, size, classes, preprocessing."""
    names = splits.label_names
    classes = f" ({len(names)} classes: {', '.join(names)})" if names else ""
    size = f"{config.image_size}x{config.image_size}"
    return (
        f"`{splits.source}`: {len(splits.train):,} training images{classes}, resized to {size} with "
        f"{config.num_channels} channel(s){', randomly cropped and flipped' if augment else ''}."
    )


def image_processor_for(
    config, name_or_path: str | None = None, processor_name: str | None = None, **hub_kwargs
) -> EfficientViTImageProcessor:
    """The image processor of a model, giving ``config.image_size`` square images converted to
    ``config.num_channels``, with the preprocessing (resize, crop, mean, std, resampling) of:

    - ``processor_name`` (``--image_processor_name``: a folder or hub id with a ``preprocessor_config.json``);
      one that cannot be loaded raises;
    - else the checkpoint ``name_or_path``'s saved processor, when it has one;
    - else the model's family's (:meth:`EfficientViTImageProcessor.for_config`: ViT's 0.5 per channel, DeiT's
      and DINOv2's resize, center crop and ImageNet statistics).

    A loaded processor that center-crops to the image size (DeiT's and DINOv2's checkpoints) keeps its
    resize and crop; any other resizes to the image size, without a crop.
    """
    for source, required in ((processor_name, True), (name_or_path, False)):
        if source is None:
            continue
        try:
            processor = EfficientViTImageProcessor.from_pretrained(
                source, num_channels=config.num_channels, **hub_kwargs
            )
        except OSError:  # no preprocessor_config.json (a checkpoint saved without its processor)
            if required:
                raise
            continue
        side = config.image_size
        crop = processor.crop_size
        if not (processor.do_center_crop and crop is not None and (crop.height, crop.width) == (side, side)):
            processor.size, processor.do_center_crop = {"height": side, "width": side}, False
        return processor
    return EfficientViTImageProcessor.for_config(config)


def random_crop_flip(image: Image.Image, padding_fraction: float = 0.1) -> Image.Image:
    """Light augmentation: pad by ``padding_fraction`` of each side with zeros, crop a random window of the
    original size, flip left-right with probability 1/2 (torch's global RNG, so ``set_seed`` governs it)."""
    width, height = image.size
    pad_w, pad_h = max(1, round(width * padding_fraction)), max(1, round(height * padding_fraction))
    padded = ImageOps.expand(image, border=(pad_w, pad_h, pad_w, pad_h), fill=0)
    left = int(torch.randint(0, 2 * pad_w + 1, ()))
    top = int(torch.randint(0, 2 * pad_h + 1, ()))
    image = padded.crop((left, top, left + width, top + height))
    return ImageOps.mirror(image) if torch.rand(()) < 0.5 else image


def _to_pil(image) -> Image.Image:
    return image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))


def image_transform(
    processor: EfficientViTImageProcessor,
    image_column: str = "image",
    label_column: str | None = "label",
    augment: bool = False,
) -> Callable[[dict], dict]:
    """A ``Dataset.with_transform`` function: a batch of rows -> ``pixel_values`` (b, C, H, W) at the
    model's size (and ``labels``), augmenting first when asked."""

    def transform(batch: dict) -> dict:
        images = [_to_pil(image) for image in batch[image_column]]
        if augment:
            images = [random_crop_flip(image) for image in images]
        result = {"pixel_values": processor(images, return_tensors="pt")["pixel_values"]}
        if label_column is not None:
            result["labels"] = torch.as_tensor(batch[label_column])
        return result

    return transform


def transformed_splits(
    splits: ImageSplits,
    processor: EfficientViTImageProcessor,
    image_column: str = "image",
    label_column: str | None = "label",
    augment: bool = False,
) -> tuple[Dataset, Dataset | None]:
    """(training, evaluation) images of ``splits`` as the model reads them (:func:`with_image_transform`;
    training ones augmented with ``augment``), after saying in one line per split the modes and sizes that
    the processor converts (:func:`~hf_efficient.data.inputs.say_image_conversions`, which also names an
    image file that is no image)."""
    mode = {1: "L", 3: "RGB"}.get(processor.num_channels, f"{processor.num_channels} channels")
    # the images' final size: the crop's where the processor resizes a shortest edge and then crops (DeiT's,
    # DINOv2's), else the resize's
    final = processor.crop_size if processor.do_center_crop and processor.crop_size else processor.size
    size = (final["width"], final["height"])
    for name, images in (("training", splits.train), (splits.eval_split, splits.eval)):
        if images is not None:
            say_image_conversions(images, image_column, f"{splits.source} ({name} images)", mode, size)
    train = with_image_transform(splits.train, processor, image_column, label_column, augment)
    return train, with_image_transform(splits.eval, processor, image_column, label_column)


def with_image_transform(
    dataset: Dataset | None,
    processor: EfficientViTImageProcessor,
    image_column: str = "image",
    label_column: str | None = "label",
    augment: bool = False,
) -> Dataset | None:
    """``dataset`` preprocessed on access by :func:`image_transform` (``None`` passes through). Trainer must
    keep the image column (``remove_unused_columns=False``); ``default_data_collator`` stacks the rows."""
    if dataset is None:
        return None
    return dataset.with_transform(image_transform(processor, image_column, label_column, augment))
