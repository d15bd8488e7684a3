"""Direct launches of already compiled Triton kernels, for replayed calls (``replay``).

``kernel[grid](...)`` goes through ``JITFunction.run`` on every launch: it binds and specializes every
argument and looks the compiled kernel up again, ~40 µs for our 20-45 arguments, most of a short
call's host time. A replayed launch has the arguments of a launch ``JITFunction.run`` already made,
but for the call's own tensors, so it can hand them to that compiled kernel's launcher as
``JITFunction.run`` did (its argument list from Triton's own binder) and skip the rest.

This uses Triton internals (the binder in ``device_caches``, ``CompiledKernel.run``'s argument order,
``knobs``), run on a GPU with Triton 3.6 and read in 3.8; anything that does not look as expected makes
``direct_launch`` return None, and the launch goes through ``kernel[grid]`` as before. The new
tensors must keep the 16-byte alignment the kernel was specialized for (``aligned``); replay checks it.
"""
from __future__ import annotations

from typing import Optional

ALIGN = 16  # the pointer divisibility Triton specializes kernels on


def aligned(t) -> bool:
    return t.data_ptr() % ALIGN == 0


def _knobs():
    try:
        from triton import knobs
    except ImportError:  # Triton < 3.4 keeps its launch hooks elsewhere: no direct launches there
        return None
    return knobs if hasattr(knobs, "runtime") else None


def idle_hooks() -> Optional[tuple]:
    """Triton's (enter, exit) launch hooks when neither has anything to call, so a launch needs no
    launch metadata; None while a profiler has set one (its launches then go through ``kernel[grid]``)."""
    knobs = _knobs()
    if knobs is None:
        return None
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    for hook in hooks:
        if hook is not None and getattr(hook, "calls", True):  # Triton 3.6+: an empty HookChain
            return None
    return hooks


class DirectLaunch:
    """One recorded launch, re-issued through its compiled kernel's launcher."""

    __slots__ = ("launch", "grid", "function", "metadata", "stream", "values")

    def __init__(self, launch, grid, function, metadata, stream, values: list):
        self.launch, self.grid, self.function, self.metadata = launch, grid, function, metadata
        self.stream, self.values = stream, values

    def __call__(self, slots: tuple, tensors: tuple, hooks: tuple) -> None:
        """Launch with ``tensors[slot]`` at each ``(pos, slot)`` of ``slots``; ``hooks``: ``idle_hooks()``."""
        values = self.values
        for pos, slot in slots:
            values[pos] = tensors[slot]
        try:
            g = self.grid
            self.launch(g[0], g[1], g[2], self.stream, self.function, self.metadata, None, *hooks, *values)
        finally:
            for pos, _ in slots:  # the call's tensors are not kept alive
                values[pos] = None


def direct_launch(kernel, grid: tuple, args: tuple, kwargs: dict, compiled, stream: int) -> Optional[DirectLaunch]:
    """The launch ``kernel[grid](*args, **kwargs)`` just made (returning ``compiled``) as a DirectLaunch
    on ``stream``; None where this Triton does not look as expected."""
    try:
        from triton.runtime import driver

        if _knobs() is None or compiled is None or len(grid) > 3:
            return None
        launch, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        binder = kernel.device_caches[driver.active.get_current_device()][-1]
        bound, _, _ = binder(*args, **kwargs)
        values = list(bound.values())
    except Exception:  # noqa: BLE001 - another Triton: the launch stays on kernel[grid]
        return None
    if len(values) != len(kernel.params) or not callable(launch):
        return None
    grid = tuple(grid) + (1,) * (3 - len(grid))
    return DirectLaunch(launch, grid, function, metadata, stream, values)
