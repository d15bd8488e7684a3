"""q, k, v handed over in single-owner containers (current ComfyUI's ``AttentionTensorContainer``).

Current ComfyUI's ``wrap_attn`` passes the containers, not tensors, to an override that has a
``container_function`` attribute, and calls that function without the ``func`` argument. Whoever
``take()``s a container holds the only reference to the float tensor, so the kernel path can drop
Q, K and V as soon as each is quantized (``kernels.api.attention_forward_taking``): the call's
peak no longer holds the floats beside their quantized copies and the output.

Duck-typed (``peek``/``take``): no ComfyUI import, and older ComfyUI never sends containers.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from ...kernels import failures
from ..reporting.reasons import Reason
from . import dispatch
from .dispatch import NEEDS_GRAD, PatchState, bind_call, comfy_output, kernel_inputs, needs_grad, normalize_mask

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


def _taking_allowed(call, key) -> bool:
    """Eager, no autograd, within the grid limit, and a variant already run once with the floats kept."""
    from ...kernels.api import GRID_Y_LIMIT

    return (key in _memory.proven_variants and not torch.compiler.is_compiling() and not call.q.requires_grad
            and call.batch * call.heads <= GRID_Y_LIMIT)


def run_fallback(state: PatchState, args: tuple, kwargs: dict, call, backend: Optional[Callable] = None):
    """Where a container call goes when the kernel does not take it: an earlier override's or the
    global backend's own container function where it has one (the containers stay untaken), else
    the tensors through the dispatcher's usual fallback."""
    previous = state.previous_override
    target = previous if previous is not None else (backend or comfy_backend())
    container_fn = getattr(target, "container_function", None)
    if container_fn is not None and state.settings.fallback == "auto" and state.redo.reason is None:
        return container_fn(*args, **kwargs)
    taken = _take(args)
    func = backend or comfy_backend()
    return state.run_fallback(func, taken, kwargs, call)


def _run_kernel_taking(state: PatchState, call, plan, mask, args: tuple) -> torch.Tensor:
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


def dispatch_containers(state: PatchState, args: tuple, kwargs: dict, backend: Optional[Callable] = None):
    """``PatchState.dispatch`` for a call whose q, k, v are containers (no ``func``)."""
    if len(args) < 3 or not all(is_container(c) for c in args[:3]):
        raise TypeError("SageTriton's container function needs q, k and v as attention tensor containers")
    if state.redo.reason is not None:
        state.runs.fallback(state.redo.reason)
        return run_fallback(state, args, kwargs, None, backend)
    if torch.is_grad_enabled() and needs_grad(args):  # the kernel has no backward
        state.runs.fallback(NEEDS_GRAD)
        return run_fallback(state, args, kwargs, None, backend)
    if state.sparse is not None:
        out = state.sparse.dispatch_containers(state, args, kwargs)
        if out is not dispatch.NOT_SPARSE:
            return out
    try:
        call = bind_call((args[0].peek(), args[1].peek(), args[2].peek(), *args[3:]), kwargs)
    except (TypeError, ValueError, AttributeError) as e:
        state.runs.fallback(Reason.UNRECOGNISED_CALL, str(e))
        return run_fallback(state, args, kwargs, None, backend)
    reason, plan = state.decide(call)
    if reason is None:
        mask = normalize_mask(call)[0]
        key = dispatch.variant_key(plan, state.settings, call, mask)
        if key in _memory.variants:
            reason = dispatch.VARIANT_DISABLED
        elif state.kernel_runner is None and _taking_allowed(call, key):
            out = _run_kernel_taking(state, call, plan, mask, args)  # an error here has nothing left to fall back on
            state.runs.kernel()
            return out
        else:
            try:
                out = state.run_kernel(call, plan, mask)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # compile or launch failure: never fail the run
                # A call the fallback refuses too was the caller's fault: its error goes up, the variant stays on.
                out = run_fallback(state, args, kwargs, call, backend)
                refused = dispatch.caller_error(call, mask)
                if refused is not None:  # arguments the checks let by: still the caller's, not a kernel fault
                    state.runs.fallback(dispatch.REFUSED_ARGUMENTS, refused)
                    return out
                dispatch.disable_variant(key, plan, e)
                state.runs.fallback(dispatch.VARIANT_DISABLED)
                return out
            _memory.proven_variants.add(key)
            for c in args[:3]:
                c.take()  # consumed, as the container protocol expects
            state.runs.kernel()
            return out
    state.runs.fallback(reason)
    return run_fallback(state, args, kwargs, call, backend)
