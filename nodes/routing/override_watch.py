"""Whose attention override runs a patched model's forward: this patch's, or one a later node put there.

ComfyUI keeps one ``optimized_attention_override`` per model, and nodes applied after Patch Model
Attention take the slot without a word: core's "Model Sparse Attention" puts its override on top of ours
(again at every step) and hands the calls it declines down to ours; core's "Model Attention Backend"
(``set_model_optimized_attention``) replaces ours, which then never runs. An APPLY_MODEL wrapper, the
outermost of the patch's, looks at each forward's override: where it is not this patch's, the forward runs
with a counting shim around that override (the same function, arguments and container entry) and the
calls reaching this patch's dispatcher are counted by the usual tallies (held for the forward:
``stats.held_counts``). The run summary then says how many calls the other override ran itself and how
many fell through to SageTriton, or that ours never ran.
"""
from __future__ import annotations

from collections.abc import Callable

from ..reporting import stats
from .dispatch import PatchState

WRAPPER_KEY = "sagetriton_override_watch"
OVERRIDE_KEY = "optimized_attention_override"


def _closure_values(func) -> list:
    values = []
    for cell in getattr(func, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return values


def is_core_sparse(override) -> bool:
    """Core's "Model Sparse Attention" override: a closure over its per-model options object, which
    has ``dense_reason`` (why a call stays dense) and ``installed`` (the overrides it put on the hook)."""
    return any(hasattr(v, "dense_reason") and hasattr(v, "installed") for v in _closure_values(override))


def counting_shim(override: Callable, counter: list) -> Callable:
    """``override`` with each call counted in ``counter[0]``; a container entry only where it has one
    (ComfyUI hands containers to an override with that attribute and tensors to one without)."""

    def counted(func, *args, **kwargs):
        counter[0] += 1
        return override(func, *args, **kwargs)

    inner = getattr(override, "container_function", None)
    if inner is not None:
        def counted_containers(*args, **kwargs):
            counter[0] += 1
            return inner(*args, **kwargs)

        counted.container_function = counted_containers
    return counted


def note_forward(state: PatchState, names: tuple[str, str], calls, reached: int) -> None:
    run = state.run
    if run is None:
        return
    outer = run.outer
    outer["name"], outer["label"] = names
    outer["forwards"] = outer.get("forwards", 0) + 1
    outer["reached"] = outer.get("reached", 0) + reached
    if calls is not None:
        outer["calls"] = outer.get("calls", 0) + calls


def make_override_watch(state: PatchState, describe: Callable) -> Callable:
    """``describe(override)``: (the run summary's name, the panel's label) of another override on top
    (``core_backends.describe_outer``: passed in, as the routing floor does not import core_backends)."""
    def sagetriton_override_watch(executor, *args, **kwargs):
        topts = args[5] if len(args) > 5 else None
        if not isinstance(topts, dict):
            return executor(*args, **kwargs)
        current = topts.get(OVERRIDE_KEY)
        if getattr(current, "sagetriton_state", None) is state:
            return executor(*args, **kwargs)  # ours: the usual case, nothing to watch
        counter = [0]
        if current is not None:  # the forward's own dict (ComfyUI builds one per model call)
            topts[OVERRIDE_KEY] = counting_shim(current, counter)
        try:
            with stats.held_counts() as forward:  # what reached this patch's dispatchers, as kept (the guard)
                return executor(*args, **kwargs)
        finally:
            if current is not None:
                topts[OVERRIDE_KEY] = current
            note_forward(state, describe(current), counter[0] if current is not None else None, forward.calls)

    return sagetriton_override_watch
