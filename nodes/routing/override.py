"""The function ComfyUI calls for a patched model's attention, with the container entry current ComfyUI uses.

Its own module so that ``dispatch`` (tensors) and ``containers`` (q, k, v holders) need not import each other.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .containers import dispatch_containers
from .dispatch import PatchState

GRAPH_BREAK = ("SageTriton's attention dispatcher runs outside compiled graphs, as uncompiled (its checks, plans and "
               "counters are Python state): compile without fullgraph=True")


def outside_graphs(fn: Callable) -> Callable:
    """``fn`` run eagerly where torch.compile traces a call to it (a graph break that names why)."""
    try:
        return torch.compiler.disable(fn, reason=GRAPH_BREAK)
    except TypeError:  # a torch without reason=
        return torch.compiler.disable(fn)


def make_attention_override(state: PatchState) -> Callable:
    """The function ComfyUI calls as ``optimized_attention_override(func, *args, **kwargs)``."""

    @outside_graphs  # torch.compile: a graph break, the dispatcher runs eagerly
    def sagetriton_attention_override(func, *args, **kwargs):
        return state.dispatch(func, args, kwargs)

    sagetriton_attention_override.sagetriton_state = state  # lets a second patch node replace, not stack
    # current ComfyUI hands q, k, v over in containers, to this attribute
    sagetriton_attention_override.container_function = outside_graphs(
        lambda *args, **kwargs: dispatch_containers(state, args, kwargs))
    return sagetriton_attention_override
