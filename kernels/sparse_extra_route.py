"""The extra-token router of ``sparse_attn`` (``extra_tokens > 0``; the method: ``sparse_reference``).

``extra_tail_kernel`` works a tile of query blocks of one head against every token outside their exact
blocks, scored by the block's centroid (``c_i·(k_t - mu)·scale·log2 e``), in three passes over K:
the best score per query block, then the cumulative histogram of whole ``BIN``-wide bins below it
(``NBINS`` of them) and so how many bins fit the budget, then the choice itself: the admitted tokens'
indices (ascending, compacted) and the others' online-softmax state (max, sum, P·V in fp32: weight 1,
value v_t), which replaces the router's pooled tail. Each pass recomputes the same scores the same way,
so the three agree on every token.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _centroid_scores(cen, mu, k_base, stride_kl, stride_kd, ex_rows, j, L, D, log2s, i_ok,
                     D_PAD: tl.constexpr, SCORE_PREC: tl.constexpr):
    """Scores (QB, 64) of key block ``j``'s tokens and which of them are candidates (outside, in range)."""
    offs_t = j * 64 + tl.arange(0, 64)
    offs_d = tl.arange(0, D_PAD)
    t_ok = offs_t < L
    k = tl.load(k_base + offs_t[:, None].to(tl.int64) * stride_kl + offs_d[None, :] * stride_kd,
                mask=t_ok[:, None] & (offs_d < D)[None, :], other=0.0).to(tl.float32)
    c = tl.dot(cen, tl.trans(k - mu[None, :]), input_precision=SCORE_PREC) * log2s
    outside = tl.load(ex_rows + j, mask=i_ok, other=1) == 0
    return c, outside[:, None] & t_ok[None, :], offs_t


@triton.jit
def extra_tail_kernel(
    Cen,  # fp32 (B*H, NB, D_PAD): query centroids
    K, stride_kb, stride_kh, stride_kl, stride_kd,  # (B, H_KV, L, D) any strides, any float dtype
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    Mu,  # fp32 (B*H_KV, D_PAD): K's centre
    Exact,  # int8 (B*H, NB, NB): 1 where the key block is exact for the query block
    TailM, TailL,  # fp32 (B*H, NB): written, the per-token tail's max and sum (base 2)
    TailAcc,  # fp32 (B*H, NB, D_PAD): written, its P·V
    Idx,  # int32 (B*H, NB, E): written, the extra tokens (first NExtra of each row), ascending
    NExtra,  # int32 (B*H, NB)
    H, H_KV, L, D, NB, E, log2s,
    QB: tl.constexpr, D_PAD: tl.constexpr, BIN: tl.constexpr, NBINS: tl.constexpr,
    SCORE_PREC: tl.constexpr, TAIL_PREC: tl.constexpr,
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
    k_base = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh
    ex_rows = Exact + (bh.to(tl.int64) * NB + offs_i) * NB

    # 1. the best candidate score per query block
    best = tl.full((QB,), float("-inf"), tl.float32)
    for j in range(0, NB):
        c, live, _ = _centroid_scores(cen, mu, k_base, stride_kl, stride_kd, ex_rows, j, L, D, log2s, i_ok,
                                      D_PAD, SCORE_PREC)
        best = tl.maximum(best, tl.max(tl.where(live, c, float("-inf")), axis=1))

    # 2. a histogram of the bins below it per query block (one flat histogram: row * 2·NBINS + bin, the
    # tokens in no bin counted in each row's last slot), then the whole bins that fit the budget
    counts = tl.zeros((QB, 2 * NBINS), tl.int32)
    for j in range(0, NB):
        c, live, _ = _centroid_scores(cen, mu, k_base, stride_kl, stride_kd, ex_rows, j, L, D, log2s, i_ok,
                                      D_PAD, SCORE_PREC)
        bins = tl.floor((best[:, None] - c) / BIN)
        bins = tl.where(live & (bins < NBINS), bins, 2 * NBINS - 1).to(tl.int32)  # NaN scores: in no bin
        key = tl.arange(0, QB)[:, None] * (2 * NBINS) + bins
        counts += tl.reshape(tl.histogram(tl.reshape(key, (QB * 64,)), QB * 2 * NBINS), (QB, 2 * NBINS))
    upto = tl.cumsum(counts, axis=1)  # tokens in bins 0..b
    in_range = tl.arange(0, 2 * NBINS) < NBINS
    n_bins = tl.sum(((upto <= E) & in_range[None, :]).to(tl.int32), axis=1).to(tl.float32)

    # 3. the admitted tokens' indices; the others' per-token terms as one online-softmax state
    m = tl.full((QB,), float("-inf"), tl.float32)
    lsum = tl.zeros((QB,), tl.float32)
    acc = tl.zeros((QB, D_PAD), tl.float32)
    cnt = tl.zeros((QB,), tl.int32)
    idx_rows = Idx + (bh.to(tl.int64) * NB + offs_i) * E
    for j in range(0, NB):
        c, live, offs_t = _centroid_scores(cen, mu, k_base, stride_kl, stride_kd, ex_rows, j, L, D, log2s, i_ok,
                                           D_PAD, SCORE_PREC)
        extra = live & (tl.floor((best[:, None] - c) / BIN) < n_bins[:, None])
        sp = tl.where(live & ~extra, c, float("-inf"))
        m_new = tl.maximum(m, tl.max(sp, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_use)
        p = tl.math.exp2(sp - m_use[:, None])  # a NaN score stays NaN: its block comes out NaN
        lsum = lsum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + offs_t[:, None].to(tl.int64) * stride_vl + offs_d[None, :] * stride_vd,
                    mask=(offs_t < L)[:, None] & (offs_d < D)[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=TAIL_PREC)
        m = m_new
        e32 = extra.to(tl.int32)
        pos = cnt[:, None] + tl.cumsum(e32, axis=1) - 1
        tl.store(idx_rows[:, None] + pos, offs_t[None, :], mask=extra & i_ok[:, None])
        cnt += tl.sum(e32, axis=1)
    row = bh.to(tl.int64) * NB + offs_i
    tl.store(TailM + row, m, mask=i_ok)
    tl.store(TailL + row, lsum, mask=i_ok)
    tl.store(TailAcc + row[:, None] * D_PAD + offs_d[None, :], acc, mask=i_ok[:, None])
    tl.store(NExtra + row, cnt, mask=i_ok)
