"""The one place that touches private torch / transformers APIs, each behind a fallback.

Mechanism and model code import what they need from here, never a private name directly
(tests/test_compat.py fails if one of the names below disappears from the installed release, so an
upgrade that removes one is noticed before users meet the fallback).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
from collections.abc import Callable

import torch
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

# ---- torch: saved-tensor hooks ----

# torch has no public way to ask whether saved-tensor hooks are installed; this private query exists in 2.x.
TOP_SAVED_TENSORS_HOOKS = "_top_saved_tensors_default_hooks"  # in torch._C._autograd


def saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``: non-reentrant gradient
    checkpointing, ``save_on_cpu``...) are installed around the current code.

    Fallback, without torch's private query: True, so a caller that would install hooks of its own (and
    hide its tensors from the outer ones) steps aside, which is always correct."""
    top = getattr(getattr(torch._C, "_autograd", None), TOP_SAVED_TENSORS_HOOKS, None)
    return top is None or top(False) is not None


# ---- torch: module hooks ----

# Where nn.Module keeps its forward hooks (per module, and global ones from register_module_forward_hook).
FORWARD_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
GLOBAL_FORWARD_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


def runs_plain_forward(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs its class's ``forward`` and nothing else: no forward hooks of its own
    or global ones, and no ``forward`` replaced on the instance (accelerate's offloading hooks do that), so a
    caller may compute the same result another way (into a preallocated output, say) without skipping code
    someone attached. Fallback, without torch's attributes: False (call the module)."""
    hook_dicts = [getattr(module, name, None) for name in FORWARD_HOOKS]
    hook_dicts += [getattr(torch.nn.modules.module, name, None) for name in GLOBAL_FORWARD_HOOKS]
    if any(hooks is None for hooks in hook_dicts):
        return False
    return not any(hook_dicts) and "forward" not in vars(module)


# ---- transformers: loading ----

# Steps of PreTrainedModel.from_pretrained a model may override (private: no public hook exists for them).
ADJUST_KEYS = "_adjust_missing_and_unexpected_keys"  # (self, loading_info), edits loading_info in place
FINALIZE_LOADING = "_finalize_model_loading"  # static (model, load_config, loading_info) -> loading_info
LOADED_FLAG = "_is_hf_initialized"  # set by from_pretrained on each tensor it loaded from the checkpoint


def loaded_from_checkpoint(tensor: torch.Tensor) -> bool:
    """Whether ``from_pretrained`` filled ``tensor`` from the checkpoint (rather than leaving it to be
    initialised). Fallback, without transformers' flag: False (the tensor is initialised afresh)."""
    return bool(getattr(tensor, LOADED_FLAG, False))


def hook_model_loading(
    cls: type[PreTrainedModel],
    adjust_keys: Callable[[PreTrainedModel, object], None],
    finalize: Callable[[PreTrainedModel, object, object, Callable], object],
) -> bool:
    """Route two steps of transformers' ``from_pretrained`` for ``cls`` (and its subclasses) through
    ``adjust_keys`` and ``finalize``; returns whether they are installed.

    ``adjust_keys(model, loading_info)`` runs after transformers adjusted ``loading_info.missing_keys`` /
    ``unexpected_keys`` and may edit them in place. ``finalize(model, load_config, loading_info, default)``
    replaces the end of loading and returns the ``loading_info``; ``default`` (same arguments) is
    transformers' own end (initialise what is missing, tie weights, log the LOAD REPORT).

    Fallback, on a transformers without these steps: nothing is installed and loading is transformers' own
    (its report stands, and a core's random state drawn from the seed is listed among the missing keys)."""
    if not (hasattr(PreTrainedModel, ADJUST_KEYS) and hasattr(PreTrainedModel, FINALIZE_LOADING)):
        return False

    def adjust(self, loading_info) -> None:
        getattr(super(cls, self), ADJUST_KEYS)(loading_info)
        adjust_keys(self, loading_info)

    def finish(model, load_config, loading_info):
        return finalize(model, load_config, loading_info, getattr(super(cls, cls), FINALIZE_LOADING))

    setattr(cls, ADJUST_KEYS, adjust)
    setattr(cls, FINALIZE_LOADING, staticmethod(finish))
    return True


# ---- transformers: config ----

ATTN_IMPLEMENTATION = "_attn_implementation"  # property of PretrainedConfig


def requested_attn_implementation(config) -> str | None:
    """What ``attn_implementation`` a transformers config holds (``attn_implementation=`` of
    ``from_pretrained``, ``set_attn_implementation``), which transformers keeps in a private property: one of
    transformers' attention functions or, for hf_efficient models, a kernel choice of their cores; None when
    unset. Fallback, without it: None."""
    return getattr(config, ATTN_IMPLEMENTATION, None)


def is_softmax_function(name: str) -> bool:
    """Whether ``name`` is one of transformers' exact-softmax functions (eager, sdpa, flex_attention...)."""
    return name == "eager" or name in ALL_ATTENTION_FUNCTIONS


def attn_implementation(config) -> str | None:
    """The exact-softmax function a transformers config asks for (``requested_attn_implementation``); None
    when unset or when the value chooses the cores' kernels instead (callers then take ``"sdpa"``)."""
    name = requested_attn_implementation(config)
    return name if name is not None and is_softmax_function(name) else None


# ---- torch: export ----

SIZE_OBLIVIOUS = ("torch.fx.experimental._config", "backed_size_oblivious")  # module, setting


def size_oblivious_tracing() -> contextlib.AbstractContextManager:
    """A context in which ``torch.export`` traces sizes "size oblivious": a dimension that happens to be 1,
    or to need no padding, in the example inputs does not specialise the program to that case.
    Fallback, without torch's private setting: no change (export may then specialise such a dimension, and
    fails on the dynamic shapes that it declared)."""
    module, setting = SIZE_OBLIVIOUS
    try:
        config = importlib.import_module(module)
    except ImportError:
        return contextlib.nullcontext()
    if not hasattr(config, setting):
        return contextlib.nullcontext()
    return config.patch(**{setting: True})


# ---- transformers: Auto-class registration and hub uploads (remote code, hf_efficient.hub) ----


def auto_class_of(cls: type) -> str | None:
    """The Auto class ``cls`` was registered for by ``register_for_auto_class`` ("AutoModelForMaskedLM"...),
    read from transformers' private ``_auto_class`` attribute. Fallback: None (not registered)."""
    return getattr(cls, "_auto_class", None)


def auto_model_mapping(auto_class) -> dict | None:
    """An ``AutoModel*`` class's config -> model mapping (private ``_model_mapping``), or None."""
    return getattr(auto_class, "_model_mapping", None)


@contextlib.contextmanager
def auto_class_hidden(*objects):
    """Hide the Auto-class registration of ``objects``' classes for the duration, so transformers' own
    ``custom_object_save`` (which copies modeling files, not the flat remote code) is skipped while saving;
    restored afterwards, inherited values included."""
    classes = {type(obj) for obj in objects}
    saved = {cls: cls.__dict__.get("_auto_class", ...) for cls in classes}
    for cls in classes:
        cls._auto_class = None
    try:
        yield
    finally:
        for cls, value in saved.items():
            if value is ...:
                del cls._auto_class  # it was inherited: inherit it again
            else:
                cls._auto_class = value


def files_timestamps(model, folder) -> dict[str, float]:
    """What ``push_to_hub`` later compares with to upload only changed files (``PushToHubMixin``'s private
    ``_get_files_timestamps``). Fallback: {} (every file counts as changed)."""
    timestamps = getattr(model, "_get_files_timestamps", None)
    return {} if timestamps is None else timestamps(folder)


def upload_modified_files(model, folder, repo_id: str, timestamps: dict, **kwargs) -> None:
    """Upload the files of ``folder`` changed since ``timestamps`` to ``repo_id`` in one commit, as
    ``save_pretrained(push_to_hub=True)`` does (private ``_upload_modified_files``). Fallback: the whole
    folder through ``huggingface_hub.upload_folder``."""
    upload = getattr(model, "_upload_modified_files", None)
    if upload is not None:
        upload(folder, repo_id, timestamps, **kwargs)
        return
    from huggingface_hub import upload_folder

    upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        commit_message=kwargs.get("commit_message") or "Upload model",
        token=kwargs.get("token"),
        create_pr=kwargs.get("create_pr", False),
    )


# ---- transformers: Trainer ----

# Trainer's saving steps, which a subclass extends (private: Trainer has no public hook around them).
TRAINER_SAVE = "_save"  # (self, output_dir=None, state_dict=None): model, config and processor files
TRAINER_SAVE_CHECKPOINT = "_save_checkpoint"  # (self, model, trial): one checkpoint-N folder
# Trainer's helpers, called as they are.
TRAINER_PREPARE_INPUTS = "_prepare_inputs"  # (inputs) -> the batch on the device
TRAINER_OUTPUT_DIR = "_get_output_dir"  # (trial) -> where this run's checkpoints go
TRAINER_REMOVE_UNUSED_COLUMNS = "_remove_unused_columns"  # (dataset, description) -> dataset


def hook_trainer_saving(cls, save: Callable, save_checkpoint: Callable) -> bool:
    """Route ``Trainer``'s two saving steps for ``cls`` (a ``Trainer`` subclass) through
    ``save(trainer, default, output_dir, state_dict)`` and
    ``save_checkpoint(trainer, default, model, trial)``, where ``default`` is ``Trainer``'s own step (bound,
    same arguments); returns whether they are installed.
    Fallback, on a transformers without these steps: nothing is installed (``Trainer`` saves as it does)."""
    from transformers import Trainer  # lazy: model code imports this module, and Trainer imports much

    if not (hasattr(Trainer, TRAINER_SAVE) and hasattr(Trainer, TRAINER_SAVE_CHECKPOINT)):
        return False

    def _save(self, output_dir=None, state_dict=None):
        return save(self, getattr(super(cls, self), TRAINER_SAVE), output_dir, state_dict)

    def _save_checkpoint(self, model, trial):
        return save_checkpoint(self, getattr(super(cls, self), TRAINER_SAVE_CHECKPOINT), model, trial)

    setattr(cls, TRAINER_SAVE, _save)
    setattr(cls, TRAINER_SAVE_CHECKPOINT, _save_checkpoint)
    return True


def trainer_prepare_inputs(trainer, inputs: dict) -> dict:
    """A collated batch as ``Trainer`` feeds it to the model (on its device). Fallback: each tensor moved to
    ``trainer.args.device``."""
    prepare = getattr(trainer, TRAINER_PREPARE_INPUTS, None)
    if prepare is not None:
        return prepare(inputs)
    return {k: v.to(trainer.args.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def trainer_output_dir(trainer, trial) -> str:
    """The folder ``Trainer`` writes this run's checkpoints to. Fallback: ``args.output_dir``."""
    output_dir = getattr(trainer, TRAINER_OUTPUT_DIR, None)
    return trainer.args.output_dir if output_dir is None else output_dir(trial=trial)


def trainer_model_columns(trainer, dataset, description: str):
    """``dataset`` with the columns the model's forward does not take removed, as ``Trainer`` feeds it.
    Fallback: ``dataset`` unchanged."""
    remove = getattr(trainer, TRAINER_REMOVE_UNUSED_COLUMNS, None)
    return dataset if remove is None else remove(dataset, description=description)


# ---- torch: tensor version counter ----

_FRESH_VERSIONS = itertools.count(-1, -1)  # negative: never a real counter's value


def tensor_version(tensor: torch.Tensor) -> int:
    """``tensor``'s in-place modification counter (``Tensor._version``: it changes whenever the tensor is
    written in place), so a cache keyed on it never serves a tensor changed since. Fallback: a new value at
    every call (the cache never hits, the results stay right)."""
    version = getattr(tensor, "_version", None)
    return next(_FRESH_VERSIONS) if version is None else version


# ---- torch: softmax backward ----

_SOFTMAX_BACKWARD = getattr(torch, "_softmax_backward_data", None)


def softmax_backward(
    grad: torch.Tensor, probs: torch.Tensor, dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of softmax's input from its output ``probs`` and that output's gradient ``grad``:
    probs * (grad - sum(grad * probs, dim)), written into ``out`` when given.

    torch's fused kernel (``torch._softmax_backward_data``, one pass over each row) where the installed
    release has it; the same maths in public ops otherwise (several passes over the tensor, slower)."""
    if _SOFTMAX_BACKWARD is not None:
        if out is None:
            return _SOFTMAX_BACKWARD(grad, probs, dim, probs.dtype)
        return _SOFTMAX_BACKWARD(grad, probs, dim, probs.dtype, grad_input=out)
    return _softmax_backward_public(grad, probs, dim, out)


def _softmax_backward_public(grad, probs, dim, out=None):
    product = torch.mul(grad, probs, out=out)  # (g * p)
    return product.addcmul_(probs, product.sum(dim, keepdim=True), value=-1.0)  # g p - p sum(g p)


_SAFE_SOFTMAX = getattr(torch, "_safe_softmax", None)


def safe_softmax(scores: torch.Tensor, dim: int) -> torch.Tensor:
    """softmax over ``dim`` with a row whose scores are all -inf giving zeros, not NaN: what
    ``scaled_dot_product_attention``'s math path computes (``torch._safe_softmax``, private). Fallback: the
    public softmax with its NaN rows set to zero."""
    if _SAFE_SOFTMAX is not None:
        return _SAFE_SOFTMAX(scores, dim)
    return torch.softmax(scores, dim).nan_to_num(0.0)


# ---- torch: CPU flash attention ----
# torch's fused CPU kernel of scaled_dot_product_attention, called directly for what the public function
# does not give: the log-sum-exp of each query row (saved for a backward that recomputes the scores) and
# the backward itself. Private aten ops: they may change or vanish in any torch release.

HAS_CPU_FLASH = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward"
)


def cpu_flash_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T scale + attn_mask) v and its log-sum-exp, without dropout or a causal mask.

    Args:
        query: (B, h, L, d); key, value: (B, h, S, d).
        attn_mask: additive (B | 1, 1 | h, L, S) (0 or -inf); every row must allow some key.

    Returns:
        out (B, h, L, d) in the query's dtype and logsumexp (B, h, L) of the scaled, masked scores (float32
        for float32 inputs). Without torch's fused CPU kernel the same by plain tensor maths.
    """
    if HAS_CPU_FLASH:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=attn_mask, scale=scale
        )
    scores = (query.float() @ key.float().transpose(-1, -2)) * scale + attn_mask  # (B, h, L, S)
    lse = scores.logsumexp(-1)  # (B, h, L)
    out = (scores - lse[..., None]).exp() @ value.float()
    return out.to(query.dtype), lse


def cpu_flash_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    attn_mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (query, key, value) of :func:`cpu_flash_attention` from its output and log-sum-exp.

    With P = exp(q k^T scale + mask - lse): dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K scale,
    dK = dS^T Q scale (the same by plain tensor maths without torch's fused CPU kernel)."""
    if HAS_CPU_FLASH:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, logsumexp, 0.0, False, attn_mask=attn_mask, scale=scale
        )
    q, k, v, g = (t.float() for t in (query, key, value, grad_out))
    probs = ((q @ k.transpose(-1, -2)) * scale + attn_mask - logsumexp[..., None]).exp()  # (B, h, L, S)
    scores_grad = probs * (g @ v.transpose(-1, -2) - (g * out.float()).sum(-1, keepdim=True))
    grads = (scores_grad @ k * scale, scores_grad.transpose(-1, -2) @ q * scale, probs.transpose(-1, -2) @ g)
    return tuple(grad.to(query.dtype) for grad in grads)


# ---- transformers: pipelines ----

# transformers 5 lists the tasks it removed in this table; pipeline() refuses their names before it looks at
# the registry, so a pipeline registered under one of them is reachable only once the name is taken out.
REMOVED_PIPELINE_TASKS = "REMOVED_TASKS"  # in transformers.pipelines: {task: what to use instead}


def register_pipeline_task(task: str, pipeline_class: type, auto_model_class: type) -> None:
    """Make ``pipeline(task)`` build ``pipeline_class`` (loading models by path with ``auto_model_class``),
    through transformers' public ``PIPELINE_REGISTRY``; a task name transformers 5 removed
    (question-answering) is taken out of its removed-task table first. Idempotent. Fallback, without that
    table: registered all the same (pipeline() then builds it as any registered task)."""
    from transformers import pipelines

    removed = getattr(pipelines, REMOVED_PIPELINE_TASKS, None)
    if isinstance(removed, dict):
        removed.pop(task, None)
    registered = pipelines.PIPELINE_REGISTRY.supported_tasks.get(task, {})
    if registered.get("impl") is not pipeline_class:
        pipelines.PIPELINE_REGISTRY.register_pipeline(
            task, pipeline_class=pipeline_class, pt_model=auto_model_class, type="text"
        )


def without_registered_pipelines(custom_pipelines: dict | None) -> dict:
    """A ``config.json``'s ``custom_pipelines`` without the tasks this process has registered a pipeline of
    the same class for (``import hf_efficient`` registers ``question-answering``): pipeline() builds a task
    named there from the model's remote code only, asking for ``trust_remote_code=True``, even where the
    installed package serves it. Where the package is absent, nothing is registered and every entry stays."""
    from transformers import pipelines

    kept = {}
    for task, info in (custom_pipelines or {}).items():
        registered = pipelines.PIPELINE_REGISTRY.supported_tasks.get(task, {}).get("impl")
        named = str(info.get("impl", "")).rpartition(".")[2] if isinstance(info, dict) else None
        if not (isinstance(registered, type) and registered.__name__ == named):
            kept[task] = info
    return kept
