"""Remote code and push_to_hub, end to end, in fresh processes.

- ``export_remote_code`` writes a flat folder that ``trust_remote_code=True`` loads in a process where
  importing hf_efficient raises; outputs equal the original model's exactly (eval mode), for the MLM class and
  for ``AutoModel`` on the same checkpoint.
- ``register_for_auto_class`` + ``push_to_hub`` (and ``save_pretrained(push_to_hub=True)``) upload that folder
  to a hub of our own on 127.0.0.1 (:mod:`tests.hub_server`); a fresh process without hf_efficient loads it
  back by repo id. A plain push ships no python and loads back with hf_efficient imported.

Not covered: real authentication (the local hub accepts any token), LFS/Xet transfers (the local hub answers
"regular" upload mode, so files travel inline in the commit), the real hub's rate limits and redirects.
"""

from __future__ import annotations

import json

import pytest
import torch

from hf_efficient import EfficientBertForMaskedLM, EfficientBertForSequenceClassification
from hf_efficient.hub import export_remote_code

from .hub_server import LocalHub
from .models.text.helpers import tiny_config
from .processes import BLOCK_HF_EFFICIENT, run_python

# Loads every source given (a folder or a repo id) with the MLM Auto class and AutoModel, runs the inputs.
LOAD_AND_RUN = """
import sys
import torch
from transformers import AutoModel, AutoModelForMaskedLM

torch.set_num_threads(1)
inputs_path, out_path, trust, *sources = sys.argv[1:]
inputs = torch.load(inputs_path)
results = {}
for source in sources:
    kwargs = {"trust_remote_code": True} if trust == "trust" else {}
    with torch.no_grad():
        mlm = AutoModelForMaskedLM.from_pretrained(source, **kwargs).eval()
        base = AutoModel.from_pretrained(source, **kwargs).eval()
        results[source] = {
            "logits": mlm(**inputs).logits,
            "hidden": base(**inputs).last_hidden_state,
            "classes": [type(mlm).__module__, type(base).__module__, type(mlm.config).__module__],
        }
results["hf_efficient_imported"] = any(name.split(".")[0] == "hf_efficient" for name in sys.modules)
torch.save(results, out_path)
"""

# Appended in the folder test: transformers registered the loaded remote class for its Auto class, so saving
# it again goes through the flat copy of our save_pretrained and must give a loadable folder too.
RESAVE_AND_RUN = """
resaved = out_path + ".resaved"
mlm.save_pretrained(resaved)
resaved_mlm = AutoModelForMaskedLM.from_pretrained(resaved, trust_remote_code=True).eval()
with torch.no_grad():
    results["resaved"] = resaved_mlm(**inputs).logits
torch.save(results, out_path)
"""

