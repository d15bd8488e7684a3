"""Dispatch decisions remembered per call signature, so a repeated call costs a dict lookup.

A model calls attention with a few shapes over and over (SDXL: 140 calls per forward, about a dozen
signatures). Whether the kernel takes a call, and where a fallback goes, depends only on what the
signature holds: the tensors' shapes, dtypes and device, the non-tensor arguments and the keyword
names (``transformer_options`` and ComfyUI's wrapper marker excepted), plus things outside the call
that the cache is dropped for when they change: the settings, an earlier override, install.py's
report (its generation). A disabled kernel variant is checked per call (one set lookup).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config.planner import KernelPlan

# Keywords that never change a decision (full-precision steps read transformer_options separately).
PASSIVE_KWARGS = frozenset({"transformer_options", "_inside_attn_wrapper"})
MAX_ENTRIES = 1024  # workloads whose shapes change every call: start over instead of growing

# Where a call goes: ComfyUI's side (its backend or an earlier override), the same with only math SDPA
# (RDNA4), our own SDPA or chunked math-SDPA fallback (these need the bound call), or the kernel; the sparse
# kernel's calls are never cached, but their decisions are told to the forward plan like the others.
COMFY, COMFY_MATH, BOUND, BOUND_MATH, KERNEL, SPARSE = range(6)


class Decision:
    """What the full checks decided for one call signature."""

    __slots__ = ("reason", "route", "plan", "variant")

    def __init__(self, reason: Optional[str], route: int, plan: Optional[KernelPlan], variant: Optional[tuple]):
        self.reason = reason  # the fallback reason counted; None for the kernel
        self.route = route
        self.plan = plan  # the plan the call reached (PatchState.last_plan), if it did
        self.variant = variant  # the kernel's variant key (off while in ``failures.memory.variants``)


def _meta(value):
    """Tensors by shape, dtype and device (a decision never reads their values), other values as they are."""
    return (value.shape, value.dtype, value.device) if isinstance(value, torch.Tensor) else value


def call_signature(args: tuple, kwargs: dict, tensor=torch.Tensor, passive=PASSIVE_KWARGS) -> Optional[tuple]:
    """Everything of ``override(func, *args, **kwargs)``'s arguments a decision reads; None when the call
    is not ComfyUI's usual (q, k, v, heads, ...) with tensors. May hold an unhashable value:
    the lookup (``PatchState.dispatch``) then finds nothing; containers have none (decided in full).
    Written for speed: it runs on every attention call."""
    q = args[0] if args else None
    if not isinstance(q, tensor):
        return None
    try:
        k, v = args[1], args[2]
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device)
    except (IndexError, AttributeError):
        return None
    n = len(args)
    if n == 4 and type(args[3]) is int:  # heads: the usual case
        key += (args[3],)
    elif n == 5 and type(args[3]) is int and args[4] is None:  # heads and no mask (SDXL, SD1.5)
        key += (args[3], 5)  # an int where the form above has a keyword name: the two never meet
    elif n > 3:  # a mask passed by position, or anything unusual
        key += (None, n, *map(_meta, args[3:]))  # None: never an int heads
    for name, value in kwargs.items():
        if name not in passive:
            key += (name, value) if not isinstance(value, tensor) else (name, value.shape, value.dtype, value.device)
    return key


def put_bounded(entries: dict, key, value, limit: int) -> None:
    """Store ``value`` under ``key`` unless the key cannot be hashed; a full dict starts over instead of growing."""
    try:
        hash(key)
    except TypeError:
        return
    if len(entries) >= limit:
        entries.clear()
    entries[key] = value


class CallCache:
    """Decisions by call signature, valid for one (settings, earlier override, report generation)."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Decision] = {}
        self.settings = self.previous = self.generation = None  # what the entries were decided under

    def reset(self, settings, previous, generation) -> None:
        """Forget every decision: the settings, the earlier override or the report changed."""
        self.entries.clear()
        self.settings, self.previous, self.generation = settings, previous, generation

    def put(self, key, decision: Decision) -> None:
        put_bounded(self.entries, key, decision, MAX_ENTRIES)

    def __len__(self) -> int:
        return len(self.entries)
