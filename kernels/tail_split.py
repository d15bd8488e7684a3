"""The last wave of the long-sequence kernel, split along the keys so it fills the GPU.

Hopper's Gluon kernel runs one CTA per SM and every CTA does the same work (192 query rows against
all keys), so n CTAs take ceil(n / SMs) waves: at 32K tokens and 12 heads, 2,052 CTAs on 132 SMs
are 15.5 waves, and during the 16th 60 SMs wait (measured: bench/NOTES.md, "Split last wave").

``plan_tail`` keeps the whole waves as they are and cuts each CTA of the partial wave into
``splits`` key ranges, launched after the whole CTAs. The shares of one CTA take turns on its output
rows, in order: share 0 writes its finished rows, and each later one waits for its predecessor's
flag, reads those rows with their row max and row sum, merges its own into them (``merge_rows``)
and writes them back. So no share keeps a private copy of its rows: the workspace is a row max, a
row sum and a flag per warpgroup, where private fp32 rows would take tens of MB. The fixed order
keeps the output deterministic.
Which share a CTA is comes from a ticket it takes as it starts (``hopper_gluon``), so the
predecessor it waits for has always started, whatever order the hardware dispatches CTAs in.
Host-side planning is plain Python and ``merge_rows`` plain Triton, so both run on any machine (the
CPU tests check them through the interpreter).
"""
from __future__ import annotations

import triton
import triton.language as tl

MIN_TILES_PER_SPLIT = 4  # key tiles per share: below this, pipeline fill and the partial writes dominate
MAX_UNITS_PER_SM = 2  # split CTAs at most two per SM: each share past the first waits for the one before
SPLIT_COST = 0.01  # per extra share, in whole-CTA times: the merge in turn, ring fill


def plan_tail(n_cta: int, n_sms: int, n_tiles: int) -> tuple[int, int]:
    """(CTAs that take every key, shares per tail CTA) for ``n_cta`` equal CTAs on ``n_sms`` SMs with
    ``n_tiles`` key tiles each. ``(n_cta, 1)`` when the last wave is full or splitting would not pay."""
    tail = n_cta % n_sms if n_sms > 0 else 0
    if tail == 0:
        return n_cta, 1
    best, best_cost = 1, 1.0  # the tail's time, in whole-CTA times
    max_splits = min(n_tiles // MIN_TILES_PER_SPLIT, MAX_UNITS_PER_SM * n_sms // tail)
    for splits in range(2, max_splits + 1):
        cost = -(-tail * splits // n_sms) / splits + SPLIT_COST * splits
        if cost < best_cost - 1e-9:
            best, best_cost = splits, cost
    return (n_cta - tail, best) if best > 1 else (n_cta, 1)


def heads_with_split_tail(ctas_per_head: int, n_tiles: int, n_sms: int) -> int:
    """The fewest heads (2 or more) at which a call runs both whole and split CTAs, so one call
    exercises both kernels (the cross-compile check, the install self-test); 2 if none does."""
    for heads in range(2, 2 * n_sms + 2):
        n_whole, splits = plan_tail(ctas_per_head * heads, n_sms, n_tiles)
        if n_whole and splits > 1:
            return heads
    return 2


@triton.jit
def merge_rows(o_prev, m_prev, l_prev, o_new, m_new, l_new):
    """Two finished attention outputs of the same query rows over disjoint key ranges, as one over
    both: each weighted by its share of the softmax's denominator (row max ``m`` in base-2 units,
    row sum ``l`` of P scaled by 2^-m). The weights sum to 1, so V's per-channel scale and mean,
    already applied to both, carry through. A range with no live key has ``l == 0`` and weighs 0."""
    m = tl.maximum(m_prev, m_new)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    a = l_prev * tl.exp2(m_prev - m_use)
    b = l_new * tl.exp2(m_new - m_use)
    total = a + b
    inv = 1.0 / tl.where(total > 0, total, 1.0)
    return o_prev * (a * inv)[:, None] + o_new * (b * inv)[:, None], m, total
