"""Layers that name their own attention backend (current ComfyUI's per-layer ``preferred_attention``).

Current core reads an attention method from a checkpoint's metadata per layer (e.g. comfy-kitchen's
INT8 attention) and uses it when no override is set; a per-model override, like the Patch node's, takes
precedence, and core drops the layer's preference before calling the override, so a call cannot be routed
by layer. The pack therefore overrides such layers and says so: this module finds them when a model is
patched (docs/COMPATIBILITY.md, "Layers with a preferred attention").
"""
from __future__ import annotations

from collections import Counter


def preferred_layers(model) -> dict:
    """``{method: layers}`` for the layers of ``model`` (a BaseModel or its diffusion model) whose checkpoint
    names an attention method that is active on this machine, i.e. that core would run without an override.
    Duck-typed (a ``config`` dict naming ``attention`` and a ``function`` set): older ComfyUI has no such
    layers and no class to import."""
    root = getattr(model, "diffusion_model", model)
    counts: Counter = Counter()
    for module in root.modules() if hasattr(root, "modules") else ():
        config = getattr(module, "config", None)
        if isinstance(config, dict) and config.get("attention") and getattr(module, "function", None) is not None:
            counts[str(config["attention"])] += 1
    return dict(counts)


def describe(counts: dict) -> str:
    """'12 layers (comfy_kitchen_int8)' for the run summary and the log."""
    total = sum(counts.values())
    names = ", ".join(f"{name}: {n}" if len(counts) > 1 else name for name, n in sorted(counts.items()))
    return f"{total} layer{'s' if total != 1 else ''} ({names})"
