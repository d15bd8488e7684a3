"""Counters of attention calls: how many ran our kernel, how many fell back and why.

Process-wide totals (``attention_stats()``) plus a per-run tally that the patch node resets at
the start of each sampling run and reports at its end.
"""
from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_total_kernel = 0
_total_fallback: Counter = Counter()


def record_kernel(run: RunTally | None = None) -> None:
    global _total_kernel
    with _lock:
        _total_kernel += 1
    if run is not None:
        run.kernel += 1


def record_fallback(reason: str, run: RunTally | None = None) -> bool:
    """Count a fallback. Returns True the first time ``reason`` is seen in this run (warn once)."""
    with _lock:
        _total_fallback[reason] += 1
    if run is None:
        return False
    first = reason not in run.fallback
    run.fallback[reason] += 1
    return first


def attention_stats() -> dict:
    """``{"kernel": int, "fallback": {reason: int}}`` for every attention call since start."""
    with _lock:
        return {"kernel": _total_kernel, "fallback": dict(_total_fallback)}


def reset_stats() -> None:
    global _total_kernel
    with _lock:
        _total_kernel = 0
        _total_fallback.clear()


class RunTally:
    """Calls of one sampling run."""

    def __init__(self) -> None:
        self.kernel = 0
        self.fallback: Counter = Counter()

    def summary(self) -> dict:
        return {"kernel": self.kernel, "fallback": dict(self.fallback.most_common())}
