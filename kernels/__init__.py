"""SageTriton kernels: a plain library (no ComfyUI import).

``sageattn`` is the entry point; ``arch`` holds the per-GPU defaults; ``reference`` the pure-torch
references the tests and benchmarks compare against.
"""
from .api import attention_forward, sageattn
from .arch import ArchInfo, KernelConfig, default_config, detect_arch, resolve_config, supported_choices

__all__ = ["sageattn", "attention_forward", "ArchInfo", "KernelConfig", "default_config", "detect_arch",
           "resolve_config", "supported_choices"]
