"""What ``from_pretrained`` says about a load: one line of its own instead of transformers' warnings.

Loading a BERT (or ViT) checkpoint into an hf_efficient class is the package's headline path, and there
transformers warns that "a model of type bert" instantiating "efficient_bert" "can yield errors", then prints
a LOAD REPORT that calls the attention cores' random state (Performer's projection matrix, RFA's random
weights: buffers drawn from a seed at initialisation, not weights to learn) MISSING. Both are silenced for
these loads, and :func:`load_summary` states in one line what was loaded into what, which parameters are new
(and must be trained), which checkpoint tensors went unused, and which attention state was drawn afresh.
Size mismatches and conversion errors keep transformers' full report (it raises after it).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
from collections.abc import Iterable, Iterator

from torch import nn

from ..attention.base import AttentionCore

logger = logging.getLogger(__name__)

# The model_type of the checkpoint a config was just read from, when it is another architecture's (bert):
# set by EfficientConfig.from_dict, read by the model's from_pretrained in the same call.
source_model_type: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "source_model_type", default=None
)

# The saved config fields that say which attention a model's weights belong to.
ATTENTION_FIELDS = ("attention_type", "attention_config", "layer_attention_types", "layer_attention_configs")
# transformers' messages that this package replaces, by the logger that emits them.
OTHER_TYPE_WARNING = ("transformers.configuration_utils", "to instantiate a model of type")
LOAD_REPORT = ("transformers.modeling_utils", "LOAD REPORT")
# Said of a tied pair absent from the checkpoint, as a headless checkpoint's (BERT without its MLM head)
# always is: the pair is new, which the load summary says, not a sign of a corrupt file.
ABSENT_TIED_PAIR = ("transformers.modeling_utils", "This checkpoint seem corrupted. The tied weights mapping")


class _DropMessages(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


@contextlib.contextmanager
def dropped_log_message(logger_name: str, fragment: str) -> Iterator[None]:
    """Records of logger ``logger_name`` whose message contains ``fragment`` are dropped inside the block."""
    target, message_filter = logging.getLogger(logger_name), _DropMessages(fragment)
    target.addFilter(message_filter)
    try:
        yield
    finally:
        target.removeFilter(message_filter)


def random_state_keys(model: nn.Module) -> dict[str, str]:
    """State-dict key -> attention type of every buffer an attention core draws at random when initialised
    (Performer's ``projection_matrix``, RFA's ``random_weights``): state to draw, not weights to learn."""
    keys = {}
    for module_name, module in model.named_modules():
        if isinstance(module, AttentionCore):
            prefix = f"{module_name}." if module_name else ""
            for name, _ in module.named_buffers(recurse=False):
                keys[prefix + name] = module.attention_type
    return keys


def compact_keys(keys: Iterable[str], limit: int = 6) -> str:
    """Keys with their layer index folded (``bert.encoder.layer.{0..5}.x``): one entry per name, ``limit``
    entries at most."""
    groups: dict[str, list[int]] = {}
    for key in sorted(keys):
        indices = [int(i) for i in re.findall(r"\.(\d+)\.", key)]
        folded = re.sub(r"\.\d+\.", ".*.", key)
        groups.setdefault(folded, []).extend(indices[:1])
    entries = []
    for folded, indices in groups.items():
        if len(indices) > 1:
            folded = folded.replace(".*.", f".{{{min(indices)}..{max(indices)}}}.", 1)
        entries.append(folded)
    more = f" and {len(entries) - limit} more" if len(entries) > limit else ""
    return ", ".join(entries[:limit]) + more


def name_unsaved_attention(model: nn.Module, source, overrides: dict) -> None:
    """When ``overrides`` (``from_pretrained``'s keywords: ``attention_type=...``, or a ``config``) gave
    ``model`` another attention than ``source`` (its path or hub id) holds, its ``name_or_path`` says so.

    ``name_or_path`` is what rebuilds a model: PEFT saves it as an adapter's base, and reloading the adapter
    (``AutoPeftModelFor*.from_pretrained``, transformers' ``from_pretrained`` of an adapter folder) loads
    that base. ``source`` would rebuild its own attention (plain BERT's, for a BERT checkpoint), so the
    reload would compute another model's outputs without a word; under this name it stops instead, and the
    name says why and what to do. A model saved with ``save_pretrained`` and loaded from that folder is named
    by the folder again.
    """
    if source is None or not (set(ATTENTION_FIELDS) & set(overrides) or "config" in overrides):
        return  # None: weights given as a state_dict, no folder to rebuild from
    hub = {key: overrides[key] for key in ("subfolder", "revision", "cache_dir", "token") if key in overrides}
    try:
        saved = type(model.config).from_pretrained(source, **hub)
    except OSError:  # weights without a config.json (config= given): nothing says what the folder rebuilds
        return
    if all(
        json.dumps(getattr(saved, name, None), sort_keys=True)
        == json.dumps(getattr(model.config, name, None), sort_keys=True)
        for name in ATTENTION_FIELDS
    ):
        return
    config = model.config
    attention = ", ".join(sorted({config.attention_for_layer(i)[0] for i in range(config.num_hidden_layers)}))
    model.name_or_path = (
        f"{source} ({attention} attention, not saved there: save_pretrained this model and load it from that "
        "folder to rebuild it)"
    )


def load_summary(model: nn.Module, source: str, missing: set[str], unexpected: set[str], drawn: dict) -> str:
    """The one line about a load: what went into what, new parameters, unused tensors, state drawn afresh.

    Args:
        model: the loaded model.
        source: the checkpoint path or hub id.
        missing: parameters absent from the checkpoint (initialised afresh).
        unexpected: checkpoint tensors the model has no place for.
        drawn: random-state keys of :func:`random_state_keys` absent from the checkpoint.
    """
    config = model.config
    origin = source_model_type.get()
    kind = f"{origin} checkpoint" if origin else "checkpoint"
    attention = sorted({config.attention_for_layer(i)[0] for i in range(config.num_hidden_layers)})
    parts = [f"Loaded {kind} {source!r} into {type(model).__name__} ({', '.join(attention)} attention)"]
    if missing:
        parts.append(f"new parameters, initialised at random (train them): {compact_keys(missing)}")
    if drawn:
        types = ", ".join(sorted(set(drawn.values())))
        parts.append(f"random attention state drawn from the seed ({types}): {compact_keys(drawn)}")
    if unexpected:
        parts.append(f"checkpoint tensors not used: {compact_keys(unexpected)}")
    return "; ".join(parts) + "."
