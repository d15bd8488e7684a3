"""ComfyUI's attention backends around ours: the registry, and what a Patch node replaces.

- ``register_with_core``: where ComfyUI has ``register_attention_function`` (0.3.60+), the pack's
  attention is registered as "sagetriton" (defaults for this GPU; fallbacks on ComfyUI's global
  attention), so code that picks backends by name from the registry can pick it.
- ``describe_replaced``: names the backend a Patch node takes over from (ComfyUI's global choice,
  a backend set per model by core's "Model Attention Backend" node, or another node's override),
  for the run summary ("replaced ...; fallbacks on ...").

ComfyUI is imported lazily: the rules in this module are plain functions of what they are given.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from ..kernels.log import logger

REGISTRY_NAME = "sagetriton"
_registry_state = None


def _attention_module():
    import comfy.ldm.modules.attention as attention

    return attention


def registry_name_of(func, registry: dict) -> Optional[str]:
    """The name ``func`` is registered under (identity, or the function it wraps)."""
    for name, registered in registry.items():
        if func is registered or getattr(registered, "__wrapped__", None) is func:
            return name
    return None


def _wrapped_backend(override) -> Optional[Callable]:
    """The backend inside ``ModelPatcher.set_model_optimized_attention``'s closure, if that made ``override``."""
    for cell in getattr(override, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value):
            return value
    return None


def describe_backend(func, registry: dict) -> str:
    name = registry_name_of(func, registry)
    if name is not None:
        return name
    return getattr(func, "__name__", type(func).__name__)


def describe_replaced(previous_override, registry: Optional[dict] = None, global_backend=None) -> str:
    """Human name of what ran before the patch: "ComfyUI's global attention (pytorch)", "comfy_kitchen_int8,
    set per model (Model Attention Backend node)", "another node's override (module.function)"."""
    if registry is None or global_backend is None:
        try:
            attention = _attention_module()
            registry = registry if registry is not None else getattr(attention, "REGISTERED_ATTENTION_FUNCTIONS", {})
            global_backend = global_backend if global_backend is not None else attention.optimized_attention
        except ImportError:
            registry, global_backend = registry or {}, global_backend
    from .reporting.sparse_summary import CORE_SPARSE
    from .routing.override_watch import is_core_sparse

    if is_core_sparse(previous_override):
        return CORE_SPARSE
    if previous_override is None:
        if global_backend is None:
            return "ComfyUI's global attention"
        return f"ComfyUI's global attention ({describe_backend(global_backend, registry)})"
    if getattr(previous_override, "__name__", "") == "optimized_attention_override":
        inner = _wrapped_backend(previous_override)
        if inner is not None:
            return f"{describe_backend(inner, registry)}, set per model (Model Attention Backend node)"
    module = getattr(previous_override, "__module__", None) or "?"
    return f"another node's override ({module}.{getattr(previous_override, '__qualname__', '?')})"


def fallback_served_by(fallback_choice: str, replaced: str) -> str:
    if fallback_choice == "sdpa":
        return "PyTorch SDPA (Sage Settings fallback=sdpa)"
    if fallback_choice == "math":
        return "math-only SDPA (Sage Settings fallback=math)"
    return replaced


def register_with_core() -> Optional[str]:
    """Register "sagetriton" in ComfyUI's attention registry; the name, or None where there is none."""
    global _registry_state
    attention = _attention_module()
    register = getattr(attention, "register_attention_function", None)
    if register is None:
        return None
    if REGISTRY_NAME in getattr(attention, "REGISTERED_ATTENTION_FUNCTIONS", {}):
        return REGISTRY_NAME  # the pack imported a second time under another module name
    from .config.install_report import InstallReport
    from .routing.dispatch import PatchState
    from .routing.override import make_registry_backend

    _registry_state = PatchState(report=InstallReport())
    func = make_registry_backend(_registry_state)
    wrap = getattr(attention, "wrap_attn", None)
    if wrap is not None:  # like core's own backends: a per-model override still applies around it
        container_function = func.container_function
        func = wrap(func)
        func.container_function = container_function
    register(REGISTRY_NAME, func)
    logger.info("[SageTriton] registered as ComfyUI attention backend %r", REGISTRY_NAME)
    return REGISTRY_NAME


def describe_outer(override) -> tuple[str, str]:
    """(the run summary's name for an override on top of the patch's, a short label for the node's panel)."""
    from .reporting.sparse_summary import CORE_SPARSE
    from .routing.override_watch import is_core_sparse

    if override is None:
        return "ComfyUI's own attention (the override was taken off)", "ComfyUI's attention"
    if is_core_sparse(override):
        return CORE_SPARSE, CORE_SPARSE
    name = describe_replaced(override)
    return name, "Model Attention Backend" if name.endswith("(Model Attention Backend node)") else "another node"
