"""Sage Settings' sparse attention on a patched clone: the router the dispatcher asks first, and the
APPLY_MODEL wrapper telling it where a forward's text tokens are (``routing.conditioning_span``)."""
from __future__ import annotations

from ..kernels.log import logger
from .routing.conditioning_span import WRAPPER_KEY as TEXT_KEY
from .routing.conditioning_span import make_text_wrapper, text_place
from .routing.dispatch import PatchState
from .routing.sparse_calls import SparseRouter, sigma_window

OTHER_BACKEND = "sparse attention is SageTriton's kernel: off while Sage Settings' backend is {}"


def attach_sparse(state: PatchState, model, patched) -> None:
    """Give ``state`` a ``SparseRouter`` when its settings ask for sparse attention (``model``: the patcher
    whose model_sampling turns percents into sigmas; ``patched``: the clone that gets the wrapper)."""
    import comfy.patcher_extension

    apply = comfy.patcher_extension.WrappersMP.APPLY_MODEL
    patched.remove_wrappers_with_key(apply, TEXT_KEY)
    state.sparse = None
    settings = state.settings.sparse
    if not settings.enabled:
        return
    if state.kernel_runner is not None:  # comparing another attention library: its calls stay its own
        note = OTHER_BACKEND.format(state.composition.get("backend"))
        state.composition["sparse_off"] = note
        logger.warning("[SageTriton] %s.", note)
        return
    state.sparse = SparseRouter(settings, sigma_window(model, settings))
    if settings.sink_conditioning != "off":
        seen: list = [None, None]  # (diffusion model, its text place): one lookup per model

        def place_of(base_model):
            dm = getattr(base_model, "diffusion_model", None)
            if seen[0] is not dm:
                seen[0], seen[1] = dm, text_place(dm) if dm is not None else None
            return seen[1]

        patched.add_wrapper_with_key(apply, TEXT_KEY, make_text_wrapper(place_of))
    logger.info("[SageTriton] sparse attention on (%s) for self-attention calls from %d tokens, between %g and %g "
                "of the schedule%s.", settings.describe(), settings.min_tokens, settings.start_percent,
                settings.end_percent, f"; dense blocks {settings.dense_layers}" if settings.dense_layers else "")
