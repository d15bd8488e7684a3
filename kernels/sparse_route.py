"""The routing kernels of ``sparse_attn``: block proxies, then per query block which key blocks are exact.

``pool_kernel`` reads each 64-token block of V once (any strides) and writes its sum, plus V's
per-channel max |v| over the program's blocks (the FP8/INT8 V scale) and the sum of a sample of K's
rows; ``pool_finish_kernel`` reduces those partials into K's centre (which K is quantized around) and V's
scale. Q's centroids and K's block means come from their quantization launches (``sparse_quant``), which
read every row anyway. ``route_kernel`` then works a
tile of query blocks against every key block: proxy scores on the tensor cores, the per-row threshold
from the diagonal variance (no sort), the list of exact key blocks (ascending, compacted with a prefix
sum), and the pooled tail of the rejected blocks reduced to one online-softmax state per query block
(max, sum, P·V in fp32), which the attention kernel starts from. The method: ``sparse_reference``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .quant import _reduce_nan

BLOCK = 64  # tokens per routing block (sparse_reference.BLOCK)
# log2 units a pooled block's TF32 score may be off before the block is attended exactly instead: at logits
# ~1e7 (q, k x3000) pooled weights were off by e^1000s and picked wrong rows; the bench inputs' bound is <= 75
# (error <= 0.07), so real calls never meet it (bench/NOTES.md, "Huge logits in the router").
TF32_SCORE_SLACK = tl.constexpr(1.0)


@triton.jit
def pool_kernel(
    X, stride_xb, stride_xh, stride_xl, stride_xd,
    Out,  # fp32 (B*H, NB, D_PAD): per block sum of V
    AbsMax,  # fp32 (B*H, n_progs, D_PAD): max |v| per channel over this program's blocks (ABSMAX)
    K, stride_kb, stride_kh, stride_kl, stride_kd,
    KSum,  # fp32 (B*H, n_progs, D_PAD): the sum of this program's K_SAMPLE sampled keys (K_SAMPLE > 0)
    H, L, D, NB, blocks_per_prog,
    D_PAD: tl.constexpr, ABSMAX: tl.constexpr, K_SAMPLE: tl.constexpr, INTERPRETER: tl.constexpr,
    MMA_SUMS: tl.constexpr = False,
):
    prog = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, 64)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    if K_SAMPLE > 0:  # evenly spaced keys of the program's span (``sparse_launch.k_sample_count``)
        step = blocks_per_prog * 64 // K_SAMPLE
        offs_k = prog * blocks_per_prog * 64 + tl.arange(0, K_SAMPLE) * step
        k = tl.load(K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
                    + offs_k[:, None].to(tl.int64) * stride_kl + offs_d[None, :] * stride_kd,
                    mask=(offs_k < L)[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        tl.store(KSum + (bh.to(tl.int64) * tl.num_programs(0) + prog) * D_PAD + offs_d, tl.sum(k, axis=0))
    base = X + b.to(tl.int64) * stride_xb + h.to(tl.int64) * stride_xh
    # max |v| kept in V's own dtype (exact): half the registers of fp32 for 16-bit V (sm90: 95 instead of 164
    # a thread, 5 programs per SM instead of 3)
    amax = tl.zeros((64, D_PAD), X.dtype.element_ty)
    if MMA_SUMS:
        ones = tl.full((16, 64), 1.0, tl.float32).to(X.dtype.element_ty)  # (the interpreter has no bf16 full)
    for i in range(0, blocks_per_prog):
        blk = prog * blocks_per_prog + i
        offs_l = blk * 64 + rows
        ok = offs_l < L
        xr = tl.load(base + offs_l[:, None].to(tl.int64) * stride_xl + offs_d[None, :] * stride_xd,
                     mask=ok[:, None] & d_ok[None, :], other=0.0)
        if MMA_SUMS:  # 16-bit V: the column sums as ones times the rows on the tensor cores (exact products, fp32
            # sums; every row of the product the same, so the max picks one exactly), not a cross-warp reduction
            if INTERPRETER:
                total = tl.max(tl.dot(ones.to(tl.float32), xr.to(tl.float32)), axis=0)
            else:
                total = tl.max(tl.dot(ones, xr), axis=0)
        else:
            total = tl.sum(xr.to(tl.float32), axis=0)
        # The mask as a tensor: Triton 3.9's interpreter refuses a scalar one.
        tl.store(Out + (bh.to(tl.int64) * NB + blk) * D_PAD + offs_d, total, mask=(offs_d * 0 + blk) < NB)
        if ABSMAX:
            amax = tl.maximum(amax, tl.abs(xr), propagate_nan=tl.PropagateNan.ALL).to(xr.dtype)
    if ABSMAX:
        tl.store(AbsMax + (bh.to(tl.int64) * tl.num_programs(0) + prog) * D_PAD + offs_d,
                 _reduce_nan(amax.to(tl.float32), 0, True, INTERPRETER))


@triton.jit
def pool_finish_kernel(
    KSum, AbsMax,  # fp32 (B*H_KV, n_progs, D_PAD): pool_kernel's partials
    Centre,  # fp32 (B*H_KV, D_PAD) out: K's centre, the sampled keys' mean
    CentreRot,  # fp32 (B*H_KV, D_PAD) out (ROTATE_TILES): the centre times the rotation's signs
    VScale,  # fp32 (B*H_KV, D) out (ABSMAX): V's per-channel scale
    Signs,  # (D_PAD, D_PAD) the rotation's signs (ROTATE_TILES)
    n_progs, k_count, D,
    D_PAD: tl.constexpr, CHUNK: tl.constexpr, ABSMAX: tl.constexpr, V_RANGE: tl.constexpr, V_POW2: tl.constexpr,
    ROTATE_TILES: tl.constexpr, INTERPRETER: tl.constexpr,
):
    """One program per key/value head: the pool's partials reduced (in a fixed order) into K's centre and V's
    scale, as ``quant._finalize_kv_stats`` makes the dense path's: one launch instead of a dozen small torch ops
    (host time of short calls)."""
    kvh = tl.program_id(0)
    r = tl.arange(0, CHUNK)
    d = tl.arange(0, D_PAD)
    ksum = tl.zeros((CHUNK, D_PAD), tl.float32)
    vmax = tl.full((CHUNK, D_PAD), float("-inf"), tl.float32)
    for p0 in range(0, n_progs, CHUNK):
        ok = (p0 + r < n_progs)[:, None]
        offs = (kvh.to(tl.int64) * n_progs + p0 + r[:, None]) * D_PAD + d[None, :]
        ksum += tl.load(KSum + offs, mask=ok, other=0.0)
        if ABSMAX:
            vmax = tl.maximum(vmax, tl.load(AbsMax + offs, mask=ok, other=float("-inf")),
                              propagate_nan=tl.PropagateNan.ALL)
    centre = tl.sum(ksum, axis=0) / k_count
    tl.store(Centre + kvh.to(tl.int64) * D_PAD + d, centre)
    if ROTATE_TILES:  # subtracted after the tiled product (``sparse_quant``)
        signs = tl.load(Signs + d[:, None] * D_PAD + d[None, :]).to(tl.float32)
        tl.store(CentreRot + kvh.to(tl.int64) * D_PAD + d, tl.sum(centre[:, None] * signs, 0))
    if ABSMAX:
        amax = _reduce_nan(vmax, 0, True, INTERPRETER)
        if V_POW2:  # powers of two keep the scaling exact in fp16
            scale = tl.exp2(tl.ceil(tl.log2(tl.maximum(amax / V_RANGE, 1.0, propagate_nan=tl.PropagateNan.ALL))))
        else:  # a NaN max keeps its NaN: the epilogue's scale then turns that channel NaN in every row, as SDPA
            scale = tl.where(amax > 0, amax / V_RANGE, tl.where(amax == amax, 1.0, amax))
        tl.store(VScale + kvh.to(tl.int64) * D + d, scale, mask=d < D)


@triton.jit
def centre_means_kernel(
    KBar,  # fp32 (B*H_KV, NB, D_PAD): K's block means (its quantization launch's)
    KC,  # fp32 (B*H_KV, NB, D_PAD) out: the block means less their mean mu
    Mu, KVar,  # fp32 (B*H_KV, D_PAD) out: mu and the block means' variance (population), per channel
    NB,
    D_PAD: tl.constexpr, CH: tl.constexpr, CHUNK: tl.constexpr,
):
    """One program per key/value head and CH channels: mu, the variance around it (two passes, as exact as
    ``torch.var_mean``; NaN and Inf propagate the same way) and the centred means the router reads. One launch
    for what were a strided torch reduction and a subtraction (25-35 % of the routing at 32K tokens)."""
    kvh = tl.program_id(1)
    c = tl.program_id(0) * CH + tl.arange(0, CH)
    r = tl.arange(0, CHUNK)
    base = kvh.to(tl.int64) * NB * D_PAD
    total = tl.zeros((CHUNK, CH), tl.float32)
    for b0 in range(0, NB, CHUNK):
        ok = (b0 + r < NB)[:, None]
        total += tl.load(KBar + base + (b0 + r[:, None]) * D_PAD + c[None, :], mask=ok, other=0.0)
    mu = tl.sum(total, axis=0) / NB
    mu = tl.where(tl.abs(mu) < float("inf"), mu, float("nan"))  # an Inf mean is NaN, as torch's Welford var_mean
    sq = tl.zeros((CHUNK, CH), tl.float32)
    for b0 in range(0, NB, CHUNK):
        ok = (b0 + r < NB)[:, None]
        offs = base + (b0 + r[:, None]) * D_PAD + c[None, :]
        x = tl.load(KBar + offs, mask=ok, other=0.0) - mu[None, :]
        tl.store(KC + offs, x, mask=ok)
        sq += tl.where(ok, x * x, 0.0)
    tl.store(Mu + kvh.to(tl.int64) * D_PAD + c, mu)
    tl.store(KVar + kvh.to(tl.int64) * D_PAD + c, tl.sum(sq, axis=0) / NB)


# Fixed-frame tail (``route_kernel``'s FIXED_FRAME): where a row's pooled max lies within this many powers of two
# below its threshold, every term that matters (within 2^-24 of the max) is a normal fp32 number in the
# threshold's frame; otherwise the row's tile redoes its tail online.
FRAME_SPAN = tl.constexpr(64.0)


@triton.jit
def _route_tile(cen, cen_n, kc_base, offs_i, thr, row_sink, j0, NB, log2s, s0, s1, last_len, KB: tl.constexpr,
                D_PAD: tl.constexpr, HAS_THR: tl.constexpr, SCORE_PREC: tl.constexpr):
    """One tile of key blocks for the query blocks ``offs_i``: (key blocks, in range, exact, pooled scores
    (-inf where exact), weights (block lengths)). ``cen_n``: the rows' |centroid|·|log2s| (TF32 only)."""
    offs_d = tl.arange(0, D_PAD)
    offs_j = j0 + tl.arange(0, KB)
    j_ok = offs_j < NB
    kc = tl.load(kc_base + offs_j[:, None] * D_PAD + offs_d[None, :], mask=j_ok[:, None], other=0.0)
    s = tl.dot(cen, tl.trans(kc), input_precision=SCORE_PREC) * log2s
    if HAS_THR:
        exact = s >= thr[:, None]
    else:
        exact = s > thr[:, None]
    diff = offs_j[None, :] - offs_i[:, None]
    exact = exact | ((diff <= 1) & (diff >= -1)) | ((offs_j >= s0) & (offs_j < s1))[None, :] | row_sink[:, None]
    if SCORE_PREC == "tf32":  # a score TF32 may miss by over TF32_SCORE_SLACK (|error| <= 2^-10·|cen||kc|): exact
        kc_n = tl.sqrt(tl.sum(kc * kc, axis=1))
        exact = exact | (cen_n[:, None] * kc_n[None, :] > TF32_SCORE_SLACK * 1024.0)
    exact = exact & j_ok[None, :]
    sp = tl.where(j_ok[None, :] & ~exact, s, float("-inf"))
    return offs_j, j_ok, exact, sp, tl.where(offs_j == NB - 1, last_len, 64.0)


