"""The functions ComfyUI calls for a patched model's attention, made in one place: the Patch node's override
(with or without its forward plans), core's registry backend, and the container entry each carries.

All of them hand the call to ``PatchState.dispatch``; each is a plain function (ComfyUI deep-copies
model_options on clone, and a function survives that as the same object) that torch.compile runs eagerly
(``outside_graphs``), with ``sagetriton_state`` (a second patch replaces, not stacks) and
``container_function`` (current ComfyUI hands q, k, v over in containers to that attribute). Its own module
so that ``dispatch`` (tensors) and ``containers`` (q, k, v holders) need not import each other.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from .containers import comfy_backend, dispatch_containers
from .dispatch import PatchState
from .forward_plan import ForwardPlans

GRAPH_BREAK = ("SageTriton's attention dispatcher runs outside compiled graphs, as uncompiled (its checks, plans and "
               "counters are Python state): compile without fullgraph=True")


def outside_graphs(fn: Callable) -> Callable:
    """``fn`` run eagerly where torch.compile traces a call to it (a graph break that names why)."""
    try:
        return torch.compiler.disable(fn, reason=GRAPH_BREAK)
    except TypeError:  # a torch without reason=
        return torch.compiler.disable(fn)


def _entries(fn: Callable, state: PatchState) -> Callable:
    """``fn`` outside graphs, with the attributes every SageTriton attention function carries."""
    fn = outside_graphs(fn)
    fn.sagetriton_state = state
    fn.container_function = outside_graphs(lambda *args, **kwargs: dispatch_containers(state, args, kwargs))
    return fn


def make_attention_override(state: PatchState, plans: Optional[ForwardPlans] = None) -> Callable:
    """The function ComfyUI calls as ``optimized_attention_override(func, *args, **kwargs)``. With ``plans``
    (the Patch node's), a call the forward's plan sends to ComfyUI's attention goes there after a position
    and shape check, without the dispatcher (``forward_plan``)."""
    if plans is None:
        def sagetriton_attention_override(func, *args, **kwargs):
            return state.dispatch(func, args, kwargs)

        return _entries(sagetriton_attention_override, state)
    local = state.local

    def sagetriton_attention_override(func, *args, **kwargs):  # the same, the plan asked first
        forward = local.forward
        if forward is not None:
            i = forward.pos
            forward.pos = i + 1
            plan = forward.plan
            if plan is None:  # learning: the shapes beside the dispatcher's decisions
                forward.shapes.append((getattr(args[0], "shape", None), getattr(args[1], "shape", None))
                                      if len(args) > 1 else (None, None))
            elif i < len(plan.calls):
                known = plan.calls[i]
                if (known is not None and local.redo_reason is None and len(args) > 1
                        and getattr(args[0], "shape", None) == known[0]
                        and getattr(args[1], "shape", None) == known[1]):
                    forward.counts[known[2]] += 1
                    previous = state.previous_override
                    return func(*args, **kwargs) if previous is None else previous(func, *args, **kwargs)
        return state.dispatch(func, args, kwargs)

    plans.override = override = _entries(sagetriton_attention_override, state)
    return override


def make_registry_backend(state: PatchState) -> Callable:
    """A backend with ComfyUI's signature (no ``func``) for core's attention registry: ``state``'s dispatcher,
    with ComfyUI's global attention as the fallback."""
    def sagetriton_attention(*args, **kwargs):
        return state.dispatch(comfy_backend(), args, kwargs)

    return _entries(sagetriton_attention, state)
