"""Direct launches of already compiled Triton kernels, for replayed calls (``replay``).

``kernel[grid](...)`` goes through ``JITFunction.run`` on every launch: it binds and specializes every
argument and looks the compiled kernel up again, ~40 µs for our 20-45 arguments, most of a short
call's host time. A replayed launch has the arguments of a launch ``JITFunction.run`` already made,
but for the call's own tensors, so it can hand them to that compiled kernel's launcher as
``JITFunction.run`` did (its argument list from Triton's own binder) and skip the rest.

This uses Triton internals (the binder in ``device_caches``, ``CompiledKernel.run``'s argument order,
``knobs``), run on a GPU with Triton 3.6 and 3.9 and read in 3.8; anything that does not look as
expected (the launcher's signature included) makes ``direct_launch`` return None, and the launch goes
through ``kernel[grid]`` as before. A direct launch that raises all the same (a Triton whose launcher
takes other arguments) turns direct launches off for its kernel (``disable``): the replay launches
it the normal way, and so do later ones. The new tensors must keep the 16-byte alignment the kernel
was specialized for (``aligned``); replay checks it.
"""
from __future__ import annotations

import inspect
from typing import Optional

from . import failures
from .build_errors import root_cause
from .log import logger

ALIGN = 16  # the pointer divisibility Triton specializes kernels on
# CompiledKernel.run's leading parameters, Triton 3.7-3.9 (3.6 names the first five and takes the rest as *args).
LAUNCH_PARAMS = ("gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata", "launch_metadata",
                 "launch_enter_hook", "launch_exit_hook")

_memory = failures.memory  # .direct_launch: kernel -> why its direct launches are off (the first failure's cause)


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


def launcher_accepts(launch, n_args: int) -> bool:
    """Whether ``launch`` takes the call ``DirectLaunch`` makes: the 9 leading arguments of
    ``LAUNCH_PARAMS`` (in that order, where it names them) and ``n_args`` kernel arguments, positionally."""
    try:
        sig = inspect.signature(launch)
        sig.bind(*range(len(LAUNCH_PARAMS) + n_args))
    except (TypeError, ValueError):  # another call, or a launcher that cannot be inspected: not ours to guess
        return False
    named = [p.name.lower() for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:len(LAUNCH_PARAMS)]
    return named == [n.lower() for n in LAUNCH_PARAMS[:len(named)]]


def disable(kernel, error: BaseException) -> None:
    """A direct launch of ``kernel`` raised: later recordings launch it through ``kernel[grid]``. Logged once."""
    if kernel in _memory.direct_launch:
        return
    _memory.direct_launch[kernel] = why = root_cause(error)
    name = getattr(getattr(kernel, "fn", None), "__name__", None) or getattr(kernel, "__name__", "kernel")
    logger.warning("[SageTriton] direct launch of %s failed (%s); it is launched through Triton from now on "
                   "(a few µs more per call, same results)", name, why)


def disabled(kernel) -> Optional[str]:
    """Why ``kernel``'s direct launches are off, or None."""
    return _memory.direct_launch.get(kernel)


class DirectLaunch:
    """One recorded launch, re-issued through its compiled kernel's launcher."""

    __slots__ = ("kernel", "launch", "grid", "function", "metadata", "stream", "values")

    def __init__(self, launch, grid, function, metadata, stream, values: list, kernel=None):
        self.launch, self.grid, self.function, self.metadata = launch, grid, function, metadata
        self.stream, self.values, self.kernel = stream, values, kernel

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

        if _knobs() is None or compiled is None or len(grid) > 3 or kernel in _memory.direct_launch:
            return None
        launch, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        binder = kernel.device_caches[driver.active.get_current_device()][-1]
        bound, _, _ = binder(*args, **kwargs)
        values = list(bound.values())
    except Exception:  # noqa: BLE001 - another Triton: the launch stays on kernel[grid]
        return None
    if len(values) != len(kernel.params) or not callable(launch) or not launcher_accepts(launch, len(values)):
        return None
    grid = tuple(grid) + (1,) * (3 - len(grid))
    return DirectLaunch(launch, grid, function, metadata, stream, values, kernel)
