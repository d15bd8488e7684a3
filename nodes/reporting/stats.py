"""Counters of attention calls: how many ran our kernel, how many fell back and why.

Process-wide totals (``attention_stats()``) plus a per-run tally (``RunLog``) that the patch node
resets at the start of each sampling run and reports at its end (``run_summary``). A forward's counts can be
held apart until it is kept (``held_counts``): the non-finite guard drops those of a forward it redoes.
"""
from __future__ import annotations

import contextlib
import threading
from collections import Counter
from typing import Optional

from ...kernels.log import logger
from .reasons import POLICY, reason_of

_lock = threading.Lock()
_total_kernel = 0
_total_sparse = 0  # of the kernel calls, those on the sparse kernel
_total_fallback: Counter = Counter()
_last_run: dict | None = None
# The last run of each Patch node (by the prompt's node id): each node in the UI shows its own run.
_runs_by_node: dict[str, dict] = {}
_MAX_NODES = 256


class _Thread(threading.local):
    held: Optional[HeldCounts] = None  # this thread's counts held back (``held_counts``), innermost hold


_this_thread = _Thread()


def record_kernel(run: RunTally | None = None) -> None:
    global _total_kernel
    held = _this_thread.held
    if held is not None:
        held.tally(run).kernel += 1
        return
    with _lock:  # the run's tally too: threads running forwards of one model share it
        _total_kernel += 1
        if run is not None:
            run.kernel += 1


def record_rope(run: RunTally | None = None) -> None:
    """A RoPE call on the pack's kernel (``routing.rope_hooks``)."""
    held = _this_thread.held
    if held is not None:
        held.tally(run).rope += 1
    elif run is not None:
        with _lock:
            run.rope += 1


def record_fallback(reason: str, run: RunTally | None = None, n: int = 1) -> bool:
    """Count ``n`` fallbacks. Returns True the first time ``reason`` is seen in this run (warn once)."""
    held = _this_thread.held
    if held is not None:
        tally = held.tally(run)
        first = run is not None and reason not in run.fallback and reason not in tally.fallback
        tally.fallback[reason] += n
        return first
    with _lock:
        _total_fallback[reason] += n
        if run is None:
            return False
        first = reason not in run.fallback
        run.fallback[reason] += n
    return first


def record_sparse(density, run: RunTally | None = None) -> None:
    """A kernel call (already counted by ``record_kernel``) that ran the sparse kernel, with its density
    (a 0-dim device tensor: summed on the device, read once at the run's end)."""
    global _total_sparse
    held = _this_thread.held
    if held is not None:
        _add_sparse(held.tally(run), 1, density)
        return
    with _lock:  # the run's tally is shared by threads running forwards of one model
        _total_sparse += 1
        if run is not None:
            _add_sparse(run, 1, density)


def _add_sparse(run: RunTally, n: int, density) -> None:
    run.sparse += n
    if density is not None:
        run.density_sum = density if run.density_sum is None else run.density_sum + density


def record_sparse_dense(reason: str, run: RunTally | None = None) -> None:
    """A call sparse attention left to the dense path (a dense step, a short call, ...): not a fallback."""
    held = _this_thread.held
    if held is not None:
        held.tally(run).sparse_dense[reason] += 1
    elif run is not None:
        with _lock:
            run.sparse_dense[reason] += 1


class HeldCounts:
    """One thread's counts held back (``held_counts``), per run tally (None: outside runs)."""

    __slots__ = ("tallies", "outer", "discarded")

    def __init__(self, outer: Optional[HeldCounts]):
        self.tallies: dict = {}
        self.outer = outer  # the hold around this one, where the counts go when kept
        self.discarded = False

    def tally(self, run: RunTally | None) -> RunTally:
        held = self.tallies.get(run)
        if held is None:
            held = self.tallies[run] = RunTally()
        return held

    @property
    def calls(self) -> int:
        """Attention calls held (kernel and fallbacks)."""
        return sum(t.kernel + t.fallback_total for t in self.tallies.values())

    def discard(self) -> None:
        """Never count these: the forward they came from was thrown away."""
        self.discarded = True


@contextlib.contextmanager
def held_counts():
    """Hold this thread's counts from here apart, and count them when the block ends, unless it called
    ``discard()`` (the non-finite guard's discarded forward); an error ending the block keeps them."""
    held = _this_thread.held = HeldCounts(_this_thread.held)
    try:
        yield held
    finally:
        _this_thread.held = held.outer
        if not held.discarded:
            _keep(held)


