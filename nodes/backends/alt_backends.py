"""Sage Settings' ``backend`` choice: run the calls our kernel would take on another installed backend,
to compare them in one workflow. Calls routed to the fallback stay where they were.

Each runner takes ``sageattn``'s arguments (q, k, v in ``tensor_layout``; ``config`` and smoothing
are ours and ignored by the others) and returns the output in ``out_layout``.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Optional

BACKENDS = ("SageTriton", "SageAttention", "comfy-kitchen", "SDPA")
DEFAULT_BACKEND = "SageTriton"
_INSTALL = {"SageAttention": "pip install sageattention (the CUDA SageAttention library)",
            "comfy-kitchen": "pip install comfy-kitchen (ComfyUI's own INT8 attention; CUDA or ROCm builds)"}


def machine_vendor() -> str:
    """"nvidia", "amd" or "cpu": the device ComfyUI computes on (``--cpu`` makes it the CPU where a GPU
    exists), else the one torch sees."""
    import sys

    import torch

    mm = sys.modules.get("comfy.model_management")  # never imported here: bench scripts run without ComfyUI
    try:
        device = mm.get_torch_device() if mm is not None else None
    except Exception:  # noqa: BLE001 - ComfyUI not set up: what torch sees
        device = None
    gpu = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if not gpu:
        return "cpu"
    return "amd" if getattr(torch.version, "hip", None) else "nvidia"


def unavailable_reason(backend: str, vendor: Optional[str] = None) -> Optional[str]:
    """None when ``backend`` can run here, else why not and, where installing helps, the fix. ``vendor``:
    ``machine_vendor()`` unless given. No install advice where the library cannot run anyway (no GPU)."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r} (one of {', '.join(BACKENDS)})"
    module = {"SageAttention": "sageattention", "comfy-kitchen": "comfy_kitchen"}.get(backend)
    if module is None:
        return None
    vendor = vendor or machine_vendor()
    if backend == "SageAttention" and vendor != "nvidia":
        return ("SageAttention is a CUDA library for NVIDIA GPUs; "
                + ("this machine has an AMD GPU" if vendor == "amd" else "this machine computes on its CPU"))
    if backend == "comfy-kitchen" and vendor == "cpu":
        return "comfy-kitchen's INT8 attention needs a CUDA or ROCm GPU; this machine computes on its CPU"
    if importlib.util.find_spec(module) is None:
        return f"{backend} is not installed: {_INSTALL[backend]}"
    if backend == "comfy-kitchen":
        try:
            import comfy_kitchen

            if not comfy_kitchen.int8_attention_is_available():
                return "comfy-kitchen's INT8 attention is not available on this machine (it needs a CUDA or ROCm GPU)"
        except Exception as e:  # noqa: BLE001 - a broken install is "unavailable", with its error
            return f"comfy-kitchen failed to load ({type(e).__name__}: {e})"
    return None


def available_backends() -> list[str]:
    return [b for b in BACKENDS if unavailable_reason(b) is None]


def runs_instead(vendor: str) -> str:
    """What takes a chosen backend's calls where it cannot run: our kernel, or ComfyUI's own attention
    where the kernel does not run either (no GPU, outside the tests' Triton interpreter)."""
    from ...kernels.arch import interpreter_enabled

    return DEFAULT_BACKEND if vendor != "cpu" or interpreter_enabled() else "ComfyUI's own attention"


def unavailable_note(backend: str, why: str, vendor: str) -> str:
    """The sentence for the log and the run summary; its last part ("SageAttention unavailable here →
    ComfyUI") is the nodes' short line, short enough for a node's width."""
    instead = runs_instead(vendor)
    return f"{why}; {backend} unavailable here → {instead if instead == DEFAULT_BACKEND else 'ComfyUI'}"


def backend_choices(vendor: Optional[str] = None) -> dict:
    """Sage Settings' backend choices on this machine (/sage/status ``backends``), {name: {ok, why, short}}."""
    vendor = vendor or machine_vendor()
    out = {}
    for backend in BACKENDS:
        why = unavailable_reason(backend, vendor)
        out[backend] = {"ok": why is None, "why": why or "",
                        "short": "" if why is None else unavailable_note(backend, why, vendor).split("; ")[-1]}
    return out


def _as_hnd(t, layout: str):
    return t if layout == "HND" else t.transpose(1, 2)


def _out(out_hnd, out_layout: str):
    return out_hnd if out_layout == "HND" else out_hnd.transpose(1, 2)


def _sdpa(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, attn_mask=None, out_layout=None, **_):
    import torch  # here: Sage Settings imports this module, and the pack's import stays torch-free

    q, k, v = (_as_hnd(t, tensor_layout) for t in (q, k, v))
    kw = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                           scale=sm_scale, **kw)
    return _out(out, out_layout or tensor_layout)


def _sageattention(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, attn_mask=None, smooth_k=True,
                   out_layout=None, **_):
    import inspect

    from sageattention import sageattn

    if attn_mask is not None and "attn_mask" not in inspect.signature(sageattn).parameters:
        return _sdpa(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, out_layout)  # as ComfyUI does
    q, k, v = (_as_hnd(t, tensor_layout) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:  # as ComfyUI's attention_sage: key/value heads repeated for the library
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    kw = {"attn_mask": attn_mask} if attn_mask is not None else {}
    out = sageattn(q, k, v, tensor_layout="HND", is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k, **kw)
    return _out(out, out_layout or tensor_layout)


def _comfy_kitchen(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, attn_mask=None, out_layout=None,
                   **_):
    import comfy_kitchen

    if is_causal:
        return _sdpa(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, out_layout)
    q, k, v = (_as_hnd(t, tensor_layout) for t in (q, k, v))
    out = comfy_kitchen.int8_attention(q, k, v, scale=sm_scale, attn_mask=attn_mask)
    return _out(out, out_layout or tensor_layout)


_RUNNERS = {"SDPA": _sdpa, "SageAttention": _sageattention, "comfy-kitchen": _comfy_kitchen}


def runner_for(backend: str, vendor: Optional[str] = None) -> tuple[Optional[Callable], Optional[str]]:
    """(runner, None) for an available other backend; (None, None) for SageTriton; (None, why) when
    the choice cannot run here (``runs_instead`` says what does)."""
    if backend == DEFAULT_BACKEND:
        return None, None
    why = unavailable_reason(backend, vendor)
    if why is not None:
        return None, why
    return _RUNNERS[backend], None
