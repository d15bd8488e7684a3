"""The extra-token router of ``sparse_attn`` (``extra_tokens > 0``; the method: ``sparse_reference``).

``extra_tail_kernel`` works ``QB`` query blocks of one head against every token outside their exact blocks,
scored by the block's centroid (``c_i·(k_t - mu)·scale·log2 e``, cells ``floor(score / BIN)``), in two
passes over K: the top cell per query block with a histogram of the ``NBINS`` cells below it (a ring:
cell x in slot x mod NBINS, the slots that fall out of the window emptied as the top cell rises), and so
how many whole cells fit the budget; then the choice itself: the admitted tokens' indices (ascending,
compacted) and the others' online-softmax state (max, sum, P·V in fp32: weight 1, value v_t), which
replaces the router's pooled tail. Both passes compute the same scores the same way, so they agree on
every token; each walks the router's ascending lists beside the key blocks, so the exact blocks need no
mask. 16-bit K multiplies as it is on the tensor cores (``c·k - c·mu``, the centroid in ``PARTS`` 16-bit
parts: fp32-accurate scores); fp32 K is centred and multiplied at ``SCORE_PREC``.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _centroid_scores(cen0, cen1, cen2, c_mu, mu, k_base, stride_kl, stride_kd, list_rows, ptr, cnt, j, L, D, log2s,
                     i_ok, D_PAD: tl.constexpr, PARTS: tl.constexpr, SCORE_PREC: tl.constexpr,
                     INTERPRETER: tl.constexpr):
    """Scores (QB, 64) of key block ``j``'s tokens, which of them are candidates (outside the exact blocks,
    in range), and each row's position in its ascending list of exact blocks, moved past ``j``."""
    offs_t = j * 64 + tl.arange(0, 64)
    offs_d = tl.arange(0, D_PAD)
    t_ok = offs_t < L
    k = tl.load(k_base + offs_t[:, None].to(tl.int64) * stride_kl + offs_d[None, :] * stride_kd,
                mask=t_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    if PARTS == 0:  # fp32 K: centred, then multiplied at SCORE_PREC
        c = tl.dot(cen0, tl.trans(k.to(tl.float32) - mu[None, :]), input_precision=SCORE_PREC)
    elif INTERPRETER:  # the interpreter's 16-bit dot is wrong; the same products in fp32 are exact
        cen = cen0.to(tl.float32) + cen1.to(tl.float32)
        if PARTS == 3:
            cen += cen2.to(tl.float32)
        c = tl.dot(cen, tl.trans(k.to(tl.float32)), input_precision="ieee") - c_mu[:, None]
    else:  # each part times k is exact, summed in fp32: the centroid's PARTS parts hold its 24 bits
        kt = tl.trans(k)
        s = tl.dot(cen1, kt, tl.dot(cen0, kt))
        if PARTS == 3:
            s = tl.dot(cen2, kt, s)
        c = s - c_mu[:, None]
    c = c * log2s
    listed = tl.load(list_rows + ptr, mask=i_ok & (ptr < cnt), other=-1).to(tl.int32) == j
    outside = i_ok & ~listed
    return c, outside[:, None] & t_ok[None, :], offs_t, ptr + listed.to(tl.int32)


@triton.jit
def _ring(x, NBINS: tl.constexpr):
    """``x`` mod NBINS for the histogram's ring (floored: in [0, NBINS) for negative ``x`` too)."""
    return x - NBINS * tl.floor(x / NBINS)


@triton.jit
def _cells(c, live, BIN: tl.constexpr):
    """Each score's histogram cell ``floor(c / BIN)`` and whether it is counted (a finite live score)."""
    return tl.floor(c / BIN), live & (tl.abs(c) < float("inf"))


@triton.jit
def extra_tail_kernel(
    Cen,  # fp32 (B*H, NB, D_PAD): query centroids
    CenP,  # K's 16-bit dtype (PARTS, B*H, NB, D_PAD): the centroids in parts, summing to them (PARTS 0: unused)
    K, stride_kb, stride_kh, stride_kl, stride_kd,  # (B, H_KV, L, D) any strides, any float dtype
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    Mu,  # fp32 (B*H_KV, D_PAD): K's centre
    List,  # int16/int32 (B*H, NB, NB): the router's exact key blocks per query block, ascending
    Count,  # int32 (B*H, NB): how many
    TailM, TailL,  # fp32 (B*H, NB): written, the per-token tail's max and sum (base 2)
    TailAcc,  # fp32 (B*H, NB, D_PAD): written, its P·V
    Idx,  # int32 (B*H, NB, E): written, the extra tokens (first NExtra of each row), ascending
    NExtra,  # int32 (B*H, NB)
    H, H_KV, L, D, NB, E, log2s,
    QB: tl.constexpr, D_PAD: tl.constexpr, BIN: tl.constexpr, NBINS: tl.constexpr, PARTS: tl.constexpr,
    SCORE_PREC: tl.constexpr, TAIL_PREC: tl.constexpr, INTERPRETER: tl.constexpr, SCAN_STAGES: tl.constexpr,
    TAIL_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    kvh = (bh % H) // (H // H_KV)
    offs_i = pid * QB + tl.arange(0, QB)
    i_ok = offs_i < NB
    offs_d = tl.arange(0, D_PAD)
    cen = tl.load(Cen + (bh.to(tl.int64) * NB + offs_i[:, None]) * D_PAD + offs_d[None, :], mask=i_ok[:, None],
                  other=0.0)
    mu = tl.load(Mu + (b * H_KV + kvh).to(tl.int64) * D_PAD + offs_d)
    if PARTS == 0:
        cen0, cen1, cen2, c_mu = cen, cen, cen, tl.zeros((QB,), tl.float32)
    else:  # the parts loaded as they are: the tensor cores read them from shared memory (split here, they
        # stayed in registers, 96 a thread, and spilled); c·mu once per row in fp32
        part = (bh.to(tl.int64) * NB + offs_i[:, None]) * D_PAD + offs_d[None, :]
        cen0 = tl.load(CenP + part, mask=i_ok[:, None], other=0.0)
        cen1 = tl.load(CenP + NB * D_PAD * tl.num_programs(1) + part, mask=i_ok[:, None], other=0.0)
        cen2 = cen1
        if PARTS == 3:
            cen2 = tl.load(CenP + 2 * NB * D_PAD * tl.num_programs(1) + part, mask=i_ok[:, None], other=0.0)
        c_mu = tl.sum(cen * mu[None, :], axis=1)
    k_base = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh
    list_rows = List + (bh.to(tl.int64) * NB + offs_i) * NB
    cnt = tl.load(Count + bh.to(tl.int64) * NB + offs_i, mask=i_ok, other=0)
    rows = tl.arange(0, QB)

    # 1. the top cell per query block and the ring histogram of the NBINS cells down from it
    top = tl.full((QB,), float("-inf"), tl.float32)
    counts = tl.zeros((QB, NBINS), tl.int32)
    slot = tl.arange(0, NBINS).to(tl.float32)[None, :]
    ptr = tl.zeros((QB,), tl.int32)
    for j in tl.range(0, NB, num_stages=SCAN_STAGES):  # K's tiles prefetched (cp.async) where 2
        c, live, _, ptr = _centroid_scores(cen0, cen1, cen2, c_mu, mu, k_base, stride_kl, stride_kd, list_rows, ptr,
                                           cnt, j, L, D, log2s, i_ok, D_PAD, PARTS, SCORE_PREC, INTERPRETER)
        cell, ok = _cells(c, live, BIN)
        new_top = tl.maximum(top, tl.max(tl.where(ok, cell, float("-inf")), axis=1))
        # slot k holds cell top - age, age = (top - k) mod NBINS; it stays in the window while
        # age < NBINS - rise (a first top, from -inf, gives NaN: cleared, as the counts are 0 then)
        age = _ring(top[:, None] - slot, NBINS)
        counts = tl.where(age < NBINS - (new_top - top)[:, None], counts, 0)
        top = new_top
        counted = ok & (cell > top[:, None] - NBINS)
        key = rows[:, None] * NBINS + tl.where(counted, _ring(cell, NBINS), 0.0).to(tl.int32)
        counts += tl.reshape(tl.histogram(tl.reshape(key, (QB * 64,)), QB * NBINS,
                                          mask=tl.reshape(counted, (QB * 64,))), (QB, NBINS))
    # the whole cells from the top down that fit the budget (once per program, in distance order)
    age = _ring(top[:, None] - slot, NBINS)
    upto = tl.zeros((QB,), tl.int32)
    n_bins = tl.zeros((QB,), tl.int32)
    for d in range(0, NBINS):
        upto += tl.sum(tl.where(age == d, counts, 0), axis=1)
        n_bins += (upto <= E).to(tl.int32)
    n_bins = n_bins.to(tl.float32)

    # 2. the admitted tokens' indices; the others' per-token terms as one online-softmax state
    m = tl.full((QB,), float("-inf"), tl.float32)
    lsum = tl.zeros((QB,), tl.float32)
    acc = tl.zeros((QB, D_PAD), tl.float32)
    n_chosen = tl.zeros((QB,), tl.int32)
    # int32 offsets from one base (64 rows' 64-bit addresses, hoisted out of the loop, spilled)
    idx_base = Idx + (bh.to(tl.int64) * NB + pid * QB) * E
    ptr = tl.zeros((QB,), tl.int32)
    for j in tl.range(0, NB, num_stages=TAIL_STAGES):
        c, live, offs_t, ptr = _centroid_scores(cen0, cen1, cen2, c_mu, mu, k_base, stride_kl, stride_kd, list_rows,
                                                ptr, cnt, j, L, D, log2s, i_ok, D_PAD, PARTS, SCORE_PREC, INTERPRETER)
        cell, ok = _cells(c, live, BIN)
        extra = ok & (top[:, None] - cell < n_bins[:, None])
        sp = tl.where(live & ~extra, c, float("-inf"))
        m_new = tl.maximum(m, tl.max(sp, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_use)
        p = tl.math.exp2(sp - m_use[:, None])  # a NaN score stays NaN: its block comes out NaN
        lsum = lsum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + offs_t[:, None].to(tl.int64) * stride_vl + offs_d[None, :] * stride_vd,
                    mask=(offs_t < L)[:, None] & (offs_d < D)[None, :], other=0.0)
        acc = acc * alpha[:, None]
        if PARTS == 0:
            acc = tl.dot(p, v.to(tl.float32), acc, input_precision=TAIL_PREC)
        else:  # P in two 16-bit parts (one alone rounds the weights to 2^-8 or 2^-11)
            p_hi = p.to(v.dtype)
            p_lo = (p - p_hi.to(tl.float32)).to(v.dtype)
            if INTERPRETER:
                acc = tl.dot(p_hi.to(tl.float32) + p_lo.to(tl.float32), v.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(p_lo, v, tl.dot(p_hi, v, acc))
        m = m_new
        e32 = extra.to(tl.int32)
        n_new = tl.sum(e32, axis=1)
        if tl.max(n_new, axis=0) > 0:  # few key blocks hold extra tokens: the compaction is skipped elsewhere
            run = tl.cumsum(e32, axis=1)  # 1, 2, ... along each row's admitted tokens
            at = tl.arange(0, QB) * E + n_chosen - 1  # per row: no per-element offset is hoisted and spilled
            tl.store(idx_base + (at[:, None] + run), offs_t[None, :],
                     mask=extra & i_ok[:, None] & (run <= (E - n_chosen)[:, None]))
        n_chosen += n_new
    row = bh.to(tl.int64) * NB + offs_i
    tl.store(TailM + row, m, mask=i_ok)
    tl.store(TailL + row, lsum, mask=i_ok)
    tl.store(TailAcc + row[:, None] * D_PAD + offs_d[None, :], acc, mask=i_ok[:, None])
    tl.store(NExtra + row, tl.minimum(n_chosen, E), mask=i_ok)


@triton.jit
def extra_merge_kernel(
    Q, stride_qb, stride_qh, stride_ql, stride_qd,  # (B, H, L, D) the (sign-folded) Q the kernel ran
    K, stride_kb, stride_kh, stride_kl, stride_kd,
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    Mu,  # fp32 (B*H_KV, D_PAD)
    Idx, NExtra,  # the extra tokens per query block (extra_tail_kernel's)
    Out, stride_ob, stride_oh, stride_ol, stride_od,  # the attention kernel's output, merged in place
    Lse,  # fp32 (B*H, L): its natural-log LSE in the centred frame, merged in place
    H, H_KV, L, D, NB, E, scale_log2,
    D_PAD: tl.constexpr, PREC: tl.constexpr, ET: tl.constexpr, F32: tl.constexpr, INTERPRETER: tl.constexpr,
):
    """Each row of one query block attends its block's extra tokens exactly (logits q·(k_t - mu)·scale,
    online softmax in base 2; 16-bit P·V as the dense kernel's fp16 path, fp32 inputs at ``PREC``); the
    result is merged with the kernel's row by log-sum-exp."""
    i = tl.program_id(0)
    bh = tl.program_id(1)
    n = tl.load(NExtra + bh.to(tl.int64) * NB + i)
    if n > 0:
        b = bh // H
        h = bh % H
        kvh = h // (H // H_KV)
        offs_m = i * 64 + tl.arange(0, 64)
        m_ok = offs_m < L
        offs_d = tl.arange(0, D_PAD)
        d_ok = offs_d < D
        q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None].to(tl.int64)
                    * stride_ql + offs_d[None, :] * stride_qd, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        mu = tl.load(Mu + (b * H_KV + kvh).to(tl.int64) * D_PAD + offs_d)
        # q·(k - mu) as q·k - q·mu: 16-bit inputs multiply exactly on the tensor cores (fp32 sums)
        q_mu = tl.sum(q.to(tl.float32) * mu[None, :], axis=1)
        k_base = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh
        m_i = tl.full((64,), float("-inf"), tl.float32)
        l_i = tl.zeros((64,), tl.float32)
        acc = tl.zeros((64, D_PAD), tl.float32)
        for e0 in range(0, n, ET):  # ET extra tokens a step
            offs_e = e0 + tl.arange(0, ET)
            e_ok = offs_e < n
            t = tl.load(Idx + (bh.to(tl.int64) * NB + i) * E + offs_e, mask=e_ok, other=0).to(tl.int64)
            kv_mask = e_ok[:, None] & d_ok[None, :]
            k = tl.load(k_base + t[:, None] * stride_kl + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
            v = tl.load(v_base + t[:, None] * stride_vl + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
            if F32:
                s = tl.dot(q, tl.trans(k), input_precision=PREC)
            elif INTERPRETER:  # the CPU interpreter's bf16 dot is wrong; in fp32 the same products are exact
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(e_ok[None, :], (s - q_mu[:, None]) * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if F32:
                pv = tl.dot(p, v, input_precision=PREC)
            else:  # P in two 16-bit parts (bf16 alone rounds these, the rows' heaviest weights, to 2^-8)
                p_hi = p.to(v.dtype)
                p_lo = (p - p_hi.to(tl.float32)).to(v.dtype)
                if INTERPRETER:
                    pv = tl.dot(p_hi.to(tl.float32) + p_lo.to(tl.float32), v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p_lo, v, tl.dot(p_hi, v))
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        lse2 = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        lse_ptr = Lse + bh.to(tl.int64) * L + offs_m
        lse1 = tl.load(lse_ptr, mask=m_ok, other=0.0)
        top = tl.maximum(lse1, lse2, propagate_nan=tl.PropagateNan.ALL)  # NaN rows stay NaN
        top = tl.where(top == float("-inf"), 0.0, top)
        w1 = tl.exp(lse1 - top)
        w2 = tl.exp(lse2 - top)
        o_ptrs = (Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                  + offs_m[:, None].to(tl.int64) * stride_ol + offs_d[None, :] * stride_od)
        o1 = tl.load(o_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        den = w1 + w2
        out = (o1 * w1[:, None] + acc * (w2 / l_i)[:, None]) / den[:, None]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
        tl.store(lse_ptr, top + tl.log(den), mask=m_ok)
