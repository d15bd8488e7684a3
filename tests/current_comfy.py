"""Current ComfyUI's (0.38.x) attention conventions, emulated for tests on an older ComfyUI.

Written here from the behaviour current ComfyUI's source documents (nothing copied): the single-owner
q/k/v holder, ``wrap_attn``'s dispatch of holders, and ``ModelPatcher.set_model_optimized_attention``
(what core's "Model Attention Backend" node calls with a backend picked from the registry by name).
"""
from __future__ import annotations


class Holder:
    """A single-owner tensor holder with current ComfyUI's documented interface."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def peek(self):
        if self.tensor is None:
            raise RuntimeError("holder already consumed")
        return self.tensor

    def take(self):
        tensor = self.peek()
        self.tensor = None
        return tensor


def current_wrap_attn(func):
    """Current ComfyUI's ``wrap_attn`` behaviour, as documented in its source."""

    def wrapper(*args, **kwargs):
        kwargs.pop("preferred_attention", None)
        holders = len(args) >= 3 and isinstance(args[0], Holder)
        if "_inside_attn_wrapper" not in kwargs:
            kwargs = {**kwargs, "_inside_attn_wrapper": True}
            override = (kwargs.get("transformer_options") or {}).get("optimized_attention_override")
            if override is not None:
                if holders:
                    if hasattr(override, "container_function"):
                        return override.container_function(*args, **kwargs)
                    args = tuple(h.take() for h in args[:3]) + args[3:]
                return override(func, *args, **kwargs)
        if holders:
            if wrapper.container_function is not None:
                return wrapper.container_function(*args, **kwargs)
            args = tuple(h.take() for h in args[:3]) + args[3:]
        return func(*args, **kwargs)

    wrapper.container_function = None
    return wrapper



def set_model_optimized_attention(patcher, backend) -> None:
    """Current ModelPatcher's per-model backend: an override that ignores ``func`` and calls ``backend``,
    carrying the backend's ``container_function`` where it has one."""

    def optimized_attention_override(_, *args, **kwargs):
        return backend(*args, **kwargs)

    if getattr(backend, "container_function", None) is not None:
        optimized_attention_override.container_function = backend.container_function
    patcher.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = \
        optimized_attention_override