PUSH = """
import sys
from hf_efficient import EfficientBertForMaskedLM

folder, scratch = sys.argv[1:]
model = EfficientBertForMaskedLM.from_pretrained(folder).eval()
model.push_to_hub("user/tiny-efficient-bert-plain")  # not registered: no python files
model.register_for_auto_class("AutoModelForMaskedLM")
model.push_to_hub("user/tiny-efficient-bert")
model.save_pretrained(scratch, push_to_hub=True, repo_id="user/tiny-efficient-bert-saved")
"""
# The pushing interpreter then loads the plain repo by id (hf_efficient is imported there, as it must be for
# a repo without remote code): LOAD_AND_RUN on the arguments after PUSH's two.
PUSH_THEN_LOAD = (
    PUSH.replace("folder, scratch = sys.argv[1:]", "folder, scratch = sys.argv[1:3]\nsys.argv[1:3] = []")
    + LOAD_AND_RUN
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A tiny MLM mixing Performer (random-feature buffer) and Longformer layers, saved without remote code,
    plus inputs with padding and the outputs every loaded copy must reproduce."""
    torch.manual_seed(0)
    config = tiny_config(
        "performer",
        vocab_size=97,
        attention_config={"num_features": 16},
        layer_attention_types=["performer", "longformer"],
        layer_attention_configs={"longformer": {"attention_window": 4, "global_token_indices": [0]}},
    )
    model = EfficientBertForMaskedLM(config).eval()
    folder = tmp_path_factory.mktemp("plain")
    model.save_pretrained(folder)
    input_ids = torch.randint(1, config.vocab_size, (2, 13))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    torch.save(inputs, folder / "inputs.pt")
    with torch.no_grad():
        expected = {"logits": model(**inputs).logits, "hidden": model.bert(**inputs).last_hidden_state}
    return model, folder, expected


def assert_identical(result: dict, expected: dict) -> None:
    torch.testing.assert_close(result["logits"], expected["logits"], rtol=0, atol=0)
    torch.testing.assert_close(result["hidden"], expected["hidden"], rtol=0, atol=0)


@pytest.mark.slow  # a fresh interpreter
def test_exported_folder_loads_without_hf_efficient(reference, tmp_path):
    model, plain, expected = reference
    folder = tmp_path / "remote"
    model.save_pretrained(folder)
    written = export_remote_code(model, folder)

    assert "hfe_attention_performer.py" in written and "hfe_attention_longformer.py" in written
    assert not hasattr(model.config, "auto_map")  # written to config.json only
    out = tmp_path / "out.pt"
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    script = BLOCK_HF_EFFICIENT + LOAD_AND_RUN + RESAVE_AND_RUN
    run_python(script, plain / "inputs.pt", out, "trust", folder, env=env, cwd=tmp_path)

    results = torch.load(out)
    assert results["hf_efficient_imported"] is False
    assert all(module.startswith("transformers_modules.") for module in results[str(folder)]["classes"])
    assert_identical(results[str(folder)], expected)
    torch.testing.assert_close(results["resaved"], expected["logits"], rtol=0, atol=0)


@pytest.mark.parametrize("registered", ["model", "config"])
def test_register_for_auto_class_save_writes_the_same_folder(reference, tmp_path, registered):
    model, _, _ = reference
    export_remote_code(model, tmp_path / "exported")
    registered_class = type(model) if registered == "model" else type(model.config)
    registered_class.register_for_auto_class(
        "AutoModelForMaskedLM" if registered == "model" else "AutoConfig"
    )
    try:
        model.save_pretrained(tmp_path / "registered")
    finally:
        del registered_class._auto_class  # back to the inherited None for the other tests
    python = sorted(path.name for path in (tmp_path / "exported").glob("*.py"))
    assert python == sorted(path.name for path in (tmp_path / "registered").glob("*.py"))
    assert (tmp_path / "registered" / "model.safetensors").exists()
    for name in [*python, "config.json"]:
        assert (tmp_path / "exported" / name).read_text() == (tmp_path / "registered" / name).read_text()


def test_a_model_loaded_from_a_remote_code_folder_saves_the_code_its_auto_map_names(reference, tmp_path):
    """A classifier fine-tuned from a checkpoint that ships remote code (a zoo folder) keeps its auto_map:
    the folder it is saved to must hold every file that auto_map names (issue 57: a fine-tuned zoo model
    failed with trust_remote_code, "does not appear to have a file named hfe_...")."""
    model, _, _ = reference
    model.save_pretrained(tmp_path / "zoo")
    export_remote_code(model, tmp_path / "zoo")  # the code beside the weights, as a zoo folder holds it
    tuned = EfficientBertForSequenceClassification.from_pretrained(tmp_path / "zoo", num_labels=3)
    tuned.save_pretrained(tmp_path / "tuned")  # no register_for_auto_class, no --hub_remote_code
    auto_map = json.loads((tmp_path / "tuned" / "config.json").read_text())["auto_map"]
    assert "AutoModelForSequenceClassification" in auto_map and "AutoModelForMaskedLM" in auto_map
    for reference_name in auto_map.values():
        assert (tmp_path / "tuned" / f"{reference_name.rpartition('.')[0]}.py").is_file(), reference_name
    plain = EfficientBertForSequenceClassification(tuned.config.__class__(**tiny_config("full").to_dict()))
    plain.save_pretrained(tmp_path / "plain")  # a config without auto_map: no python files
    assert not list((tmp_path / "plain").glob("*.py"))


@pytest.mark.slow  # two fresh interpreters and a local hub server
def test_push_to_hub_and_load_back_in_fresh_processes(reference, tmp_path):
    """Push in a fresh interpreter, which then loads the plain repo back by id (PUSH_THEN_LOAD: a third
    interpreter for that load checked nothing more); load the remote-code repos in another where importing
    hf_efficient fails."""
    model, plain, expected = reference
    python = set(export_remote_code(model, tmp_path / "exported"))
    plain_repo, plain_out = "user/tiny-efficient-bert-plain", tmp_path / "plain.pt"
    with LocalHub() as hub:
        env = hub.client_env(tmp_path / "hf_home_push")
        load = [plain / "inputs.pt", plain_out, "local", plain_repo]
        run_python(PUSH_THEN_LOAD, plain, tmp_path / "scratch", *load, env=env, cwd=tmp_path)

        def pushed(repo_id: str) -> set[str]:
            return set(hub.repos[repo_id].tree("main")[1])

        remote_repos = ["user/tiny-efficient-bert", "user/tiny-efficient-bert-saved"]
        for repo_id in remote_repos:
            assert {"config.json", "model.safetensors", *python} <= pushed(repo_id)
        assert not {name for name in pushed("user/tiny-efficient-bert-plain") if name.endswith(".py")}

        out = tmp_path / "remote.pt"
        env = hub.client_env(tmp_path / "hf_home_remote")
        run_python(
            BLOCK_HF_EFFICIENT + LOAD_AND_RUN,
            plain / "inputs.pt",
            out,
            "trust",
            *remote_repos,
            env=env,
            cwd=tmp_path,
        )
        results = torch.load(out)
        assert results["hf_efficient_imported"] is False
        for repo_id in remote_repos:
            assert all(module.startswith("transformers_modules.") for module in results[repo_id]["classes"])
            assert_identical(results[repo_id], expected)

        results = torch.load(plain_out)
        assert results[plain_repo]["classes"][0] == "hf_efficient.models.text.modeling_efficient_bert"
        assert_identical(results[plain_repo], expected)
