"""q, k, v handed over in single-owner containers (current ComfyUI's ``AttentionTensorContainer``).

Current ComfyUI's ``wrap_attn`` passes the containers, not tensors, to an override that has a
``container_function`` attribute, and calls that function without the ``func`` argument. Whoever
``take()``s a container holds the only reference to the float tensor, so the kernel path can drop
Q, K and V as soon as each is quantized (``kernels.api.attention_forward_taking``): the call's
peak no longer holds the floats beside their quantized copies and the output.

Such a call goes through the same dispatcher as a tensor call (``PatchState.dispatch``); what differs is here,
in ``Holders``: peek to decide, take when consumed, hand untaken containers to a fallback that has a container
entry of its own. Duck-typed (``peek``/``take``): no ComfyUI import, and older ComfyUI never sends containers.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from ...kernels import failures
from .dispatch import PatchState, comfy_output, kernel_inputs

# Variants that have run once in this process with the floats kept (so a compile error could still fall
# back): only those drop the floats early, when nothing could be recomputed after a failure
# (``failures.memory.proven_variants``).
_memory = failures.memory


def is_container(x) -> bool:
    return not isinstance(x, torch.Tensor) and callable(getattr(x, "take", None)) and callable(getattr(x, "peek", None))


def comfy_backend() -> Callable:
    """ComfyUI's global attention (what ``--use-*-attention`` chose): the ``func`` a container call lacks."""
    import comfy.ldm.modules.attention as attention

    return attention.optimized_attention


def _take(args: tuple) -> tuple:
    return tuple(c.take() for c in args[:3]) + tuple(args[3:])


class Holders:
    """What ``PatchState.dispatch`` does differently for a call whose q, k, v are containers: peek to decide,
    take when consumed, hand untaken containers to a fallback that has a container entry of its own."""

    __slots__ = ("backend",)

    def __init__(self, backend: Optional[Callable] = None):
        self.backend = backend  # the attention a fallback calls (tests); None: ComfyUI's global one

    @staticmethod
    def tensors(args: tuple) -> tuple:
        """``args`` with q, k, v as the containers hold them (not taken)."""
        return (args[0].peek(), args[1].peek(), args[2].peek(), *args[3:])

    @staticmethod
    def consumed(args: tuple) -> None:
        for c in args[:3]:
            c.take()  # consumed, as the container protocol expects

    def fallback(self, state: PatchState, args: tuple, kwargs: dict, call, route: int) -> torch.Tensor:
        """An earlier override's or the global backend's own container function where it has one (the
        containers stay untaken), else the tensors through the dispatcher's fallback ``route``."""
        backend = self.backend
        previous = state.previous_override
        target = previous if previous is not None else (backend or comfy_backend())
        container_fn = getattr(target, "container_function", None)
        if container_fn is not None and state.settings.fallback == "auto" and state.redo_reason is None:
            return container_fn(*args, **kwargs)
        return state.run_fallback(backend or comfy_backend(), _take(args), kwargs, call, route)

    @staticmethod
    def may_take(call, variant: tuple) -> bool:
        """Eager, no autograd, within the grid limit, and a variant already run once with the floats kept."""
        from ...kernels.api import GRID_Y_LIMIT

        return (variant in _memory.proven_variants and not torch.compiler.is_compiling()
                and not call.q.requires_grad and call.batch * call.heads <= GRID_Y_LIMIT)

    @staticmethod
    def run_kernel_taking(state: PatchState, call, plan, mask, args: tuple) -> torch.Tensor:
        """The kernel, dropping each of Q, K, V once quantized: ``call`` and the containers let go of them."""
        from ...kernels.api import attention_forward_taking

        for c in args[:3]:
            c.take()  # the containers let go; ``call`` holds the tensors
        q, k, v, layout = kernel_inputs(call)
        call.q = call.k = call.v = None
        inputs = [q, k, v]
        del q, k, v
        out_layout = "HND" if call.skip_output_reshape else "NHD"
        out = attention_forward_taking(inputs, layout, False, call.extra.get("scale"), mask, plan.config,
                                       state.settings.smooth_k, state.settings.smooth_v, out_layout)
        return comfy_output(out, out_layout, call)

    def kernel_ran(self, args: tuple, variant: tuple) -> None:
        """The kernel ran with the floats kept: ``variant`` may take them from now on."""
        _memory.proven_variants.add(variant)
        self.consumed(args)


def dispatch_containers(state: PatchState, args: tuple, kwargs: dict, backend: Optional[Callable] = None):
    """The container entry: ``PatchState.dispatch`` for a call whose q, k, v are containers (no ``func``)."""
    if len(args) < 3 or not all(is_container(c) for c in args[:3]):
        raise TypeError("SageTriton's container function needs q, k and v as attention tensor containers")
    return state.dispatch(None, args, kwargs, Holders(backend))
