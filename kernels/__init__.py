"""SageTriton kernels: a plain library (no ComfyUI import).

``sageattn`` is the entry point; ``arch`` holds the per-GPU defaults; ``reference`` the pure-torch
references the tests and benchmarks compare against.
"""
from .arch import ArchInfo, KernelConfig, default_config, detect_arch, resolve_config, supported_choices

_LAZY = {"sageattn", "attention_forward"}  # from .api, which imports triton: only when asked for


def __getattr__(name):
    if name in _LAZY:
        from . import api

        value = globals()[name] = getattr(api, name)  # later lookups skip this hook (~10 µs a call)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["sageattn", "attention_forward", "ArchInfo", "KernelConfig", "default_config", "detect_arch",
           "resolve_config", "supported_choices"]
