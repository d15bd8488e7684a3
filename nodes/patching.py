"""Attach the override and the run-summary wrapper to a clone of a ComfyUI MODEL.

The patch lives in the clone's ``model_options``, so bypassing or removing the node gives back the
unpatched model, and other MODELs in the graph are untouched. The one ComfyUI global it touches, its RoPE
functions (``routing.rope_hooks``), is wrapped so that only a patched model's forward changes what they do.
"""
from __future__ import annotations

from typing import Optional

from ..kernels.arch import ArchInfo
from ..kernels.log import logger
from .backends.alt_backends import DEFAULT_BACKEND, machine_vendor, runner_for, runs_instead, unavailable_note
from .backends.preferred_attention import describe, preferred_layers
from .config.install_report import InstallReport
from .config.settings import DEFAULT_SETTINGS, SageSettings
from .core_backends import describe_outer, describe_replaced, fallback_served_by
from .reporting.run_summary import WRAPPER_KEY, make_outer_sample_wrapper
from .routing import rope_hooks
from .routing.dispatch import PatchState
from .routing.forward_plan import WRAPPER_KEY as PLAN_KEY
from .routing.forward_plan import ForwardPlans, make_forward_wrapper
from .routing.nonfinite_guard import WRAPPER_KEY as GUARD_KEY
from .routing.nonfinite_guard import make_apply_model_wrapper
from .routing.override import make_attention_override
from .routing.override_watch import WRAPPER_KEY as WATCH_KEY
from .routing.override_watch import make_override_watch
from .sparse_patch import attach_sparse

OVERRIDE_KEY = "optimized_attention_override"
MIN_COMFYUI = "0.3.60"


def require_attention_override_support() -> None:
    """ComfyUI >= 0.3.60 routes every attention call through ``wrap_attn``; older versions cannot be patched."""
    import comfy.ldm.modules.attention as attention

    if not hasattr(attention, "wrap_attn"):
        raise RuntimeError(f"SageTriton needs ComfyUI {MIN_COMFYUI} or newer (per-model attention override); "
                           "please update ComfyUI.")


def previous_override_of(model) -> Optional[callable]:
    """The override already on ``model`` (another pack's), unwrapping an earlier SageTriton patch."""
    existing = model.model_options.get("transformer_options", {}).get(OVERRIDE_KEY)
    state = getattr(existing, "sagetriton_state", None)
    if state is not None:  # a second patch node replaces the first instead of stacking on it
        return state.previous_override
    return existing


def patch_model(model, settings: Optional[SageSettings] = None, node_id: Optional[str] = None,
                arch: Optional[ArchInfo] = None, **state_options):
    """A patched clone of ``model`` (a ComfyUI ModelPatcher); ``model`` itself is left as it was."""
    import comfy.patcher_extension

    require_attention_override_support()
    state = PatchState(settings or DEFAULT_SETTINGS, previous_override_of(model), arch=arch, node_id=node_id,
                       **{"report": InstallReport(), **state_options})
    replaced = describe_replaced(state.previous_override)
    state.composition = {"replaced": replaced, "fallback": fallback_served_by(state.settings.fallback, replaced)}
    state.composition["backend"] = use_backend(state)
    preferred = preferred_layers(getattr(model, "model", None))
    if preferred:  # only then: the composition of an ordinary model stays as it was
        state.composition["preferred"] = preferred
        logger.warning("[SageTriton] %s of this model name their own attention in the checkpoint; the Patch node "
                       "overrides them (ComfyUI gives a model's override precedence). Bypass the Patch node to keep "
                       "theirs.", describe(preferred))
    plans = state.forward_plans = ForwardPlans(state)
    patched = model.clone()
    patched.model_options.setdefault("transformer_options", {})[OVERRIDE_KEY] = make_attention_override(state, plans)
    outer = comfy.patcher_extension.WrappersMP.OUTER_SAMPLE
    patched.remove_wrappers_with_key(outer, WRAPPER_KEY)  # re-patching: one summary per run, not two
    patched.add_wrapper_with_key(outer, WRAPPER_KEY, make_outer_sample_wrapper(state))
    apply = comfy.patcher_extension.WrappersMP.APPLY_MODEL
    # First, so outermost: it sees each forward's override as the sampler hands it over
    patched.remove_wrappers_with_key(apply, WATCH_KEY)
    patched.add_wrapper_with_key(apply, WATCH_KEY, make_override_watch(state, describe_outer))
    patched.remove_wrappers_with_key(apply, GUARD_KEY)
    patched.add_wrapper_with_key(apply, GUARD_KEY, make_apply_model_wrapper(state))
    # After the guard, so inside it: the guard's redo runs through the dispatcher, with no plan.
    patched.remove_wrappers_with_key(apply, PLAN_KEY)
    patched.add_wrapper_with_key(apply, PLAN_KEY, make_forward_wrapper(state, plans))
    patched.remove_wrappers_with_key(apply, rope_hooks.WRAPPER_KEY)
    if state.settings.fast_rope and rope_hooks.install():
        patched.add_wrapper_with_key(apply, rope_hooks.WRAPPER_KEY, rope_hooks.make_apply_model_wrapper(state))
    attach_sparse(state, model, patched)
    return patched


def use_backend(state: PatchState) -> str:
    """Sage Settings' backend choice on ``state``; SageTriton where the chosen one cannot run here, said in
    a log line and in the run summary's notes (the Patch node's panel): why, and what runs instead."""
    choice = state.settings.backend
    vendor = machine_vendor()
    runner, why = runner_for(choice, vendor)
    if why is not None:
        note = unavailable_note(choice, why, vendor)
        logger.warning("[SageTriton] Sage Settings backend %r cannot run here: %s. %s runs instead.", choice, why,
                       runs_instead(vendor))
        state.composition.setdefault("notes", []).append(note)
        return DEFAULT_BACKEND
    state.kernel_runner = runner
    return choice


def patch_state_of(model) -> Optional[PatchState]:
    """The PatchState behind a patched MODEL (for tests and the status route)."""
    override = model.model_options.get("transformer_options", {}).get(OVERRIDE_KEY)
    return getattr(override, "sagetriton_state", None)
