"""``--push_to_hub`` from the scripts, against the local hub (:mod:`tests.hub_server`), in fresh processes.

Each script trains a tiny model for a few steps and pushes it; what lands on the hub is checked: the package's
filled model card (metrics, data, attention and paper, how to load; ``trust_remote_code`` instructions and
the flat ``hfe_*.py`` files with ``--hub_remote_code``) and never ``Trainer``'s generic draft. A process in
which importing hf_efficient raises then loads each remote-code repo by id: the text model through the
fill-mask pipeline, the vision model's image processor through ``AutoImageProcessor`` and the
image-classification pipeline, the graph model through its Auto class.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from hf_efficient import EfficientViTConfig, EfficientViTImageProcessor

from ..hub_server import LocalHub, Repo
from ..processes import BLOCK_HF_EFFICIENT, run_python
from ..script_loader import CONFIGS, SCRIPTS
from .helpers import pretrain_args

RUN_SCRIPT = """
import runpy, sys
script, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
"""
# Several script runs, one after another, in one interpreter (argv[1]: a JSON list of [script, arguments]):
# each interpreter start imports torch, transformers and the hub client again, the larger part of a tiny run.
RUN_SCRIPTS = """
import json, runpy, sys
for script, args in json.loads(sys.argv[1]):
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
"""

LOAD_REMOTE = """
import json, sys
import numpy as np
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForTokenClassification, pipeline

out, *kinds = sys.argv[1:]
results = {}
for kind in kinds:
    repo_id, result = f"user/tiny-{kind}", {}
    if kind == "text":
        fill = pipeline("fill-mask", model=repo_id, trust_remote_code=True)
        result["predictions"] = len(fill("this movie was [MASK] ."))
        result["module"] = type(fill.model).__module__
    elif kind == "vision":
        processor = AutoImageProcessor.from_pretrained(repo_id, trust_remote_code=True)
        result["processor"] = [type(processor).__module__, type(processor).__name__]
        classify = pipeline("image-classification", model=repo_id, trust_remote_code=True)
        image = Image.fromarray(np.arange(20 * 30 * 3, dtype=np.uint8).reshape(20, 30, 3))  # RGB, any size
        result["labels"] = [p["label"] for p in classify(image, top_k=3)]
        result["module"] = type(classify.model).__module__
    else:
        model = AutoModelForTokenClassification.from_pretrained(repo_id, trust_remote_code=True)
        result["module"] = type(model).__module__
    results[kind] = result
