"""Sparse attention for a patched model's long self-attention calls (Sage Settings' ``sparse``).

``PatchState.dispatch`` asks the model's ``SparseRouter`` first (for both entries: tensors, and current
ComfyUI's holders). It takes a call that the dense kernel could take (the same checks)
and that sparse attention can honour: self-attention (q, k, v of one length; GQA fine), no mask, head
size 64-256, at least ``min_tokens`` long, inside the schedule's sparse window, not in a dense layer.
Those run ``kernels.sparse_attn`` with the plan's kernel config and count as kernel calls, with their
density; every other call goes on to the dense dispatcher (``NOT_SPARSE``), its reason counted apart
from fallbacks ("left dense"). A sparse kernel failure leaves that shape dense for the rest of this
model's life, with a note in the run summary; the dense kernel serves it.

The layer is the block index the model reports in ``transformer_options`` (as core's node reads it);
a model that reports none (Wan before ComfyUI 0.3.7x) gets the n-th self-attention call of its forward.
The step window is core's: ``start_percent``/``end_percent`` turned into sigmas by the model's own
``model_sampling.percent_to_sigma`` when the model is patched.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Optional

import torch

from ...kernels.build_errors import root_cause
from ...kernels.log import logger
from ..config.sparse_settings import SparseSettings
from ..reporting.reasons import Reason
from .call_cache import SPARSE
from .conditioning_span import sinks_for
from .dispatch import (
    NOT_SPARSE,
    AttentionCall,
    PatchState,
    bind_call,
    call_fallback_reason,
    comfy_output,
    kernel_inputs,
)
from .schedule import step_position

MIN_HEAD_DIM = 64  # below it the routing costs what the sparse blocks save (kernels.sparse_attn's docstring)
SIGMA_TOLERANCE = 1e-5  # a step exactly at start_percent is inside the window despite float rounding

# Why a call stays dense while sparse attention is on (counted per run, not fallbacks)
CROSS = Reason.CROSS
MASKED = Reason.MASKED
SMALL_HEADS = Reason.SMALL_HEADS.of(MIN_HEAD_DIM)
DENSE_STEP = Reason.DENSE_STEP
DENSE_LAYER = Reason.DENSE_LAYER
FAILED = Reason.SPARSE_FAILED


def short_reason(min_tokens: int) -> str:
    return Reason.SHORT_FOR_SPARSE.of(min_tokens)


class _Forward(threading.local):
    topts: Optional[dict] = None  # the forward's transformer_options (one dict per forward)
    self_calls = 0  # self-attention calls seen in it so far: the layer of a model reporting none
    sigmas = None  # the sigma tensor last read, and whether it was inside the window
    inside = True


class SparseRouter:
    """One patched model's sparse-attention choices and state."""

    def __init__(self, settings: SparseSettings, sigma_window: Optional[tuple[float, float]] = None):
        self.settings = settings
        self.layers = settings.layers
        self.kernel_options = settings.kernel_options()
        self.short = short_reason(settings.min_tokens)
        self.sigma_window = sigma_window  # (sigma_start, sigma_end); None: by step position
        self.local = _Forward()
        self.failed: dict[tuple, str] = {}  # (arch, head_dim, dtype) -> cause; dense from then on
        self.notes: list[str] = []  # for the run summary
        self._lock = threading.Lock()

    # --- where in the model and the schedule --------------------------------------------------------
    def layer_index(self, call: AttentionCall) -> Optional[int]:
        """The call's transformer block: the model's ``block_index``, else the count of self-attention
        calls before it in this forward. None for cross-attention (never counted) and for a call without
        transformer_options (no forward to count in)."""
        topts = call.extra.get("transformer_options")  # the forward's own dict, even while empty
        if call.q_len != call.k_len or not isinstance(topts, dict):
            return None
        local = self.local
        if local.topts is not topts:
            local.topts, local.self_calls = topts, 0
        n = local.self_calls
        local.self_calls = n + 1
        index = topts.get("block_index")
        return index if isinstance(index, int) and not isinstance(index, bool) else n

    def in_window(self, topts: dict) -> bool:
        """Whether this model evaluation is inside start/end percent (outside a sampling run: yes)."""
        sigmas = topts.get("sigmas")
        if sigmas is None:
            return True
        local = self.local
        if local.sigmas is sigmas:  # every call of one evaluation shares the tensor: one host read
            return local.inside
        inside = self._inside(topts, sigmas)
        local.sigmas, local.inside = sigmas, inside
        return inside

    def _inside(self, topts: dict, sigmas) -> bool:
        s = self.settings
        if self.sigma_window is not None:
            try:
                sigma = float(sigmas.flatten()[0]) if isinstance(sigmas, torch.Tensor) else float(sigmas[0])
            except (TypeError, ValueError, IndexError):
                return True
            start, end = self.sigma_window
            return sigma <= start * (1 + SIGMA_TOLERANCE) and sigma >= end * (1 - SIGMA_TOLERANCE)
        position = step_position(topts)
        if position is None:
            return True
        index, steps = position
        return s.start_percent <= index / steps + 1e-9 and index / steps <= s.end_percent

    # --- the decision ----------------------------------------------------------------------------------
    def dense_reason(self, call: AttentionCall, layer: Optional[int]) -> Optional[str]:
        """Why this call (one the dense kernel could take) stays dense, or None: it runs sparse."""
        if call.q_len != call.k_len:
            return CROSS
        if call.mask is not None:
            return MASKED
        if call.head_dim < MIN_HEAD_DIM:
            return SMALL_HEADS
        if call.q_len < self.settings.min_tokens:
            return self.short
        if not self.in_window(call.transformer_options):
            return DENSE_STEP
        if layer is not None and layer in self.layers:
            return DENSE_LAYER
        return None

    def _failure_key(self, state: PatchState, call: AttentionCall) -> tuple:
        return state.arch_for(call.q.device).arch, call.head_dim, call.q.dtype

    def take(self, state: PatchState, call: AttentionCall):
        """(plan, sinks) when this call runs sparse, else None (its reason counted)."""
        layer = self.layer_index(call)
        if call_fallback_reason(call) is not None or state.full_precision_step(call.transformer_options):
            return None  # the dense dispatcher falls back, for its own reason
        reason = self.dense_reason(call, layer)
        if reason is None and self._failure_key(state, call) in self.failed:
            reason = FAILED
        if reason is None:
            plan = state.planner.sparse_plan(state.arch_for(call.q.device), call.head_dim)
            if plan.config is not None:
                return plan, sinks_for(call.transformer_options, call.q_len, self.settings.sink_conditioning)
            return None  # no kernel variant here: the dispatcher says so
        state.runs.sparse_dense(reason)
        return None

    def run(self, state: PatchState, call: AttentionCall, plan, sinks) -> torch.Tensor:
        from ...kernels import sparse_attn

        q, k, v, layout = kernel_inputs(call)
        out_layout = "HND" if call.skip_output_reshape else "NHD"
        keys, rows, _ = sinks
        kw = dict(tensor_layout=layout, scale=call.extra.get("scale"), sink_blocks=list(keys), sink_q=list(rows),
                  return_density=True, out_layout=out_layout, config=plan.config)
        out, density = sparse_attn(q, k, v, **kw, **self.kernel_options)  # extra_tokens included
        state.last_plan = plan
        state.count(SPARSE, None)
        state.runs.sparse(density)
        return comfy_output(out, out_layout, call)

    def failed_here(self, state: PatchState, call: AttentionCall, error: Exception) -> None:
        key = self._failure_key(state, call)
        cause = root_cause(error)
        with self._lock:
            self.failed[key] = cause
            note = (f"sparse kernel failed for head_dim {key[1]} {str(key[2]).replace('torch.', '')} on {key[0]} "
                    f"({cause}); those calls run the dense kernel")
            if note not in self.notes:
                self.notes.append(note)
        logger.warning("[SageTriton] %s.", note)
        state.runs.sparse_dense(FAILED)

    # --- the entry ----------------------------------------------------------------------------------
    def dispatch(self, state: PatchState, args: tuple, kwargs: dict, holders=None):
        """The output of a call that ran sparse, or ``NOT_SPARSE``. With ``holders`` (``containers.Holders``)
        q, k, v are containers, taken only when the call ran sparse."""
        try:
            call = bind_call(args if holders is None else holders.tensors(args), kwargs)
        except (TypeError, ValueError, AttributeError):
            return NOT_SPARSE  # the dispatcher reports it
        taken = self.take(state, call)
        if taken is None:
            return NOT_SPARSE
        try:
            out = self.run(state, call, *taken)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - never fail the run: the dense path takes the call
            self.failed_here(state, call, e)
            return NOT_SPARSE
        if holders is not None:
            holders.consumed(args)
        return out


def sigma_window(model, settings: SparseSettings) -> Optional[tuple[float, float]]:
    """(sigma_start, sigma_end) of ``settings``' start/end percent for ``model`` (a ModelPatcher), as core's
    nodes turn percents into sigmas; None where the model has no model_sampling (the step position decides)."""
    get: Optional[Callable] = getattr(model, "get_model_object", None)
    try:
        sampling = get("model_sampling") if get is not None else None
        if sampling is None:
            return None
        return (float(sampling.percent_to_sigma(settings.start_percent)),
                float(sampling.percent_to_sigma(settings.end_percent)))
    except Exception:  # noqa: BLE001 - a model without the usual sampling object
        return None
