"""The block-sparse attention kernel: the dense kernel's tile (``attention._attn_tile``: INT8 Q·Kᵀ, exp2
online softmax, FP8/INT8/16-bit P·V) over each query block's exact key blocks only.

One program per 64-row query block and head. Its online softmax starts from the pooled tail the
router left for the block (``sparse_route.route_kernel``: the rejected blocks' max, sum and P·V, the
same for all 64 rows), moved into the kernel's units (P scaled by 2^P_LOG2, V by its per-channel
scale) and per row into its logits' frame (``TailOff``: K is centred by another vector), then runs
the exact blocks in ascending order from the router's list. Only the last key block can be shorter
than 64 tokens; it runs through the bounds-checked tile, the rest unchecked.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .attention import HOT_LOGIT_LIMIT, HOT_LOGIT_LIMIT_FP8, PV_FP8_C, PV_INT8_C, _attn_tile, finish_rows
from .quant import gdc_wait
from .sparse_tile import attn_pair


@triton.jit
def sparse_attention_kernel(
    Q8, QS, K8, KS, V, VScale, QBias, TailOff, TileBias,
    Out, Lse, KDesc, VDesc,
    List, Count, TailM, TailL, TailAcc,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, H_KV, L, D, NB,
    BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, PV_MODE: tl.constexpr, P_LOG2: tl.constexpr,
    HAS_VSCALE: tl.constexpr, HAS_QBIAS: tl.constexpr, K_SCALAR: tl.constexpr, RETURN_LSE: tl.constexpr,
    EVEN_D: tl.constexpr, INTERPRETER: tl.constexpr, K_TMA: tl.constexpr, V_TMA: tl.constexpr,
    V_T: tl.constexpr, V_RES: tl.constexpr, PDL: tl.constexpr, PAIRS: tl.constexpr,
):
    if PDL:
        gdc_wait()
    BLOCK_N: tl.constexpr = 64
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * H_KV + h // (H // H_KV)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_ok = offs_m < L
    q = tl.load(Q8 + bh.to(tl.int64) * L * D_PAD + offs_m[:, None].to(tl.int64) * D_PAD + offs_d[None, :],
                mask=m_ok[:, None], other=0)
    qs = tl.load(QS + bh.to(tl.int64) * L + offs_m, mask=m_ok, other=0.0)

    k_base = K8 + bhk.to(tl.int64) * L * D_PAD
    if K_SCALAR:
        ks_base = KS + bhk.to(tl.int64) * NB
    else:
        ks_base = KS + bhk.to(tl.int64) * L
    v_base = V + b.to(tl.int64) * stride_vb + (bhk - b * H_KV).to(tl.int64) * stride_vh
    tb_base = TileBias + bhk.to(tl.int64) * NB * D_PAD

    # The pooled tail, in the kernel's units: l and acc in 2^(m - P_LOG2), V over its channel scale.
    row = bh.to(tl.int64) * NB + pid_m
    m_t = tl.load(TailM + row)
    unit = tl.math.exp2(P_LOG2 * 1.0)
    acc_t = tl.load(TailAcc + row * D_PAD + offs_d) * unit
    if HAS_VSCALE:
        vsc = tl.load(VScale + bhk * D + offs_d, mask=offs_d < D, other=1.0)
        acc_t = acc_t / vsc
    # Per row, the tail moved from the router's frame (K centred by the mean of its block means) into the
    # kernel's (K centred as quantized): q·(mu - centre)·scale·log2 e (``sparse_quant``).
    m_i = m_t + tl.load(TailOff + bh.to(tl.int64) * L + offs_m, mask=m_ok, other=0.0)
    # INT8 P·V: the sums' unit, as ``_attn_tile`` keeps it (the hot loop's shift, else the base itself)
    sh_i = m_i if K_SCALAR else m_i - P_LOG2
    l_i = tl.zeros([BLOCK_M], tl.float32) + tl.load(TailL + row) * unit
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32) + acc_t[None, :]

    cnt = tl.load(Count + row)
    list_base = List + row * NB
    n_full = cnt
    ragged = (L % BLOCK_N) != 0
    if ragged:  # the short last key block, if listed, is the list's last entry
        n_full = cnt - (tl.load(list_base + cnt - 1).to(tl.int32) == NB - 1).to(tl.int32)
    # Listed blocks two per step where PAIRS (one row max and one rescale per 128 keys), an odd count's last
    # one alone (an if, not a loop from the pairs' end: that loop spilled 2-10 registers on sm90).
    if PAIRS:
        for t in range(0, n_full - 1, 2):
            acc, l_i, m_i, sh_i = attn_pair(
                acc, l_i, m_i, sh_i, q, qs, tl.load(list_base + t).to(tl.int32) * BLOCK_N,
                tl.load(list_base + t + 1).to(tl.int32) * BLOCK_N, k_base, ks_base, v_base, tb_base, KDesc, VDesc,
                bhk, stride_vn, stride_vd, D, D_PAD, PV_MODE, P_LOG2, EVEN_D, K_SCALAR, INTERPRETER, K_TMA, V_TMA,
                V_T, V_RES)
        if n_full % 2 != 0:
            acc, l_i, m_i, sh_i = _attn_tile(
                acc, l_i, m_i, sh_i, q, qs, offs_m, tl.load(list_base + n_full - 1).to(tl.int32) * BLOCK_N, k_base,
                ks_base, v_base, tb_base, Q8, KDesc, VDesc, bhk, stride_vn, stride_vd, 0, 0, L, L, D,
                BLOCK_N, D_PAD, False, False, 0, PV_MODE, P_LOG2, EVEN_D, K_SCALAR, INTERPRETER,
                K_TMA, V_TMA, V_T, V_RES, True)
    else:
        for t in range(0, n_full):
            acc, l_i, m_i, sh_i = _attn_tile(
                acc, l_i, m_i, sh_i, q, qs, offs_m, tl.load(list_base + t).to(tl.int32) * BLOCK_N, k_base,
                ks_base, v_base, tb_base, Q8, KDesc, VDesc, bhk, stride_vn, stride_vd, 0, 0, L, L, D,
                BLOCK_N, D_PAD, False, False, 0, PV_MODE, P_LOG2, EVEN_D, K_SCALAR, INTERPRETER,
                K_TMA, V_TMA, V_T, V_RES, True)
    if n_full < cnt:
        acc, l_i, m_i, sh_i = _attn_tile(
            acc, l_i, m_i, sh_i, q, qs, offs_m, (NB - 1) * BLOCK_N, k_base, ks_base, v_base, tb_base, Q8, KDesc,
            VDesc, bhk, stride_vn, stride_vd, 0, 0, L, L, D,
            BLOCK_N, D_PAD, True, False, 0, PV_MODE, P_LOG2, EVEN_D, K_SCALAR, INTERPRETER,
            K_TMA, V_TMA, V_T, V_RES, True)

    if K_SCALAR:  # the hot loop's margin, as ``attention_kernel``: rows past it come out NaN, never wrong
        if PV_MODE == PV_INT8_C:
            l_i = tl.where(tl.abs(sh_i) >= HOT_LOGIT_LIMIT - 32.0, float("nan"), l_i)
        else:
            limit: tl.constexpr = HOT_LOGIT_LIMIT_FP8 if PV_MODE == PV_FP8_C else HOT_LOGIT_LIMIT
            l_i = tl.where((tl.abs(m_i) >= limit) & (m_i > float("-inf")), float("nan"), l_i)
    out = finish_rows(acc, l_i, VScale, VScale, bhk, offs_d, D, HAS_VSCALE, False)
    d_ok = offs_d < D
    o_ptrs = (Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
              + offs_m[:, None].to(tl.int64) * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    if RETURN_LSE:
        if PV_MODE == PV_INT8_C:
            u = sh_i - P_LOG2 if K_SCALAR else sh_i
        else:
            u = m_i - P_LOG2
        live = l_i != 0
        lse = tl.where(live, (u + tl.math.log2(tl.where(live, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        if HAS_QBIAS:
            lse += tl.load(QBias + bh.to(tl.int64) * L + offs_m, mask=m_ok, other=0.0)
        tl.store(Lse + bh.to(tl.int64) * L + offs_m, lse, mask=m_ok)
