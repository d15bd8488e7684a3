"""Non-finite guard: a patched model's forward that returns NaN/Inf from finite inputs is redone on ComfyUI's
own attention, so a kernel fault never turns into a black frame.

One check per forward (an APPLY_MODEL wrapper, which every ComfyUI model goes through), not per attention call.
Only the redo's calls are counted: the discarded forward's were held (``stats.held_counts``) and are dropped.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ...kernels.log import logger
from ..reporting import stats
from ..reporting.reasons import Reason
from .dispatch import PatchState

WRAPPER_KEY = "sagetriton_nonfinite_guard"
REASON = Reason.NON_FINITE_REDO


def _finite(values) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in values
               if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()))


def make_apply_model_wrapper(state: PatchState) -> Callable:
    def sagetriton_nonfinite_guard(executor, *args, **kwargs):
        # The forward's counts are held until it is kept: a discarded forward's calls are never counted.
        with stats.held_counts() as forward:
            out = executor(*args, **kwargs)
            if not isinstance(out, torch.Tensor) or _finite([out]) or not _finite([*args, *kwargs.values()]):
                return out  # finite, or non-finite going in: not ours to fix
            forward.discard()
        logger.warning("[SageTriton] a patched forward returned NaN/Inf from finite inputs; redoing it on "
                       "ComfyUI's attention (which layer produced it first is not tracked)")
        # Per thread: another thread's forward through the same model is not redone.
        local = state.local
        local.redo_reason = REASON
        try:
            return executor(*args, **kwargs)
        finally:
            local.redo_reason = None

    return sagetriton_nonfinite_guard