results["hf_efficient_imported"] = any(name.split(".")[0] == "hf_efficient" for name in sys.modules)
json.dump(results, open(out, "w"))
"""

HUB_FLAGS = ["--push_to_hub", "--report_to", "none"]


def push_args(
    kind: str, data: dict, output_dir, repo_id: str, remote_code: bool = True
) -> tuple[str, list[str]]:
    """(script, arguments) training a tiny model of ``kind`` for a few steps and pushing it to ``repo_id``."""
    hub = [
        *HUB_FLAGS,
        "--hub_model_id",
        repo_id,
        "--seed",
        "0",
        *(["--hub_remote_code"] if remote_code else []),
    ]
    if kind == "text":
        args = pretrain_args(data, output_dir, "longformer", {"attention_window": 8}, "--max_steps", "2")
        return "pretrain_mlm", [*args, "--validation_split_percentage", "10", *hub]
    config = str(CONFIGS / kind / "base_tiny.json")
    common = [
        "--config",
        config,
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "2",
        "--save_strategy",
        "no",
    ]
    if kind == "vision":
        return "finetune_image_classification", [*common, "--dataset_name", "digits", *hub]
    return "train_graph", [*common, "--dataset_name", "karate", *hub]


def hub_file(hub: LocalHub, repo_id: str, name: str) -> str:
    return hub.repos[repo_id].tree("main")[1][name].decode()


@pytest.mark.slow  # two fresh interpreters: four runs that push, then three loads without hf_efficient
def test_scripts_push_the_filled_card_and_remote_code(data, tmp_path):
    """The four pushing runs share one interpreter and the three remote-code loads another (an interpreter
    each took 7 starts, most of the test's time); the hub client's environment is the same for all."""
    with LocalHub() as hub:
        runs = {kind: (kind, f"user/tiny-{kind}", True) for kind in ("text", "vision", "graph")}
        runs["plain"] = ("graph", "user/tiny-graph-plain", False)
        commands = []
        for name, (kind, repo_id, remote_code) in runs.items():
            script, args = push_args(kind, data, tmp_path / name, repo_id, remote_code)
            commands.append([str(SCRIPTS / f"{script}.py"), [str(arg) for arg in args]])
        env = hub.client_env(tmp_path / "hf_home_push")
        run_python(RUN_SCRIPTS, json.dumps(commands), env=env, cwd=tmp_path)
        files = {name: set(hub.repos[repo_id].tree("main")[1]) for name, (_, repo_id, _) in runs.items()}

        shipped = {
            "text": "hfe_models_text_modeling_efficient_bert.py",
            "vision": "hfe_models_vision_image_processing.py",
            "graph": "hfe_models_graph_modeling_efficient_graph.py",
        }
        for kind, python_file in shipped.items():
            assert {"README.md", "config.json", "model.safetensors", python_file} <= files[kind]
            card = hub_file(hub, f"user/tiny-{kind}", "README.md")
            assert "trust_remote_code=True" in card and "pip install hf_efficient" in card
            assert "unknown dataset" not in card and "## Attention" in card and "## How to load" in card
            assert f'"user/tiny-{kind}"' in card  # the load instructions name the pushed repo
        vision_card = hub_file(hub, "user/tiny-vision", "README.md")
        assert "| accuracy |" in vision_card and "pipeline_tag: image-classification" in vision_card
        processor = json.loads(hub_file(hub, "user/tiny-vision", "preprocessor_config.json"))
        assert processor["auto_map"]["AutoImageProcessor"].startswith("hfe_models_vision_image_processing.")

        plain_card = hub_file(hub, "user/tiny-graph-plain", "README.md")  # no python: how to install instead
        assert not {name for name in files["plain"] if name.endswith(".py")}
        assert "pip install hf_efficient" in plain_card and "trust_remote_code" not in plain_card
        assert "| accuracy |" in plain_card and "unknown dataset" not in plain_card

        out, kinds = tmp_path / "loaded.json", ("text", "vision", "graph")
        env = hub.client_env(tmp_path / "hf_home_load")
        run_python(BLOCK_HF_EFFICIENT + LOAD_REMOTE, out, *kinds, env=env, cwd=tmp_path)
        results = json.loads(out.read_text())
        assert results["hf_efficient_imported"] is False
        for kind in kinds:
            result = results[kind]
            assert result["module"].startswith("transformers_modules."), kind
            if kind == "text":
                assert result["predictions"] == 5
            elif kind == "vision":
                assert result["processor"][1] == "EfficientViTImageProcessor"
                assert result["processor"][0].startswith("transformers_modules.")
                assert len(result["labels"]) == 3 and set(result["labels"]) <= {str(d) for d in range(10)}


def vision_repo(hidden_sizes: dict[str, int], image_mean: float) -> Repo:
    """A hub repo with a tiny 8x8 grey EfficientViT config per commit (``{sha: hidden_size}``, the last one
    ``main``) and an image processor normalising with ``image_mean``."""
    repo = Repo()
    model = json.loads((CONFIGS / "vision" / "base_tiny.json").read_text())["model"]
    processor = EfficientViTImageProcessor(num_channels=1, image_mean=[image_mean], image_std=[0.5])
    for sha, hidden_size in hidden_sizes.items():
        config = EfficientViTConfig(**{**model, "hidden_size": hidden_size})
        repo.commits[sha] = {
            "config.json": config.to_json_string().encode(),
            "preprocessor_config.json": processor.to_json_string().encode(),
        }
        repo.main = sha
    return repo


@pytest.mark.slow  # a fresh interpreter, a local hub server
def test_config_and_image_processor_by_hub_id_honour_revision_and_cache_dir(tmp_path):
    """--config_name and --image_processor_name take hub ids, read at --model_revision into --cache_dir."""
    first, latest = (hashlib.sha1(name.encode()).hexdigest() for name in ("first", "latest"))
    with LocalHub() as hub:
        hub.repos["user/tiny-vit"] = vision_repo({first: 24, latest: 16}, image_mean=0.3)
        args = ["--config_name", "user/tiny-vit", "--image_processor_name", "user/tiny-vit"]
        args += ["--model_revision", first, "--cache_dir", str(tmp_path / "cache"), "--token", "hf_local"]
        args += ["--dataset_name", "digits", "--max_steps", "1", "--max_eval_samples", "8"]
        args += ["--output_dir", str(tmp_path / "run"), "--save_strategy", "no", *HUB_FLAGS[1:]]
        script = SCRIPTS / "finetune_image_classification.py"
        run_python(RUN_SCRIPT, script, *args, env=hub.client_env(tmp_path / "hf_home"), cwd=tmp_path)
        fetched = {path for method, path in hub.requests if "/resolve/" in path}
    assert json.loads((tmp_path / "run" / "config.json").read_text())["hidden_size"] == 24  # the first commit
    assert json.loads((tmp_path / "run" / "preprocessor_config.json").read_text())["image_mean"] == [0.3]
    assert {
        f"/user/tiny-vit/resolve/{first}/config.json",
        f"/user/tiny-vit/resolve/{first}/preprocessor_config.json",
    } <= fetched
    assert (tmp_path / "cache" / "models--user--tiny-vit").is_dir()


@pytest.mark.slow  # a fresh interpreter that trains and pushes twice
def test_a_run_that_saves_checkpoints_pushes_once_at_the_end(tmp_path):
    """transformers' default hub_strategy (every_save) pushes each checkpoint, without the card; ours pushes
    once, at the end, with it. --hub_strategy every_save gives transformers' pushes back. Both runs in one
    interpreter."""
    with LocalHub() as hub:
        commands = []
        for strategy, repo_id in (("end", "user/once"), ("every_save", "user/every-save")):
            script, args = push_args("graph", {}, tmp_path / strategy, repo_id, remote_code=False)
            args = [*args, "--save_strategy", "steps", "--save_steps", "1"]  # after push_args' "no"
            if strategy != "end":
                args += ["--hub_strategy", strategy]
            commands.append([str(SCRIPTS / f"{script}.py"), [str(arg) for arg in args]])
        run_python(RUN_SCRIPTS, json.dumps(commands), env=hub.client_env(tmp_path / "hf_home"), cwd=tmp_path)
        assert (tmp_path / "end" / "checkpoint-2").is_dir()  # it saved checkpoints, and pushed none
        assert len(hub.repos["user/once"].commits) == 2  # the repository's initial commit, then the run's
        assert "## How to load" in hub_file(hub, "user/once", "README.md")
        assert len(hub.repos["user/every-save"].commits) > 2  # upstream's pushes at each save as well
