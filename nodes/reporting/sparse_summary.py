"""The run summary's sparse-attention and override-on-top parts (``routing.sparse_calls``,
``routing.override_watch``): plain data in, a dict entry and one clause of text out."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..routing.dispatch import PatchState
    from .stats import RunTally

CORE_SPARSE = "core's Model Sparse Attention"
TOP_DENSE_REASONS = 3


def sparse_summary(state: PatchState, run: RunTally) -> Optional[dict]:
    """``{"mode", "calls", "density", "dense", "notes"}`` when Sage Settings asked for sparse attention."""
    settings = state.settings.sparse
    if not settings.enabled:
        return None
    off = state.composition.get("sparse_off")
    density = None
    if run.sparse and run.density_sum is not None:
        density = float(run.density_sum) / run.sparse  # the run's one host read of the densities
    router = state.sparse
    return {"mode": settings.describe(), "calls": run.sparse, "density": density,
            "dense": dict(run.sparse_dense.most_common()), "off": off,
            "notes": list(router.notes) if router is not None else []}


def sparse_text(sparse: dict) -> str:
    if sparse.get("off"):
        return sparse["off"]
    text = f"sparse ({sparse['mode']}): {sparse['calls']} calls"
    if sparse.get("density") is not None:
        text += f", {sparse['density'] * 100:.1f} % of key blocks exact"
    dense = sparse.get("dense") or {}
    if dense:
        text += ", left dense: " + ", ".join(f"{r}: {n}" for r, n in list(dense.items())[:TOP_DENSE_REASONS])
        if len(dense) > TOP_DENSE_REASONS:
            text += f" (+{len(dense) - TOP_DENSE_REASONS} more reasons)"
    for note in sparse.get("notes") or ():
        text += f"; {note}"
    return text


def outer_summary(outer: dict) -> Optional[dict]:
    """Who ran the calls when another node's override was on top of ours, or None."""
    if not outer:
        return None
    calls, reached = outer.get("calls"), outer.get("reached", 0)
    summary = {"name": outer["name"], "label": outer.get("label", outer["name"]), "forwards": outer["forwards"],
               "calls": calls, "reached": reached,
               "ran_itself": None if calls is None else max(0, calls - reached), "ours_unused": reached == 0}
    summary["text"] = outer_text(summary)
    return summary


def outer_text(outer: dict) -> str:
    """One clause of the run summary (the panel shows the same words) about the override on top of ours."""
    name = outer["name"]
    if outer["ours_unused"]:
        ran = f"ran all {outer['calls']} attention calls" if outer.get("calls") is not None else "ran the calls"
        if name == CORE_SPARSE:  # it puts itself on top at every step; ours serves the calls it declines
            return f"{name} {ran} itself; none was left to SageTriton"
        return (f"Patch Model Attention's override did not run: {name}, set after it, {ran} (put Patch Model "
                "Attention after it, or bypass one)")
    if outer.get("calls") is None:
        return f"{name} was on the hook; {outer['reached']} calls reached SageTriton"
    return f"{name} ran {outer['ran_itself']} calls itself, {outer['reached']} fell through to SageTriton"


def sparse_and_outer(state: PatchState, run: RunTally) -> dict:
    """The two summary entries (absent when they have nothing to say: older readers see no change)."""
    out = {}
    sparse = sparse_summary(state, run)
    if sparse is not None:
        out["sparse"] = sparse
    outer = outer_summary(run.outer)
    if outer is not None:
        out["outer"] = outer
    return out
