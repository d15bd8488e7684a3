"""A valid report's answers for the runtime as a typed, frozen value, parsed once each time the report file is
read (``report._current``: once per file change), so no question walks the raw dict again."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def entry_seq_len(cross: dict) -> Optional[int]:
    """The dispatcher's key length from one crossover entry (``selftest.measure_crossovers``)."""
    if cross.get("kernel_never_faster"):
        # Slower at every measured length: SDPA up to twice the longest one (the kernel may still win beyond).
        longest = max((t["seq_len"] for t in cross.get("timings", []) if "seq_len" in t), default=None)
        return None if longest is None else 2 * longest
    return cross.get("seq_len")


def _nearest(sizes, head_dim: int) -> int:
    """The measured head size nearest ``head_dim``, the larger one on a tie."""
    return min(sizes, key=lambda d: (abs(d - head_dim), -d))


@dataclass(frozen=True)
class ReportFacts:
    """What the runtime asks of a report; the defaults are the answers without one."""

    disabled_variants: frozenset = frozenset()  # ``report.variant_name`` of each variant that failed here
    sdpa_default_safe: Optional[bool] = None  # RDNA4's SDPA probe; None: not probed
    long_sequence_kernel_failed: bool = False
    rope_kernel_failed: bool = False
    crossovers: tuple = ()  # ((head size, key length or None), ...) as measured per head size
    crossover: Optional[int] = None  # the key length of a crossover that names no head size
    pv_choices: tuple = ()  # ((head size, precision or None, ((precision, ms), ...)), ...)

    def crossover_seq_len(self, head_dim: int = 128) -> Optional[int]:
        """The measured key length for the nearest measured head size; None: not measured."""
        if not self.crossovers:
            return self.crossover
        by_dim = dict(self.crossovers)
        return by_dim[_nearest(by_dim, head_dim)]

    def pv_choice(self, head_dim: int = 128) -> Optional[tuple]:
        """(precision, {precision: ms}) timed fastest at the nearest measured head size, or None."""
        if not self.pv_choices:
            return None
        by_dim = {d: (choice, ms) for d, choice, ms in self.pv_choices}
        choice, ms = by_dim[_nearest(by_dim, head_dim)]
        return (choice, dict(ms)) if choice else None


NO_FACTS = ReportFacts()


def _check_failed(report: dict, field: str) -> bool:
    """Whether the kernel install.py checked on its own under ``field`` failed that check here. Running out
    of memory during the check says nothing about the kernel."""
    r = report.get(field) or {}
    return r.get("ok") is False and not r.get("oom")


def crossover_entries(cross: dict) -> tuple:
    """((head size, key length), ...) of a crossover result, its by-head-size entries first (the top level's
    own head size where no entry has it)."""
    by_dim = {int(d): c for d, c in (cross.get("by_head_dim") or {}).items()}
    if cross.get("head_dim") is not None:
        by_dim.setdefault(int(cross["head_dim"]), cross)
    return tuple((d, entry_seq_len(c)) for d, c in by_dim.items())


def _pv_choices(report: dict) -> tuple:
    by = (report.get("pv_choice") or {}).get("by_head_dim") or {}
    # A key not written as its own number ("064") names a size no lookup finds: measured, but no choice.
    entries = {int(d): (None, ()) for d in by}
    entries.update({int(d): (e.get("choice"), tuple(e.get("ms", {}).items()))
                    for d, e in by.items() if str(int(d)) == d})
    return tuple((d, choice, ms) for d, (choice, ms) in entries.items())


def _guarded(default, fn, *args):
    """``fn(*args)``, or ``default`` where a value the validation let by still does not parse: each answer falls
    back on its own, as each question did when it read the dict."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - a report must never break sampling
        return default


def parse(report: Optional[dict]) -> ReportFacts:
    """``report`` (valid: ``report_validation.report_problem`` passed) as ReportFacts; None: no report."""
    if report is None:
        return NO_FACTS
    cross = report.get("crossover") or {}
    entries = _guarded(None, crossover_entries, cross)
    return ReportFacts(
        disabled_variants=_guarded(frozenset(), lambda: frozenset(report.get("disabled_variants", ()))),
        sdpa_default_safe=report.get("sdpa_default_safe"),
        long_sequence_kernel_failed=_guarded(False, _check_failed, report, "long_sequence_kernel"),
        rope_kernel_failed=_guarded(False, _check_failed, report, "rope_kernel"),
        crossovers=entries or (),
        crossover=_guarded(None, entry_seq_len, cross) if entries == () else None,
        pv_choices=_guarded((), _pv_choices, report),
    )