def _keep(held: HeldCounts) -> None:
    global _total_kernel, _total_sparse
    outer = held.outer
    if outer is not None:
        for run, tally in held.tallies.items():
            _add(outer.tally(run), tally)
        return
    with _lock:
        for run, tally in held.tallies.items():
            _total_kernel += tally.kernel
            _total_fallback.update(tally.fallback)
            _total_sparse += tally.sparse
            if run is not None:
                _add(run, tally)


def _add(run: RunTally, tally: RunTally) -> None:
    run.kernel += tally.kernel
    run.fallback.update(tally.fallback)
    run.rope += tally.rope
    if tally.sparse:
        _add_sparse(run, tally.sparse, tally.density_sum)
    run.sparse_dense.update(tally.sparse_dense)


def attention_stats() -> dict:
    """``{"kernel": int, "fallback": {reason: int}, "sparse": int}`` for every attention call since start
    (sparse: of the kernel calls, those on the sparse kernel)."""
    with _lock:
        return {"kernel": _total_kernel, "fallback": dict(_total_fallback), "sparse": _total_sparse}


def reset_stats() -> None:
    global _total_kernel, _total_sparse, _last_run
    with _lock:
        _total_kernel = 0
        _total_sparse = 0
        _total_fallback.clear()
        _last_run = None
        _runs_by_node.clear()


def set_last_run(summary: dict) -> None:
    """Remember the summary of the sampling run that just ended (read by /sage/status and the UI)."""
    global _last_run
    with _lock:
        _last_run = dict(summary)
        if summary.get("node_id") is not None:
            _runs_by_node.pop(str(summary["node_id"]), None)  # re-inserted last: the oldest go first
            _runs_by_node[str(summary["node_id"])] = dict(summary)
            while len(_runs_by_node) > _MAX_NODES:
                _runs_by_node.pop(next(iter(_runs_by_node)))


def last_run() -> dict | None:
    """Summary of the most recent sampling run of a patched model, or None before the first one."""
    with _lock:
        return None if _last_run is None else dict(_last_run)


def runs_by_node() -> dict[str, dict]:
    """{node id: summary of that Patch node's most recent run}."""
    with _lock:
        return {k: dict(v) for k, v in _runs_by_node.items()}


class RunTally:
    """Calls of one sampling run."""

    def __init__(self) -> None:
        self.kernel = 0
        self.fallback: Counter = Counter()
        self.passed_through = 0  # forwards run without the override (``forward_plan``); their calls in ``fallback``
        self.rope = 0  # RoPE calls on the pack's kernel (``routing.rope_hooks``)
        self.sparse = 0  # kernel calls on the sparse kernel (``routing.sparse_calls``), in ``kernel`` too
        self.density_sum = None  # their densities summed (a device tensor until the run's end)
        self.sparse_dense: Counter = Counter()  # calls sparse attention left dense, by reason
        # Forwards whose attention override was another node's, not this patch's (``routing.override_watch``)
        self.outer: dict = {}  # {"name", "forwards", "calls", "reached"}

    def summary(self) -> dict:
        return {"kernel": self.kernel, "fallback": dict(self.fallback.most_common())}

    @property
    def fallback_total(self) -> int:
        return sum(self.fallback.values())


# Reasons already logged for calls outside a sampling run (no run tally to remember them).
_warned_outside_runs: set[str] = set()


class RunLog:
    """One patched model's bookkeeping: the run in progress, if any, and a log line per new fallback reason."""

    def __init__(self) -> None:
        self.current: Optional[RunTally] = None

    def begin(self) -> None:
        self.current = RunTally()

    def end(self) -> Optional[RunTally]:
        run, self.current = self.current, None
        return run

    def kernel(self) -> None:
        record_kernel(self.current)

    def fallback(self, reason: str, detail: str = "", n: int = 1) -> None:
        """Count it (``n`` calls); log it once per run (the first time the run sees ``reason``), or once per
        process outside runs."""
        if not record_fallback(reason, self.current, n) and self.current is not None:
            return
        if self.current is None and reason in _warned_outside_runs:
            return
        _warned_outside_runs.add(reason)
        log = logger.info if reason_of(reason) in POLICY else logger.warning  # routing policy, not a problem
        log("[SageTriton] attention falls back (%s)%s.", reason, f": {detail}" if detail else "")

    def sparse(self, density) -> None:
        """A kernel call that ran sparse (``kernel()`` counts it as a kernel call)."""
        record_sparse(density, self.current)

    def sparse_dense(self, reason: str) -> None:
        record_sparse_dense(reason, self.current)

    def passed_through(self, reasons: dict) -> None:
        """A forward run without the override: its calls counted under the reasons its first run had."""
        run = self.current
        for reason, n in reasons.items():
            record_fallback(reason, run, n)
        if run is not None:
            with _lock:
                run.passed_through += 1
