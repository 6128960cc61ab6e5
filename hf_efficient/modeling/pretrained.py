"""``PreTrainedModel`` base of every hf_efficient model: weight init, attention state, sharing, kernels."""

from __future__ import annotations

import contextlib
import itertools
import re

import torch
from transformers import PreTrainedModel

from ..attention.base import IMPLEMENTATION_CHOICES, AttentionCore
from ..attention.cache import EfficientCache
from ..attention.inputs import AttentionInputs
from ..attention.registry import ATTENTION_REGISTRY
from ..compat import (
    attn_implementation,
    hook_model_loading,
    is_softmax_function,
    loaded_from_checkpoint,
    requested_attn_implementation,
)
from .blocks import CoreAttention, EfficientLayerStack
from .checkpoint_files import check_pretrained_path, check_weights_files, not_found_locally_note
from .loading import (
    ABSENT_TIED_PAIR,
    LOAD_REPORT,
    dropped_log_message,
    load_summary,
    logger,
    name_unsaved_attention,
    random_state_keys,
    source_model_type,
)


class EfficientPreTrainedModel(PreTrainedModel):
    supports_gradient_checkpointing = True
    _supports_sdpa = True  # the exact core runs any HF kernel (eager, sdpa, flex, flash)
    _supports_flex_attn = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["EfficientLayer"]
    # Losses are plain means (no self.loss_function): when forward takes **kwargs or this is True, Trainer
    # assumes a summed loss and multiplies it by the number of processes under DDP.
    accepts_loss_kwargs = False

    def __init__(self, config, *inputs, **kwargs):
        # The config's validators run at construction, not on `config.x = value` afterwards: run them again
        # here, so a field read only while building (sizes, position_embedding_type, the attention fields)
        # is honoured or refused by the model built from it, never silently ignored.
        config.validate()
        super().__init__(config, *inputs, **kwargs)

    def post_init(self):
        super().post_init()
        # Parameters a checkpoint saved in another setting may hold but these cores do not build (RFA's gate
        # in an encoder): loading ignores them rather than reporting them as unexpected.
        names = {name for core in self.attention_cores() for name in core.unbuilt_parameter_names()}
        self._keys_to_ignore_on_load_unexpected.update(rf"\.core\.{re.escape(name)}$" for name in names)
        self.resolve_attention_kernels()

    def resolve_attention_kernels(self) -> None:
        """Resolve every core's kernels for the device the model is on
        (:meth:`~hf_efficient.attention.base.AttentionCore.resolve_kernels`), once: at load, after ``.to()``
        and when the config changes (``set_attn_implementation``). A core called on another device resolves
        again on its first call there.

        The one knob is ``attn_implementation``: one of transformers' softmax functions (``"sdpa"``,
        ``"eager"``, ``"flex_attention"``...) runs exact attention (``full``, dense sub-blocks) and leaves
        each core its saved ``attention_config["implementation"]``; ``"auto"``, ``"reference"`` or a kernel's
        name (``"chunked"``, ``"parallel"``, ...) sets the implementation of every core that has it, the
        others keeping theirs, and must name a kernel of at least one core."""
        cores = self.attention_cores()
        choice = requested_attn_implementation(self.config)
        if choice is not None and is_softmax_function(choice):
            choice = None
        if choice is not None:
            self._check_kernel_choice(choice)
        device = next(itertools.chain(self.parameters(), self.buffers()), torch.empty(0)).device
        for core in cores:
            if not hasattr(core, "saved_implementation"):  # attention_config's, before any override
                core.saved_implementation = core.config.implementation
            override = choice is not None and _has_implementation(core, choice)
            core.config.implementation = choice if override else core.saved_implementation
            core.resolve_kernels(device)

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False):
        """transformers' check of ``attn_implementation``, which also takes the kernel choices of the cores
        (``"auto"``, ``"reference"``, a kernel's name: :meth:`resolve_attention_kernels`)."""
        if requested_attention in kernel_choices():
            self._check_kernel_choice(requested_attention)
            return requested_attention
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    def _check_kernel_choice(self, choice: str) -> None:
        """Raise unless some core of the model has the kernel ``choice`` (before the cores exist: any)."""
        cores = self.attention_cores()
        if cores and not any(_has_implementation(core, choice) for core in cores):
            valid = sorted({*IMPLEMENTATION_CHOICES, *(k.name for core in cores for k in core.kernels)})
            raise ValueError(
                f"attn_implementation={choice!r} is neither one of transformers' attention functions nor a "
                f"kernel of this model's attention ({', '.join(sorted({c.attention_type for c in cores}))}); "
                f"its kernel choices: {', '.join(valid)}."
            )

    def _apply(self, fn, recurse=True):
        """``.to()``, ``.cuda()``, ``.half()`` and the like, then the kernels resolved for the new device."""
        result = super()._apply(fn, recurse)
        self.resolve_attention_kernels()
        return result

    def set_attn_implementation(self, attn_implementation, *args, **kwargs):
        """transformers' ``set_attn_implementation``, then the kernels resolved for the new configuration."""
        result = super().set_attn_implementation(attn_implementation, *args, **kwargs)
        self.resolve_attention_kernels()
        return result

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' ``from_pretrained``, with clear errors where it has none: a local path that does not
        exist (transformers takes it for a hub id), and safetensors weights cut short or corrupt (named, with
        what to do) instead of safetensors' "incomplete metadata"."""
        local = check_pretrained_path(pretrained_model_name_or_path, f"{cls.__name__}.from_pretrained")
        if local is not None and local.is_dir():
            check_weights_files(local / kwargs.get("subfolder", ""))
        token = source_model_type.set(None)  # set by the config's from_dict when it reads a bert/vit config
        try:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except OSError as error:
            note = not_found_locally_note(pretrained_model_name_or_path)
            if note is None:
                raise
            raise OSError(f"{cls.__name__}.from_pretrained: {note}: {error}") from error
        finally:
            source_model_type.reset(token)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading info) when asked
        name_unsaved_attention(model, pretrained_model_name_or_path, kwargs)  # what PEFT's adapters reload
        return loaded

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)  # Linear / Embedding / LayerNorm with config.initializer_range
        if isinstance(module, AttentionCore):
            self._init_attention_core(module)

    @staticmethod
    def _init_attention_core(core: AttentionCore) -> None:
        """Initialise a core's own parameters and random state, keeping whatever was loaded from a checkpoint.

        ``from_pretrained`` builds the model on the meta device, loads the checkpoint, then initialises what
        is missing; cores write their tensors directly, so tensors already loaded are restored afterwards.
        """
        tensors = [*core.parameters(), *(b for b in core.buffers() if b is not None)]
        loaded = [(t, t.detach().clone()) for t in tensors if loaded_from_checkpoint(t)]
        if tensors and len(loaded) == len(tensors):
            return
        core.init_weights()
        for tensor, saved in loaded:
            tensor.copy_(saved)

    def tie_weights(self, *args, **kwargs):
        super().tie_weights(*args, **kwargs)
        # Loading replaces parameters one by one, which unties cross-layer sharing (Linformer layerwise).
        for module in self.modules():
            if isinstance(module, EfficientLayerStack):
                module.tie_attention_parameters()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """transformers' tied-weights mapping plus cross-layer attention sharing (with untied embeddings too).

        Declaring the shared parameters (Linformer layerwise) here lets ``from_pretrained`` tie them instead
        of reporting the copies that ``save_pretrained`` left out as missing and initialising them afresh.
        """
        tied = super().get_expanded_tied_weights_keys(all_submodels=all_submodels)
        for name, module in self.named_modules():
            if isinstance(module, EfficientLayerStack):
                prefix = f"{name}." if name else ""
                tied.update({prefix + t: prefix + s for t, s in module.shared_parameter_names().items()})
        return tied

    def attention_inputs(self, batch: int, seq: int, **fields) -> AttentionInputs:
        """The :class:`AttentionInputs` of one forward over (batch, seq) tokens: ``fields`` plus the model's
        current kernel (``set_attn_implementation`` takes effect at once), checked once here for every layer.
        """
        inputs = AttentionInputs(attn_implementation=attn_implementation(self.config), **fields)
        return inputs.prepare(batch, seq, type(self).__name__)

    def attention_cores(self) -> list[AttentionCore]:
        """Every attention core of the model, in layer order."""
        return [module for module in self.modules() if isinstance(module, AttentionCore)]

    def new_cache(self) -> EfficientCache:
        """An empty generation cache for this model: one layer per attention layer, as each core needs
        (keys and values for ``full``, a window for ``longformer``, running sums for the kernelized types).
        ``generate()`` makes its own; pass one as ``cache=`` to keep decoding state across calls."""
        # cross-attention cores keep nothing here (the encoder's keys: an EncoderDecoderCache's other half)
        return EfficientCache.for_cores(
            core for core in self.attention_cores() if not core.spec.cross_attention
        )

    def tracing_blockers(self) -> list[str]:
        """Why this model, as configured, cannot be traced by ``torch.export`` / ``torch.compile``: one line
        per cause, naming the attention type or option and the fix (empty when it can). Models with parts
        of their own that cannot be traced extend it."""
        reasons = (f"{core.attention_type}: {core.tracing_blocker()}" for core in self.attention_cores())
        blocked = (core.tracing_blocker() is not None for core in self.attention_cores())
        return list(dict.fromkeys(reason for reason, no in zip(reasons, blocked, strict=True) if no))

    def attention_checkpointing_enable(self) -> None:
        """Keep only each attention core's inputs (query, key, value) for backward and run the core again
        there, instead of keeping its intermediates (feature maps, sorted copies, window blocks).

        Cheaper than ``gradient_checkpointing_enable`` (which recomputes whole layers, projections and
        feed-forward included) when a core's intermediates are what fills memory; the two combine. Takes
        effect in training mode with gradients enabled; not saved with the model.
        """
        self._set_attention_checkpointing(True)

    def attention_checkpointing_disable(self) -> None:
        """Undo :meth:`attention_checkpointing_enable`."""
        self._set_attention_checkpointing(False)

    def _set_attention_checkpointing(self, enabled: bool) -> None:
        for module in self.modules():
            if isinstance(module, CoreAttention):
                module.checkpoint_core = enabled

    def save_pretrained(
        self, save_directory, is_main_process=True, state_dict=None, push_to_hub=False, **kwargs
    ):
        """transformers' ``save_pretrained``; after ``register_for_auto_class`` it also writes remote code.

        transformers' own remote-code copy only follows ``from .x import`` siblings and fails on this
        package's nested modules, so :func:`hf_efficient.hub.save_pretrained_with_remote_code` replaces it
        with a flat folder that ``trust_remote_code=True`` loads without hf_efficient installed.
        ``push_to_hub`` saves through this method, so it uploads the same folder.
        """
        from ..hub import save_pretrained_with_remote_code  # lazy: only saving needs it

        return save_pretrained_with_remote_code(
            self, super().save_pretrained, save_directory, is_main_process, state_dict, push_to_hub, **kwargs
        )


