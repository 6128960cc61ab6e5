"""Config files: every shipped file is valid, merge order is base -> attention override -> command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import HfArgumentParser

import hf_efficient
from hf_efficient import EfficientBertConfig, validate_attention_config
from hf_efficient.training import (
    ConfigArguments,
    LanguageModelArguments,
    merge_model_configs,
    parse_args_with_config_files,
)

from ..attention.helpers import script_settings
from ..script_loader import CONFIGS, load_script
from .helpers import script_dataclasses


def parse(module, args):
    parser = HfArgumentParser(script_dataclasses(module))
    return parse_args_with_config_files(parser, EfficientBertConfig, None, args)


def test_every_text_setting_of_a_core_is_valid():
    """What the text scripts set per type (each core's script_configs["text"]): valid attention_configs of
    that type; every text type but the two without hyperparameters to size has one."""
    settings = script_settings("text")
    assert set(hf_efficient.list_attention_types("text")) - set(settings) == {"full", "linear"}
    for name, entry in settings.items():
        assert set(entry) == {"attention_config"} or "training" in entry
        validate_attention_config(name, entry["attention_config"])  # unknown keys / bad values raise


def test_every_causal_attention_type_gives_a_valid_clm_config(pretrain_clm, tmp_path):
    """configs/clm: settings for types with a causal form only, and every such type gives a valid decoder
    config on the CLM base file (Longformer without global tokens)."""
    assert set(script_settings("clm")) <= set(hf_efficient.causal_attention_types("text"))
    base = str(CONFIGS / "clm" / "base.json")
    for name in hf_efficient.causal_attention_types("text"):
        (_, data_args, _, training), model = parse(
            pretrain_clm, ["--config", base, "--attention_type", name, "--output_dir", str(tmp_path)]
        )
        config = EfficientBertConfig(**model)
        assert config.is_decoder and config.attention_type == name
        assert data_args.block_size <= config.max_position_embeddings


@pytest.mark.parametrize("size", ["base_tiny", "base_small", "base_bert"])
def test_base_configs_build_a_model_config_and_training_arguments(pretrain_mlm, tmp_path, size):
    base = str(CONFIGS / "text" / f"{size}.json")
    (model_args, data_args, _, training), model = parse(
        pretrain_mlm, ["--config", base, "--output_dir", str(tmp_path)]
    )
    config = EfficientBertConfig(**model)
    assert config.attention_type == "full" and data_args.block_size <= config.max_position_embeddings
    assert training.learning_rate == json.loads(Path(base).read_text())["training"]["learning_rate"]


def test_merge_order_base_then_attention_then_command_line(pretrain_mlm, tmp_path):
    args = ["--config", str(CONFIGS / "text" / "base_tiny.json"), "--attention_type", "longformer"]
    args += ["--attention_config", '{"attention_window": 32}', "--config_overrides", "num_hidden_layers=3"]
    args += ["--learning_rate", "0.1", "--output_dir", str(tmp_path)]
    (model_args, data_args, _, training), model = parse(pretrain_mlm, args)
    assert model["hidden_size"] == 128  # base
    assert model["attention_config"] == {
        "attention_window": 32,
        "global_token_indices": [0],
    }  # override + CLI
    assert model["num_hidden_layers"] == 3 and training.learning_rate == 0.1  # command line last
    assert data_args.block_size == 128 and training.max_steps == 1000  # base training section
    performer = parse(
        pretrain_mlm, ["--config", args[1], "--attention_type", "performer", "--output_dir", "x"]
    )
    assert performer[0][0].random_state_redraw_steps == 1000  # the override's training section
    assert performer[1]["attention_config"] == {"num_features": 128}


def test_default_attention_folder_applies_without_a_base(pretrain_mlm):
    parser = HfArgumentParser((LanguageModelArguments, pretrain_mlm.DataArguments, ConfigArguments))
    _, model = parse_args_with_config_files(
        parser, EfficientBertConfig, pretrain_mlm.ATTENTION_CONFIGS, ["--attention_type", "bigbird"]
    )
    assert model["attention_config"]["block_size"] == 32
    _, model = parse_args_with_config_files(parser, EfficientBertConfig, pretrain_mlm.ATTENTION_CONFIGS, [])
    assert model == {}  # nothing asked, nothing changed: a checkpoint keeps its own attention


def test_a_base_file_keeps_the_hyperparameters_it_sets_for_its_own_type(pretrain_mlm, tmp_path):
    """The type file beside a base (attention/longformer.json: window 128) gives that type's defaults; a base
    file naming its type and a window keeps its window (the demo's config once trained at the type file's)."""
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "longformer.json").write_text(
        json.dumps({"model": {"attention_config": {"attention_window": 128, "global_token_indices": [0]}}})
    )
    base = {"model": {"attention_type": "longformer", "attention_config": {"attention_window": 32}}}
    (tmp_path / "base.json").write_text(json.dumps(base))
    _, model = parse(pretrain_mlm, ["--config", str(tmp_path / "base.json"), "--output_dir", str(tmp_path)])
    assert model["attention_config"] == {"attention_window": 32, "global_token_indices": [0]}
    _, model = parse(
        pretrain_mlm,
        ["--config", str(tmp_path / "base.json"), "--attention_config", '{"attention_window": 16}']
        + ["--output_dir", str(tmp_path)],
    )
    assert model["attention_config"]["attention_window"] == 16  # the command line still wins


def test_changing_the_type_drops_the_old_hyperparameters():
    base = {"attention_type": "longformer", "attention_config": {"attention_window": 8}}
    assert merge_model_configs(base, {"attention_type": "performer"}) == {"attention_type": "performer"}
    merged = merge_model_configs(base, {"attention_config": {"global_token_indices": [0]}})
    assert merged["attention_config"] == {"attention_window": 8, "global_token_indices": [0]}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"model": {"hiden_size": 8}}, r"unknown model key 'hiden_size'.*hidden_size"),
        ({"training": {"learning_rte": 1.0}}, r"unknown training key 'learning_rte'.*learning_rate"),
        ({"modle": {}}, "unknown section key 'modle'"),
    ],
)
def test_unknown_keys_raise(pretrain_mlm, tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        parse(pretrain_mlm, ["--config", str(path), "--output_dir", str(tmp_path)])


def test_unknown_command_line_override_raises(pretrain_mlm, tmp_path):
    with pytest.raises(ValueError, match="unknown model key 'layers'"):
        parse(pretrain_mlm, ["--config_overrides", "layers=2", "--output_dir", str(tmp_path)])


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    ddp = load_config_from_file(str(CONFIGS / "accelerate" / "ddp_cpu_2proc.yaml"))
    assert ddp.distributed_type == "MULTI_GPU" and ddp.num_processes == 2
    fsdp = load_config_from_file(str(CONFIGS / "accelerate" / "fsdp.yaml"))
    assert fsdp.distributed_type == "FSDP"
    assert fsdp.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "EfficientLayer"


@pytest.mark.parametrize("name", ["pretrain_mlm", "finetune_glue"])
def test_script_help_renders(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script(name).main(["--help"])
    assert exit_info.value.code == 0 and "--attention_type" in capsys.readouterr().out