@triton.jit
def _online_step(m, lsum, acc, sp, w, vs, TAIL_PREC: tl.constexpr):
    """The pooled terms of one tile into the online-softmax state (max, sum, P·V)."""
    m_new = tl.maximum(m, tl.max(sp, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m - m_use)
    p = tl.math.exp2(sp - m_use[:, None])
    lsum = lsum * alpha + tl.sum(p * w[None, :], axis=1)
    acc = acc * alpha[:, None] + tl.dot(p, vs, input_precision=TAIL_PREC)
    return m_new, lsum, acc


@triton.jit
def route_kernel(
    Cen,  # fp32 (B*H, NB, D_PAD): query centroids
    KC,  # fp32 (B*H_KV, NB, D_PAD): centred key block means
    VSum,  # fp32 (B*H_KV, NB, D_PAD): value block sums
    KVar,  # fp32 (B*H_KV, D_PAD): per-channel variance of KC over the blocks
    Thr,  # fp32 (B*H, NB): given thresholds (HAS_THR: top-k), else unused
    List,  # int16/int32 (B*H, NB, NB): exact key blocks per query block, ascending, first Count entries
    Count,  # int32 (B*H, NB)
    TailM, TailL,  # fp32 (B*H, NB): the pooled tail's max and sum (weights = block lengths)
    TailAcc,  # fp32 (B*H, NB, D_PAD): its P·V
    H, H_KV, NB, last_len, tau, log2s, s0, s1, q0, q1,
    QB: tl.constexpr, KB: tl.constexpr, D_PAD: tl.constexpr, HAS_THR: tl.constexpr,
    SCORE_PREC: tl.constexpr, TAIL_PREC: tl.constexpr, SCAN_MMA: tl.constexpr = False,
    FIXED_FRAME: tl.constexpr = False, INTERPRETER: tl.constexpr = False,
):
    """FIXED_FRAME: a pooled block's score never exceeds its row's threshold (it would be exact), so the tail
    is summed in the threshold's frame: no running rescale of the sum and P·V per tile, and the P·V product
    accumulates in place; at the end it moves to the pooled max's frame (the online answer up to rounding),
    or, for a tile with a row whose pooled max lies more than FRAME_SPAN below its threshold (or anything
    non-finite), the tail is redone online."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    kvh = b * H_KV + (bh % H) // (H // H_KV)
    offs_i = pid * QB + tl.arange(0, QB)
    i_ok = offs_i < NB
    offs_d = tl.arange(0, D_PAD)
    cen = tl.load(Cen + (bh.to(tl.int64) * NB + offs_i[:, None]) * D_PAD + offs_d[None, :], mask=i_ok[:, None],
                  other=0.0)
    if HAS_THR:
        thr = tl.load(Thr + bh.to(tl.int64) * NB + offs_i, mask=i_ok, other=float("inf"))
    else:
        kvar = tl.load(KVar + kvh.to(tl.int64) * D_PAD + offs_d)
        var = tl.sum(cen * cen * kvar[None, :], axis=1)
        thr = tau * tl.sqrt(var * log2s * log2s + 1e-6)
    row_sink = (offs_i >= q0) & (offs_i < q1)
    cen_n = tl.sqrt(tl.sum(cen * cen, axis=1)) * tl.abs(log2s)
    m = tl.full((QB,), float("-inf"), tl.float32)
    lsum = tl.zeros((QB,), tl.float32)
    acc = tl.zeros((QB, D_PAD), tl.float32)
    cnt = tl.zeros((QB,), tl.int32)
    kc_base = KC + kvh.to(tl.int64) * NB * D_PAD
    vs_base = VSum + kvh.to(tl.int64) * NB * D_PAD
    list_rows = List + (bh.to(tl.int64) * NB + offs_i) * NB
    if SCAN_MMA:  # tri[a, b] = 1 where a <= b: row times it is the inclusive prefix sum (a where: see sparse_quant)
        kk = tl.arange(0, KB)
        tri = tl.where(kk[:, None] <= kk[None, :], 1.0, 0.0).to(tl.float16)
    for j0 in range(0, NB, KB):
        offs_j, j_ok, exact, sp, w = _route_tile(cen, cen_n, kc_base, offs_i, thr, row_sink, j0, NB, log2s, s0, s1,
                                                 last_len, KB, D_PAD, HAS_THR, SCORE_PREC)
        # the exact blocks' indices, compacted: a running count per row plus this tile's prefix sum
        e32 = exact.to(tl.int32)
        if SCAN_MMA:  # the prefix sum as 0/1 times a triangle of ones on the tensor cores (exact up to 2048)
            ef = tl.where(exact, 1.0, 0.0).to(tl.float16)
            if INTERPRETER:
                incl = tl.dot(ef.to(tl.float32), tri.to(tl.float32))
            else:
                incl = tl.dot(ef, tri)
            pos = cnt[:, None] + incl.to(tl.int32) - 1
        else:
            pos = cnt[:, None] + tl.cumsum(e32, axis=1) - 1
        tl.store(list_rows[:, None] + pos, offs_j[None, :].to(List.dtype.element_ty),
                 mask=exact & i_ok[:, None])
        cnt += tl.sum(e32, axis=1)
        # the rejected blocks' pooled terms: weight = block length, value = the block's summed V
        vs = tl.load(vs_base + offs_j[:, None] * D_PAD + offs_d[None, :], mask=j_ok[:, None], other=0.0)
        if FIXED_FRAME:
            m = tl.maximum(m, tl.max(sp, axis=1))
            p = tl.math.exp2(tl.where(sp == float("-inf"), float("-inf"), sp - thr[:, None]))  # NaN stays NaN
            lsum += tl.sum(p * w[None, :], axis=1)
            acc = tl.dot(p, vs, acc, input_precision=TAIL_PREC)
        else:
            m, lsum, acc = _online_step(m, lsum, acc, sp, w, vs, TAIL_PREC)
    if FIXED_FRAME:
        gap = thr - m
        ok = ((m == float("-inf")) | ((gap >= 0.0) & (gap <= FRAME_SPAN))) & (lsum == lsum)  # NaN: online
        if tl.max((i_ok & ~ok).to(tl.int32), axis=0) > 0:  # rare: this tile's tails online, as FIXED_FRAME off
            m = tl.full((QB,), float("-inf"), tl.float32)
            lsum = tl.zeros((QB,), tl.float32)
            acc = tl.zeros((QB, D_PAD), tl.float32)
            for j0 in range(0, NB, KB):
                offs_j, j_ok, exact, sp, w = _route_tile(cen, cen_n, kc_base, offs_i, thr, row_sink, j0, NB, log2s,
                                                         s0, s1, last_len, KB, D_PAD, HAS_THR, SCORE_PREC)
                vs = tl.load(vs_base + offs_j[:, None] * D_PAD + offs_d[None, :], mask=j_ok[:, None], other=0.0)
                m, lsum, acc = _online_step(m, lsum, acc, sp, w, vs, TAIL_PREC)
        else:
            conv = tl.where(ok & (m > float("-inf")), tl.math.exp2(gap), 0.0)  # (rows past NB: not ok, unused)
            lsum = lsum * conv
            acc = acc * conv[:, None]
    tl.store(Count + bh.to(tl.int64) * NB + offs_i, cnt, mask=i_ok)
    tl.store(TailM + bh.to(tl.int64) * NB + offs_i, m, mask=i_ok)
    tl.store(TailL + bh.to(tl.int64) * NB + offs_i, lsum, mask=i_ok)
    tl.store(TailAcc + (bh.to(tl.int64) * NB + offs_i[:, None]) * D_PAD + offs_d[None, :], acc, mask=i_ok[:, None])
