"""Counters of attention calls: how many ran our kernel, how many fell back and why.

Process-wide totals (``attention_stats()``) plus a per-run tally (``RunLog``) that the patch node
resets at the start of each sampling run and reports at its end (``run_summary``).
"""
from __future__ import annotations

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


class _ThreadCalls(threading.local):
    """The calls this thread counted: lets the non-finite guard take back a forward it discards."""

    kernel = 0
    fallback: Counter | None = None
    rope = 0  # RoPE calls on the pack's kernel
    sparse = 0  # of the kernel calls, those on the sparse kernel, with their densities summed
    density = 0.0
    sparse_dense: Counter | None = None  # calls sparse attention left dense, by reason


_this_thread = _ThreadCalls()


def record_kernel(run: RunTally | None = None) -> None:
    global _total_kernel
    with _lock:  # the run's tally too: threads running forwards of one model share it
        _total_kernel += 1
        if run is not None:
            run.kernel += 1
    _this_thread.kernel += 1


def record_rope(run: RunTally | None = None) -> None:
    """A RoPE call on the pack's kernel (``routing.rope_hooks``)."""
    _this_thread.rope += 1
    if run is not None:
        with _lock:
            run.rope += 1


def record_fallback(reason: str, run: RunTally | None = None, n: int = 1) -> bool:
    """Count ``n`` fallbacks. Returns True the first time ``reason`` is seen in this run (warn once)."""
    mine = _this_thread.fallback
    if mine is None:
        mine = _this_thread.fallback = Counter()
    mine[reason] += n
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
    _this_thread.sparse += 1
    _this_thread.density = _this_thread.density + density
    with _lock:  # the run's tally is shared by threads running forwards of one model
        _total_sparse += 1
        if run is not None:
            run.sparse += 1
            run.density_sum = density if run.density_sum is None else run.density_sum + density


def record_sparse_dense(reason: str, run: RunTally | None = None) -> None:
    """A call sparse attention left to the dense path (a dense step, a short call, ...): not a fallback."""
    mine = _this_thread.sparse_dense
    if mine is None:
        mine = _this_thread.sparse_dense = Counter()
    mine[reason] += 1
    if run is not None:
        with _lock:
            run.sparse_dense[reason] += 1


def thread_calls() -> tuple:
    """(kernel calls, fallbacks by reason, RoPE calls, sparse calls, their density sum, sparse-left-dense by
    reason) counted on this thread so far; see ``take_back``."""
    return (_this_thread.kernel, Counter(_this_thread.fallback or ()), _this_thread.rope, _this_thread.sparse,
            _this_thread.density, Counter(_this_thread.sparse_dense or ()))


def take_back(since: tuple, run: RunTally | None = None) -> None:
    """Uncount this thread's calls after ``since`` (``thread_calls()``): a forward whose result was discarded."""
    global _total_kernel
    kernel = _this_thread.kernel - since[0]
    fallback = Counter(_this_thread.fallback or ())
    fallback.subtract(since[1])
    fallback = +fallback
    with _lock:
        _total_kernel -= kernel
        _total_fallback.subtract(fallback)
        for reason in fallback:
            if _total_fallback[reason] <= 0:
                del _total_fallback[reason]
    rope = _this_thread.rope - since[2]
    _this_thread.kernel, _this_thread.fallback, _this_thread.rope = since[0], Counter(since[1]), since[2]
    if run is not None:
        with _lock:
            run.kernel -= kernel
            run.rope -= rope
            run.fallback.subtract(fallback)
            for reason in fallback:
                if run.fallback[reason] <= 0:
                    del run.fallback[reason]
    _take_back_sparse(since, run)


def _take_back_sparse(since: tuple, run: RunTally | None) -> None:
    global _total_sparse
    sparse = _this_thread.sparse - since[3]
    density = _this_thread.density - since[4]
    dense = Counter(_this_thread.sparse_dense or ())
    dense.subtract(since[5])
    _this_thread.sparse, _this_thread.density, _this_thread.sparse_dense = since[3], since[4], Counter(since[5])
    with _lock:
        _total_sparse -= sparse
        if run is not None and sparse:
            run.sparse -= sparse
            run.density_sum = None if run.sparse == 0 else run.density_sum - density
        if run is not None:
            run.sparse_dense.subtract(+dense)
            run.sparse_dense = +run.sparse_dense


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


class _Watched(threading.local):
    events: Optional[list] = None


class RunLog:
    """One patched model's bookkeeping: the run in progress, if any, and a log line per new fallback reason."""

    def __init__(self) -> None:
        self.current: Optional[RunTally] = None
        # While ``forward_plan`` watches this thread's forward: one entry per call, None for the kernel, else the
        # reason. Per thread: two threads' forwards of one model (a server, MultiGPU work units) each learn their own.
        self._watched = _Watched()

    @property
    def observer(self) -> Optional[list]:
        return self._watched.events

    @observer.setter
    def observer(self, events: Optional[list]) -> None:
        self._watched.events = events

    def begin(self) -> None:
        self.current = RunTally()

    def end(self) -> Optional[RunTally]:
        run, self.current = self.current, None
        return run

    def kernel(self) -> None:
        record_kernel(self.current)
        events = self._watched.events
        if events is not None:
            events.append(None)

    def fallback(self, reason: str, detail: str = "", n: int = 1) -> None:
        """Count it (``n`` calls); log it once per run (the first time the run sees ``reason``), or once per
        process outside runs."""
        events = self._watched.events
        if events is not None:
            events.append(reason)
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
