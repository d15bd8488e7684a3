"""The last wave of the long-sequence kernel, split along the keys so it fills the GPU.

Hopper's Gluon kernel runs one CTA per SM and every CTA does the same work (192 query rows against
all keys), so n CTAs take ceil(n / SMs) waves: at 32K tokens and 12 heads, 2,052 CTAs on 132 SMs
are 15.5 waves, and during the 16th 60 SMs wait. The H200 showed it: 932 TOPS at 31,680 tokens
(15.0 waves) against 895-911 at 32,768 (bench/NOTES.md attempt 28).

``plan_tail`` keeps the whole waves as they are and cuts each CTA of the partial wave into
``splits`` key ranges, launched after the whole CTAs; each leaves its unnormalized output rows, row
max and row sum in a workspace, and ``merge_splits_kernel`` combines them (the flash-decoding
merge) and writes the output. Host-side planning is plain Python; the merge kernel is plain Triton,
so both run on any machine (the CPU tests check them through the interpreter).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .attention import finish_rows

MIN_TILES_PER_SPLIT = 4  # key tiles per share: below this, pipeline fill and the partial writes dominate
MAX_UNITS_PER_SM = 2  # split CTAs at most two per SM: bounds the workspace (2 × SMs × 100 KB at head_dim 128)
SPLIT_COST = 0.01  # per extra share, in whole-CTA times: workspace traffic, merge, ring fill


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
    exercises both kernels (``api.compile_specs``, the install self-test); 2 if none does."""
    for heads in range(2, 2 * n_sms + 2):
        n_whole, splits = plan_tail(ctas_per_head * heads, n_sms, n_tiles)
        if n_whole and splits > 1:
            return heads
    return 2


@triton.jit
def merge_splits_kernel(Part, PartML, VScale, VMean, Out, stride_ob, stride_oh, stride_om, stride_od,
                        H, H_KV, LQ, D, n_whole, splits,
                        CTA_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, D_PAD: tl.constexpr,
                        HAS_VSCALE: tl.constexpr, HAS_VMEAN: tl.constexpr):
    """Output rows of one tail CTA (``BLOCK_R`` of its ``CTA_ROWS``) from its ``splits`` shares.

    Share p of tail CTA t wrote rows ``(t * splits + p) * CTA_ROWS + r`` of Part (fp32 sums of P·V,
    unnormalized) and PartML (row max in base-2 units, row sum of P). All shares scale P alike, so
    weighting each by 2^(m_p - max) gives the softmax over every key.
    """
    pid = tl.program_id(0)
    per_cta: tl.constexpr = CTA_ROWS // BLOCK_R
    t = pid // per_cta
    rr = (pid % per_cta) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, D_PAD)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, D_PAD], tl.float32)
    for p in range(splits):
        prow = ((t * splits + p) * CTA_ROWS + rr).to(tl.int64)
        m_p = tl.load(PartML + prow * 2)
        l_p = tl.load(PartML + prow * 2 + 1)
        m_new = tl.maximum(m, m_p)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_use)
        w = tl.exp2(m_p - m_use)
        acc = acc * alpha[:, None] + tl.load(Part + prow[:, None] * D_PAD + offs_d[None, :]) * w[:, None]
        l_sum = l_sum * alpha + l_p * w
        m = m_new

    cta = n_whole + t
    n_m = tl.cdiv(LQ, CTA_ROWS)
    bh = cta // n_m
    b = bh // H
    h = bh % H
    bhk = b * H_KV + h // (H // H_KV)
    out = finish_rows(acc, l_sum, VScale, VMean, bhk, offs_d, D, HAS_VSCALE, HAS_VMEAN)
    d_ok = offs_d < D
    rows = (cta % n_m) * CTA_ROWS + rr
    o_ptrs = (Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
              + rows[:, None].to(tl.int64) * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < LQ)[:, None] & d_ok[None, :])
