"""EfficientTrainer: AdamW leaves the attention cores' temperatures and normalisation gains undecayed."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from torch import nn
from transformers import BertTokenizerFast, Trainer, TrainingArguments

from hf_efficient import EfficientBertForMaskedLM
from hf_efficient.data import SeededMLMCollator
from hf_efficient.training import (
    AttentionDistillationTrainer,
    EfficientTrainer,
    no_weight_decay_parameter_names,
    train_and_save,
)

from ..attention.helpers import make_core
from ..models.text.helpers import tiny_config, write_vocab


class TwoLayers(nn.Module):
    def __init__(self, **rfa_config):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.layers = nn.ModuleList([make_core("rfa", layer_idx=0, **rfa_config), make_core("long_short")])


def test_names_cover_every_core_in_the_model():
    names = no_weight_decay_parameter_names(TwoLayers())
    assert names == {"layers.0.sigma", "layers.1.local_norm_weight", "layers.1.global_norm_weight"}
    # switched off: a frozen sigma is no parameter, nothing to spare
    assert no_weight_decay_parameter_names(TwoLayers(learn_sigma=False)) == names - {"layers.0.sigma"}


def one_zero_gradient_step(trainer_class, tmp_path):
    """One AdamW step with all gradients zero: only decoupled weight decay moves the parameters."""
    model = TwoLayers()
    args = TrainingArguments(
        output_dir=str(tmp_path), learning_rate=0.1, weight_decay=0.5, report_to=[], use_cpu=True
    )
    optimizer = trainer_class(model=model, args=args).create_optimizer()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return before, dict(model.named_parameters())


def test_efficient_trainer_spares_listed_parameters_only(tmp_path):
    before, after = one_zero_gradient_step(EfficientTrainer, tmp_path)
    for name in ("layers.0.sigma", "layers.1.local_norm_weight"):
        assert torch.equal(after[name], before[name]), name
    shrink = 1 - 0.1 * 0.5  # p <- p (1 - lr wd)
    torch.testing.assert_close(after["proj.weight"], before["proj.weight"] * shrink)
    projection = "layers.1.dynamic_projection"
    torch.testing.assert_close(after[projection], before[projection] * shrink)
    assert torch.equal(after["proj.bias"], before["proj.bias"])  # Trainer's own rule, kept
    assert issubclass(AttentionDistillationTrainer, EfficientTrainer)  # distillation spares them too


def test_plain_trainer_decays_the_temperature(tmp_path):
    # why EfficientTrainer exists: Trainer shrinks sigma toward 0 (uniform attention)
    before, after = one_zero_gradient_step(Trainer, tmp_path)
    torch.testing.assert_close(after["layers.0.sigma"], before["layers.0.sigma"] * (1 - 0.1 * 0.5))


class Regression(TwoLayers):
    def forward(self, x):  # (b, n, 16) -> loss through both cores
        hidden = x.view(x.shape[0], x.shape[1], 2, 8).transpose(1, 2)  # (b, 2 heads, n, 8)
        for core in self.layers:
            hidden = core(hidden, hidden, hidden).output
        return {"loss": hidden.pow(2).mean()}


def test_resuming_an_optimizer_grouped_by_plain_trainer_names_the_fix(tmp_path):
    data = [{"x": torch.randn(6, 16)} for _ in range(4)]
    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=2, report_to=[], use_cpu=True)
    saving = TrainingArguments(max_steps=1, save_steps=1, **args)
    old = Trainer(model=Regression(), args=saving, train_dataset=data)
    old.train()  # checkpoint-1, sigma and the norm gains in the decayed group
    resumed = TrainingArguments(max_steps=2, resume_from_checkpoint="last", **args)
    trainer = EfficientTrainer(model=Regression(), args=resumed, train_dataset=data)
    with pytest.raises(ValueError, match="--model_name_or_path .*checkpoint-1"):
        train_and_save(trainer)


@pytest.mark.parametrize("unused", [[], ["never_used"]])
def test_parameters_without_gradient_decide_ddp_find_unused(unused, tmp_path):
    """One probe step finds the parameters no gradient reaches (here one a core holds but never uses), and
    leaves the RNG and the seeded collator as they were: the run itself is unchanged."""
    tokenizer = BertTokenizerFast(str(write_vocab(tmp_path)))
    model = EfficientBertForMaskedLM(tiny_config("full", vocab_size=tokenizer.vocab_size))
    for name in unused:
        model.bert.encoder.layer[0].attention.self.core.register_parameter(
            name, torch.nn.Parameter(torch.ones(2))
        )
    data = Dataset.from_dict({"input_ids": [tokenizer("a b c d e f")["input_ids"]] * 4, "text": ["x"] * 4})
    args = TrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True)
    collator = SeededMLMCollator(tokenizer, 0.5, mask_seed=0)
    trainer = EfficientTrainer(model=model, args=args, train_dataset=data, data_collator=collator)
    rng = torch.get_rng_state()
    found = trainer.parameters_without_gradient()
    assert sorted({name.rpartition(".")[2] for name in found}) == unused
    assert all(".attention.self.core." in name for name in found)
    assert torch.equal(torch.get_rng_state(), rng) and all(p.grad is None for p in model.parameters())
    rows = [data[i] for i in range(2)]  # the run's first batch is masked as without the probe
    fresh = SeededMLMCollator(tokenizer, 0.5, mask_seed=0)
    rows = [{"input_ids": row["input_ids"]} for row in rows]
    assert torch.equal(collator(rows)["labels"], fresh(rows)["labels"])
