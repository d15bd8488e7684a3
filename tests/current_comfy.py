"""Current ComfyUI's (0.38.x) attention conventions, emulated for tests on an older ComfyUI.

Written here from the behaviour current ComfyUI's source documents (nothing copied): the single-owner
q/k/v holder, ``wrap_attn``'s dispatch of holders, and ``ModelPatcher.set_model_optimized_attention``
(what core's "Model Attention Backend" node calls with a backend picked from the registry by name).
"""
from __future__ import annotations

import json

import torch


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
    """Current ComfyUI's ``wrap_attn`` behaviour, as documented in its source: a model's override first
    (the layer's preference is dropped before it is called), else the layer's preferred backend when it is
    active, else ``func``."""

    def wrapper(*args, **kwargs):
        preferred = kwargs.pop("preferred_attention", None)
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
            if preferred is not None and preferred.function is not None:
                return preferred.function(*args, **kwargs)
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


class PreferredAttentionLayer(torch.nn.Module):
    """Current core's per-layer attention choice: a checkpoint stores ``<prefix>config`` (JSON bytes as a
    uint8 tensor) naming an ``attention`` method; loading it sets ``config`` and, where that method is
    available on the device, ``function`` (the backend ``wrap_attn`` then calls for this layer). The
    model passes the layer as ``preferred_attention=`` to every attention call it makes.
    ``available``: method name -> backend, what this emulated machine can run."""

    def __init__(self, available: dict):
        super().__init__()
        self.available = available
        self.config = None
        self.function = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        self.config, self.function = None, None
        raw = state_dict.pop(prefix + "config", None)
        if raw is not None:
            config = json.loads(bytes(raw.tolist()).decode("utf-8"))
            if config.get("attention") in self.available:
                self.config = config
                self.function = self.available[config["attention"]]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def layer_config_tensor(config: dict) -> torch.Tensor:
    """What a checkpoint holds under ``<prefix>config``."""
    return torch.tensor(list(json.dumps(config).encode("utf-8")), dtype=torch.uint8)
