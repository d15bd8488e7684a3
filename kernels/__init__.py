"""SageTriton kernels: a plain library (no ComfyUI import).

``sageattn`` is the entry point, ``sparse_attn`` the block-sparse one for long sequences; ``arch`` holds
the per-GPU defaults; ``reference`` and ``sparse_reference`` the pure-torch references the tests and
benchmarks compare against.
"""
from .arch import ArchInfo, KernelConfig, default_config, detect_arch, resolve_config, supported_choices

_LAZY = {"sageattn": "api", "attention_forward": "api", "sparse_attn": "sparse_api"}  # modules importing triton:
# only when asked for


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = globals()[name] = getattr(module, name)  # later lookups skip this hook (~10 µs a call)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["sageattn", "attention_forward", "sparse_attn", "ArchInfo", "KernelConfig", "default_config", "detect_arch",
           "resolve_config", "supported_choices"]
