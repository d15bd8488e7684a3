"""Which device a launch goes to, and which tensors the kernels may read by pointer.

Triton compiles for, and launches on, the *current* device and its current stream. Tensors on
``cuda:1`` while ``cuda:0`` is current (ComfyUI-MultiGPU, core's one-thread-per-GPU work units, a
ring step of a sequence-parallel engine) would be read by a kernel on the wrong device: an illegal
memory access at best. So every launch runs under ``device_scope(t.device)`` of its inputs: the
thread's current device for the length of the call, restored after, never a process-wide
``set_device``. ``wrapped`` names tensor subclasses (``AsyncCollectiveTensor`` and other
``__torch_dispatch__`` wrappers) whose raw pointer is not their data: they go through the
registered custom op, whose dispatcher waits on and unwraps them (``api``).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

# Device types whose launches need the guard (tests add a fake one to see it entered).
GUARDED = ("cuda",)
_NULL = nullcontext()


def _guard(device: torch.device):
    """The context that makes ``device`` current (``torch.cuda.device``: ROCm's torch too)."""
    return torch.cuda.device(device)


def device_scope(device: torch.device):
    """A context under which launches go to ``device`` and its current stream; a no-op for devices
    without a current-device notion (CPU under the interpreter, meta tensors)."""
    if device.type not in GUARDED:
        return _NULL
    if device.index is not None and device.index == torch.cuda.current_device():
        return _NULL  # already current (the common case): no guard object, no device switch, ~2 µs less
    return _guard(device)


def launch_device(args) -> torch.device | None:
    """The device of a launch's first tensor argument (descriptors: their base tensor), None if none."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        base = getattr(a, "base", None)  # Triton's TensorDescriptor
        if isinstance(base, torch.Tensor):
            return base.device
    return None


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def wrapped(*tensors) -> bool:
    """Whether any of ``tensors`` is a wrapper subclass (its own ``__torch_dispatch__``): its storage
    may be a placeholder (an ``AsyncCollectiveTensor`` before its collective is waited on). Plain
    tensors and ``nn.Parameter`` are not."""
    for t in tensors:
        if t is not None and type(t) is not torch.Tensor and \
                getattr(type(t), "__torch_dispatch__", _PLAIN_DISPATCH) is not _PLAIN_DISPATCH:
            return True
    return False


_sm_counts: dict = {}


def sm_count(device) -> int:
    """SMs of ``device`` (the Gluon kernel runs one CTA per SM); 132, an H100/H200's, where there is
    none (cross-compiling on meta tensors). Asked once per device."""
    if device.type != "cuda":
        return 132
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _sm_counts:
        _sm_counts[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _sm_counts[key]
