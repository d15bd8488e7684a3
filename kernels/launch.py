"""The library's one launch path: every kernel launch goes through ``_launch``, which the installer's
cross-compile check can redirect (``set_launch_hook``) and ``replay`` records. The direct launches of
replayed calls sit beside it (``launcher``)."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Optional

from . import replay
from .devices import device_scope, launch_device


def _cdiv(a: int, b: int) -> int:
    # triton.cdiv is a constexpr function in Triton >= 3.7: ~10 µs of unwrapping per host call.
    return -(-a // b)


# Set by the installer's cross-compile check (``installer.crosscompile.record_launches``): each launch is
# handed to it, with its arguments, instead of being run. None: launch. Read as ``launch.hook`` by the host
# pipeline (a plain attribute: read on every call, where a function call would cost host time).
hook: Optional[Callable] = None


def set_launch_hook(new: Optional[Callable]) -> Optional[Callable]:
    """Route launches to ``new(kernel, grid, args, constexprs, options)`` (None: run them); returns the
    previous hook."""
    global hook
    previous, hook = hook, new
    return previous


def _launch(kernel, grid, args: tuple, constexprs: dict, num_warps: int, num_stages: int = 1, **options) -> None:
    # Triton 3.10 turns fused multiply-adds off by default (3.9 warns about it); the kernels are tuned and
    # checked with them on, and say so rather than inherit the default.
    options.setdefault("enable_fp_fusion", True)
    if hook is not None:
        hook(kernel, grid, args, dict(constexprs), {"num_warps": num_warps, "num_stages": num_stages, **options})
        return
    kwargs = {**constexprs, "num_warps": num_warps, "num_stages": num_stages, **options}
    device = launch_device(args)
    with device_scope(device) if device is not None else nullcontext():  # Triton launches on the current device
        compiled = kernel[grid](*args, **kwargs)
        replay.note_launch(kernel, grid, args, kwargs, compiled)


def _pdl_launch(pdl: bool) -> dict:
    """Launch options for a call's launch after its first (``KernelConfig.pdl``)."""
    return {"launch_pdl": True} if pdl else {}

