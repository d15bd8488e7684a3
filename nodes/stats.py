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
_last_run: dict | None = None


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
    global _total_kernel, _last_run
    with _lock:
        _total_kernel = 0
        _total_fallback.clear()
        _last_run = None


def set_last_run(summary: dict) -> None:
    """Remember the summary of the sampling run that just ended (read by /sage/status and the UI)."""
    global _last_run
    with _lock:
        _last_run = dict(summary)


def last_run() -> dict | None:
    """Summary of the most recent sampling run of a patched model, or None before the first one."""
    with _lock:
        return None if _last_run is None else dict(_last_run)


class RunTally:
    """Calls of one sampling run."""

    def __init__(self) -> None:
        self.kernel = 0
        self.fallback: Counter = Counter()

    def summary(self) -> dict:
        return {"kernel": self.kernel, "fallback": dict(self.fallback.most_common())}

    @property
    def fallback_total(self) -> int:
        return sum(self.fallback.values())