def _random_state_not_missing(model: EfficientPreTrainedModel, loading_info) -> None:
    """After transformers' own adjustment of the missing keys: the attention cores' random state (drawn
    from the seed when absent, as when converting a BERT checkpoint) is not a missing weight."""
    drawn = {key: kind for key, kind in random_state_keys(model).items() if key in loading_info.missing_keys}
    loading_info.missing_keys -= set(drawn)
    model._random_state_drawn_on_load = drawn


def _finalize_loading(model: EfficientPreTrainedModel, load_config, loading_info, default):
    """transformers' end of loading (``default``) with its LOAD REPORT (and its "checkpoint seem corrupted"
    about a tied head absent from a headless checkpoint) replaced by one line of
    :func:`~hf_efficient.modeling.loading.load_summary`, unless sizes mismatched or a conversion failed
    (then transformers' report stands: it raises after it)."""
    errors = loading_info.mismatched_keys or loading_info.conversion_errors or loading_info.error_msgs
    with contextlib.ExitStack() as quiet:
        if not errors:
            quiet.enter_context(dropped_log_message(*LOAD_REPORT))
            quiet.enter_context(dropped_log_message(*ABSENT_TIED_PAIR))
        loading_info = default(model, load_config, loading_info)
    drawn = getattr(model, "_random_state_drawn_on_load", {})
    missing, unexpected = loading_info.missing_keys, loading_info.unexpected_keys
    if not errors and (missing or unexpected or drawn or source_model_type.get()):
        source = str(load_config.pretrained_model_name_or_path)
        logger.warning(load_summary(model, source, missing, unexpected, drawn))
    return loading_info


# transformers' own steps for these are private, so compat installs them on the class.
hook_model_loading(EfficientPreTrainedModel, _random_state_not_missing, _finalize_loading)


def kernel_choices() -> set[str]:
    """Every value of ``attn_implementation`` that chooses cores' kernels: ``"auto"``, ``"reference"`` and the
    kernel names of the registered types (a model checks that one of its cores has it)."""
    return {*IMPLEMENTATION_CHOICES, *(k.name for cls in ATTENTION_REGISTRY.values() for k in cls.kernels)}


def _has_implementation(core: AttentionCore, choice: str) -> bool:
    return choice in IMPLEMENTATION_CHOICES or any(kernel.name == choice for kernel in core.kernels)
