"""Where one training step's time goes, per component of an hf_efficient encoder, from ``torch.profiler``.

Forward: every module of a component opens a ``record_function`` scope while it runs (forward hooks added
by :func:`component_scopes`; the model's code is untouched), so each profiled op falls in the innermost
scope around it. Backward: autograd runs each op's backward under ``autograd::engine::evaluate_function``
with the forward op's sequence number, which maps it to the component whose forward created it. The
optimizer step and ``zero_grad`` run inside scopes of their own.

The components, by module (innermost wins):

=============================  =================================================================
embeddings                     the model's ``embeddings`` (token, position, patch, node encoders)
projections                    query / key / value and the attention output projection, and the
                               head split / merge around the core (``EfficientSelfAttention``)
attention core                 the ``AttentionCore`` (the mechanism itself)
feed-forward                   the two linear maps of each layer's MLP
norms, activations, dropout    LayerNorm, dropout, activation modules, and the residual additions
                               of the layers' output blocks
head + loss                    everything else the model's forward does (pooler, classifier, MLM
                               head, the gather of masked positions, the loss)
optimizer step                 ``optimizer.step()`` and ``zero_grad()``
other                          the encoder model's own glue (input checks, attention inputs) and
                               ops outside every scope
=============================  =================================================================

Times are the profiled step's (profiling adds overhead; the shares, not the sum, are what to read next to
an unprofiled timing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

EMBEDDINGS = "embeddings"
PROJECTIONS = "projections"
CORE = "attention core"
FEED_FORWARD = "feed-forward"
ELEMENTWISE = "norms, activations, dropout"
HEAD = "head + loss"
OPTIMIZER = "optimizer step"
OTHER = "other"
COMPONENTS = (EMBEDDINGS, PROJECTIONS, CORE, FEED_FORWARD, ELEMENTWISE, HEAD, OPTIMIZER, OTHER)
SCOPE = "component: "  # prefix of the record_function scopes this module opens
BACKWARD = "autograd::engine::evaluate_function"


def component_of(name: str, module, base_model_prefix: str = "") -> str | None:
    """The component a module's own work belongs to (None: its parent's), from its class and name."""
    from torch import nn

    from hf_efficient.attention.base import AttentionCore
    from hf_efficient.modeling.blocks import EfficientEncoder, EfficientSelfAttention

    path = f".{name}."
    if name == "":
        return HEAD  # the task model's own forward: what no inner component claims
    if name == base_model_prefix:
        return OTHER  # the encoder model's glue: input checks, attention inputs
    if isinstance(module, AttentionCore):
        return CORE
    if isinstance(module, EfficientSelfAttention):
        return PROJECTIONS
    if name.split(".")[-1] == "embeddings" and ".encoder." not in path:
        return EMBEDDINGS
    if ".encoder." not in path or isinstance(module, EfficientEncoder):
        return None
    if isinstance(module, nn.Linear):
        return PROJECTIONS if ".attention." in path else FEED_FORWARD
    return ELEMENTWISE  # layers, output blocks (residual adds), norms, dropout, activations


def component_modules(model) -> Iterator[tuple[str, object]]:
    """(component, module) for every module that opens a scope; a core's own submodules belong to it."""
    from hf_efficient.attention.base import AttentionCore

    prefix = getattr(model, "base_model_prefix", "")
    prefix = prefix if prefix and hasattr(model, prefix) else ""  # a bare encoder has no such attribute
    cores = [name + "." for name, module in model.named_modules() if isinstance(module, AttentionCore)]
    for name, module in model.named_modules():
        if any(name.startswith(core) for core in cores):
            continue
        label = component_of(name, module, prefix)
        if label is not None:
            yield label, module


@contextlib.contextmanager
def component_scopes(model) -> Iterator[None]:
    """While active, every component module of ``model`` runs inside a ``record_function`` scope."""
    from torch.autograd.profiler import record_function

    handles, open_scopes = [], []

    def enter(label):
        def hook(module, args):
            scope = record_function(SCOPE + label)
            scope.__enter__()
            open_scopes.append(scope)

        return hook

    def leave(module, args, output):
        open_scopes.pop().__exit__(None, None, None)

    for label, module in component_modules(model):
        handles.append(module.register_forward_pre_hook(enter(label)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def scope(label: str):
    """A ``record_function`` scope for a component outside the model (the optimizer step)."""
    from torch.autograd.profiler import record_function

    return record_function(SCOPE + label)


def attribute(events) -> dict[str, float]:
    """Milliseconds per component from a profiler's ``events()`` (each op's self time, once)."""
    totals = dict.fromkeys(COMPONENTS, 0.0)
    forward_of: dict[int, str] = {}  # forward sequence number -> component

    def enclosing(event) -> tuple[str | None, int | None]:
        """(innermost component scope, sequence number of the enclosing backward function) of an event."""
        backward_seq = None
        while event is not None:
            if event.name.startswith(SCOPE):
                return event.name.removeprefix(SCOPE), backward_seq
            if event.name.startswith(BACKWARD) and backward_seq is None:
                backward_seq = event.sequence_nr
            event = event.cpu_parent
        return None, backward_seq

    located = []
    for event in events:
        label, backward_seq = enclosing(event)
        if label is not None and backward_seq is None and event.sequence_nr >= 0:
            forward_of.setdefault(event.sequence_nr, label)
        located.append((event, label, backward_seq))
    for event, label, backward_seq in located:
        if label is None and backward_seq is not None:
            label = forward_of.get(backward_seq)
        totals[label or OTHER] += event.self_cpu_time_total / 1e3  # profiler times are in microseconds
    return totals


def profile_step(model, step: Callable[[], None]) -> tuple[dict[str, float], float]:
    """Run ``step`` twice under ``torch.profiler`` with component scopes (the first warms the profiler and
    is discarded); (milliseconds per component, wall milliseconds) of the second."""
    import time

    from torch.profiler import ProfilerActivity, profile, schedule

    with component_scopes(model):
        with profile(
            activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1, repeat=1)
        ) as prof:
            step()
            prof.step()
            start = time.perf_counter()
            step()
            wall_ms = 1e3 * (time.perf_counter() - start)
            prof.step()
    return attribute(prof.events()), wall_ms
