"""The attention kernel: INT8 Q·Kᵀ, online softmax in exp2, FP16/BF16, FP8 or INT8 P·V.

One portable Triton source for every architecture (pointer loads, no vendor intrinsics). Q and K
arrive pre-quantized by ``quant.py`` with per-token scales that already hold sm_scale·log2(e), so a
logit is ``int32_dot * q_scale[m] * k_scale[n]`` in base-2 units.

Per-tile work is split in two loops: full tiles with no bounds checks, then the tiles that cross
the key length or the causal diagonal. Masks are read through strides (0 for broadcast dims), so a
broadcast mask is never materialised.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .quant import P_OFFSET, gdc_wait, mma_operand_order, round_p_offset_int8, to_fp8

# P·V modes.
PV_16BIT = 0  # P and V in 16-bit, accumulated in fp32 by the MMA
PV_16BIT_TILE = 1  # fp16 MMA accumulation per tile, added into the fp32 accumulator
PV_FP8 = 2  # P and V in fp8, a fresh accumulator per tile added into fp32 (two-level)
PV_INT8 = 3  # P in 0..255 per row and tile, V in ±127 per channel, an exact int32 sum per tile
INT8_SHIFT_FLOOR = tl.constexpr(20.0)  # base-2 logits below the running max where INT8 P stops following a tile
# The hot loop's one-FMA logits round at ~2^-24 of their size. Below this (base 2) INT8 P's margin keeps
# its largest weight within 142..255 and 16-bit P exact; fp8 P (448 at most) allows 2^18. A row whose max
# reaches it is made NaN (``attention_kernel``). Real models stay far below (2^18 base 2 = 180,000 nats).
HOT_LOGIT_LIMIT = tl.constexpr(2097152.0)
HOT_LOGIT_LIMIT_FP8 = tl.constexpr(262144.0)
P_SLACK = tl.constexpr(0.0028)  # log2(255.5 / 255): how far above 2^P_LOG2 the largest P may round

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
# The modes by name in the kernels too (a @triton.jit function reads only constexpr globals): the host passes
# the ints above as PV_MODE / MASK_KIND, the kernels compare them with these.
PV_16BIT_C, PV_16BIT_TILE_C, PV_FP8_C, PV_INT8_C = map(tl.constexpr, (PV_16BIT, PV_16BIT_TILE, PV_FP8, PV_INT8))
MASK_NONE_C, MASK_BOOL_C, MASK_ADD_C = map(tl.constexpr, (MASK_NONE, MASK_BOOL, MASK_ADD))


@triton.jit
def _masked_logits(x, offs_m, offs_n, mask_base, stride_mm, stride_mn, LQ, LK,
                   BOUNDARY: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr):
    """Base-2 logits with the mask, key bounds and causality applied (-inf where dropped)."""
    if MASK_KIND != MASK_NONE_C:
        m_ptrs = mask_base + offs_m[:, None].to(tl.int64) * stride_mm + offs_n[None, :].to(tl.int64) * stride_mn
        m_ok = (offs_m[:, None] < LQ) & (offs_n[None, :] < LK)
        if MASK_KIND == MASK_BOOL_C:
            keep = tl.load(m_ptrs, mask=m_ok, other=0) != 0
            # Added rather than selected so a NaN logit stays NaN under a mask, as in SDPA.
            x = x + tl.where(keep, 0.0, float("-inf"))
        else:
            # ComfyUI masks with -finfo(float32).max: times log2(e) that overflows to -inf, and a row
            # masked that way would become all -inf (zeros) where SDPA averages V. Clamped first; -inf
            # stays -inf, so a row mixing both (HunyuanVideo's text refiner adds two -max masks, which
            # overflow) averages only its -max keys, as SDPA does.
            m = tl.load(m_ptrs, mask=m_ok, other=0.0).to(tl.float32)
            m = tl.where(m == float("-inf"), m, tl.maximum(m, -2.0e38, propagate_nan=tl.PropagateNan.ALL))
            x = x + m * 1.4426950408889634
    if BOUNDARY:
        x = tl.where(offs_n[None, :] < LK, x, float("-inf"))
        if IS_CAUSAL:
            x = tl.where(offs_n[None, :] <= offs_m[:, None], x, float("-inf"))
    return x


@triton.jit
def int8_p_shift(t_max, m_use):
    """INT8 P's shift: this tile's own row max, so its largest weight rounds to 2^P_LOG2 (255), but
    within 2^-INT8_SHIFT_FLOOR of the running max m_use, where a tile's weights round to 0 anyway, so
    the sums cannot overflow. Raised by a few ulps of the logits' size, which their rounding can
    reach: that largest weight never rounds to 256, which int8 would wrap to -128. Rows whose logits
    reach ``HOT_LOGIT_LIMIT`` (margin 0.84) are made NaN after the loop, see ``attention_kernel``.
    NaN-propagating, so a NaN logit turns its row NaN (INT8 P would round NaN to a number)."""
    shift = tl.maximum(t_max, m_use - INT8_SHIFT_FLOOR, propagate_nan=tl.PropagateNan.ALL)
    return shift + tl.abs(shift) * 4.0e-7


@triton.jit
def exact_p_base(target, P_LOG2: tl.constexpr):
    """P's base for materialized logits x (P = 2^(x - base)): target - P_LOG2, one float step higher
    where rounding put it lower by more than P's slack, so a logit at ``target`` gives P <= 255.5
    (INT8), <= 463 (fp8 e4m3fn) at any magnitude. Where the logits' float spacing exceeds 2^P_LOG2
    (|target| >= 2^26: -finfo.max masks, huge q, k) the base is ``target`` itself: P = 1, never 0."""
    if P_LOG2 == 0:
        return target
    c = target - P_LOG2
    # c + |c|·(2^-24 + a little) rounds to the next float above c: half an ulp and a bit more.
    return tl.where(target - c > P_LOG2 + P_SLACK, c + tl.abs(c) * 6.0e-8, c)


@triton.jit
def _attn_tile(
    acc, l_i, m_i, sh_i, q, qs, offs_m, start_n,
    k_base, ks_base, v_base, tb_base, mask_base, k_desc, v_desc, bhk,
    stride_vn, stride_vd, stride_mm, stride_mn,
    LQ, LK, D,
    BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, BOUNDARY: tl.constexpr, IS_CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr, PV_MODE: tl.constexpr, P_LOG2: tl.constexpr, EVEN_D: tl.constexpr,
    K_SCALAR: tl.constexpr, INTERPRETER: tl.constexpr, K_TMA: tl.constexpr, V_TMA: tl.constexpr,
    V_T: tl.constexpr, V_RES: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    if K_TMA:
        # Tensor-memory-accelerator copy (Hopper+): rows past LK arrive zero-filled.
        k = k_desc.load([bhk, start_n, 0]).reshape(BLOCK_N, D_PAD)
    else:
        k_ptrs = k_base + offs_n[:, None].to(tl.int64) * D_PAD + offs_d[None, :]
        if BOUNDARY:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < LK, other=0)
        else:
            k = tl.load(k_ptrs)
    s = tl.dot(q, tl.trans(k))  # int32

    if K_SCALAR:
        row_scale = qs * tl.load(ks_base + start_n // BLOCK_N)
    hot: tl.constexpr = K_SCALAR and not BOUNDARY and MASK_KIND == MASK_NONE_C
    if hot:
        # Scales are positive, so the row max can be taken on the integers, and the rescale and the
        # P range factor fold into the exp2 argument (one FMA per logit).
        t_max = tl.max(s, 1).to(tl.float32) * row_scale
    else:
        if K_SCALAR:
            x = s.to(tl.float32) * row_scale[:, None]
        else:
            ks = tl.load(ks_base + offs_n, mask=offs_n < LK, other=0.0)
            x = s.to(tl.float32) * qs[:, None] * ks[None, :]
        x = _masked_logits(x, offs_m, offs_n, mask_base, stride_mm, stride_mn, LQ, LK, BOUNDARY, IS_CAUSAL,
                           MASK_KIND)
        t_max = tl.max(x, 1)
    if PV_MODE == PV_INT8_C and not K_SCALAR:
        # Per-token K scales: a NaN key's logits are NaN only in its column, which the row max skips and
        # INT8 P rounds to a number. Its scale (NaN for a NaN/Inf key) poisons the row instead, as SDPA.
        t_max += tl.sum(ks, 0) * 0.0
    m_new = tl.maximum(m_i, t_max)
    # P = 2^(logit - base). 16-bit and fp8 P: base = the running max less P_LOG2, the sums kept in units
    # of 2^(m_i - P_LOG2). INT8 P: its own per-tile shift, the sums kept in units of 2^sh_i (alpha moves
    # them from the last tile's). One FMA per output element either way.
    if K_SCALAR and MASK_KIND == MASK_NONE_C:
        # The hot loop, and the last key tile of the same unmasked per_warp/per_block call: rows past
        # the hot loop's limit are made NaN after the loops, so its margin is enough here (the exact base
        # below, in this kernel, spilled 3 registers on sm90 with INT8 P·V).
        # A row masked so far has max -inf: shift by 0 instead, so exp2 gives 0 rather than NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        if PV_MODE == PV_INT8_C:
            # sh_i carries the shift itself here (base + P_LOG2): the operations and their order of
            # before issue 39, which ptxas schedules better on sm90 (bench/NOTES.md, "INT8 P·V after issue 39").
            shift = int8_p_shift(t_max, m_use)
            alpha = tl.math.exp2(sh_i - shift)
            base = shift - P_LOG2
        else:
            base = m_use - P_LOG2
            alpha = tl.math.exp2(m_i - m_use)
        if hot:
            p = tl.math.exp2(s.to(tl.float32) * row_scale[:, None] - base[:, None])
        else:
            p = tl.math.exp2(x - base[:, None])
    else:
        # Nothing live yet (max -inf): a base below every finite logit (the masks' are >= -2.9e38), so P
        # is 0 and a later tile's alpha scales these zero sums by 0, never by 2^(huge) (0 * inf: NaN).
        m_use = tl.where(m_new == float("-inf"), -3.0e38, m_new)
        if PV_MODE == PV_INT8_C:
            base = exact_p_base(tl.maximum(t_max, m_use - INT8_SHIFT_FLOOR, propagate_nan=tl.PropagateNan.ALL),
                                P_LOG2)
            alpha = tl.math.exp2(sh_i - base)
        else:
            base = exact_p_base(m_use, P_LOG2)
            alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(x - base[:, None])

    if PV_MODE == PV_INT8_C:
        p8 = round_p_offset_int8(p)  # P - 128
        l_i = l_i * alpha + (tl.sum(p8.to(tl.int32), 1) + P_OFFSET * BLOCK_N).to(tl.float32)
    else:
        l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]

    v_ptrs = v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_d[None, :] * stride_vd
    v = _load_v(v_desc, v_ptrs, bhk, 0, start_n, offs_n, offs_d, LK, D, BLOCK_N, D_PAD, BOUNDARY, PV_MODE, EVEN_D,
                V_TMA, V_T)

    if PV_MODE == PV_16BIT_C:
        if v.dtype == tl.float32:  # fp32 inputs: P·V in bf16 (fp16 could overflow on large V)
            v = v.to(tl.bfloat16)
        p16 = p.to(v.dtype)
        if INTERPRETER and v.dtype == tl.bfloat16:
            # The CPU interpreter's bf16 dot is wrong; the same bf16 values multiplied in fp32 are exact.
            acc = tl.dot(p16.to(tl.float32), v.to(tl.float32), acc)
        else:
            acc = tl.dot(p16, v, acc)
    elif PV_MODE == PV_16BIT_TILE_C:
        acc += tl.dot(p.to(tl.float16), v.to(tl.float16), out_dtype=tl.float16).to(tl.float32)
    elif PV_MODE == PV_FP8_C:
        # V's tokens are stored in the MMA operand order; P is relabelled to match (no shuffles).
        p8 = mma_operand_order(to_fp8(p, v.dtype, INTERPRETER), BLOCK_N)
        pv = tl.dot(p8, v)
        if V_RES:  # V's fp8 rounding residual, D_PAD rows below V: a second MMA into the same tile sum
            pv = tl.dot(p8, _load_v(v_desc, v_ptrs + D_PAD * stride_vd, bhk, D_PAD, start_n, offs_n, offs_d, LK, D,
                                    BLOCK_N, D_PAD, BOUNDARY, PV_MODE, EVEN_D, V_TMA, V_T), pv)
        acc += pv
    else:
        pv = tl.dot(mma_operand_order(p8, BLOCK_N), v)  # int32, exact: (P - 128)·V
        acc += (pv + tl.load(tb_base + (start_n // BLOCK_N) * D_PAD + offs_d)[None, :]).to(tl.float32)
    if PV_MODE == PV_INT8_C:
        if K_SCALAR and MASK_KIND == MASK_NONE_C:
            sh_i = shift
        else:
            sh_i = base
    return acc, l_i, m_new, sh_i


@triton.jit
def _load_v(v_desc, v_ptrs, bhk, row0, start_n, offs_n, offs_d, LK, D, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
            BOUNDARY: tl.constexpr, PV_MODE: tl.constexpr, EVEN_D: tl.constexpr, V_TMA: tl.constexpr,
            V_T: tl.constexpr):
    """One (BLOCK_N, D_PAD) V tile; ``row0`` is the first channel row of a descriptor load."""
    if V_TMA:
        if V_T:
            v = tl.trans(v_desc.load([bhk, row0, start_n]).reshape(D_PAD, BLOCK_N))
        else:
            v = v_desc.load([bhk, start_n, 0]).reshape(BLOCK_N, D_PAD)
    elif BOUNDARY:
        # 8-bit V is stored in operand order, zero-padded to whole 32-key chunks: a live key may sit
        # past LK there.
        v_len = tl.cdiv(LK, 32) * 32 if PV_MODE >= 2 else LK
        if EVEN_D:
            v = tl.load(v_ptrs, mask=offs_n[:, None] < v_len, other=0.0)
        else:
            v = tl.load(v_ptrs, mask=(offs_n[:, None] < v_len) & (offs_d[None, :] < D), other=0.0)
    else:
        if EVEN_D:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=offs_d[None, :] < D, other=0.0)
    return v


@triton.jit
def finish_rows(acc, l_sum, VScale, VMean, bhk, offs_d, D, HAS_VSCALE: tl.constexpr, HAS_VMEAN: tl.constexpr):
    """Output rows from the P·V sums and row sums: normalized, then V's per-channel scale and mean
    restored. A row with no live key (fully masked) has l_sum == 0: SDPA returns 0 there, and so do we.
    A NaN l_sum (a NaN logit) counts as live, so the row comes out NaN whatever P·V's sums held."""
    live = l_sum != 0
    out = acc / tl.where(live, l_sum, 1.0)[:, None]
    d_ok = offs_d < D
    if HAS_VSCALE:
        out = out * tl.load(VScale + bhk * D + offs_d, mask=d_ok, other=0.0)[None, :]
    if HAS_VMEAN:
        out = out + tl.where(live[:, None], tl.load(VMean + bhk * D + offs_d, mask=d_ok, other=0.0)[None, :], 0.0)
    return out


@triton.jit
def attention_kernel(
    Q8, QS, K8, KS, V, VScale, VMean, QBias, TileBias,
    Out, Lse, Mask, KDesc, VDesc,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_mb, stride_mh, stride_mm, stride_mn,
    H, H_KV, LQ, LK, D,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, PV_MODE: tl.constexpr, P_LOG2: tl.constexpr,
    HAS_VSCALE: tl.constexpr, HAS_VMEAN: tl.constexpr, HAS_QBIAS: tl.constexpr,
    K_SCALAR: tl.constexpr, RETURN_LSE: tl.constexpr, EVEN_D: tl.constexpr, INTERPRETER: tl.constexpr,
    K_TMA: tl.constexpr, V_TMA: tl.constexpr, V_T: tl.constexpr, V_RES: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # launched as the quantization's dependent: everything it reads, they wrote
        gdc_wait()
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * H_KV + h // (H // H_KV)  # GQA: consecutive query heads share one KV head

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_ok = offs_m < LQ
    q = tl.load(Q8 + bh.to(tl.int64) * LQ * D_PAD + offs_m[:, None].to(tl.int64) * D_PAD + offs_d[None, :],
                mask=m_ok[:, None], other=0)
    qs = tl.load(QS + bh.to(tl.int64) * LQ + offs_m, mask=m_ok, other=0.0)

    k_base = K8 + bhk.to(tl.int64) * LK * D_PAD
    if K_SCALAR:
        ks_base = KS + bhk.to(tl.int64) * tl.cdiv(LK, BLOCK_N)
    else:
        ks_base = KS + bhk.to(tl.int64) * LK
    v_base = V + b.to(tl.int64) * stride_vb + (bhk - b * H_KV).to(tl.int64) * stride_vh
    tb_base = TileBias + bhk.to(tl.int64) * tl.cdiv(LK, BLOCK_N) * D_PAD  # INT8 P·V: V's key-tile sums
    mask_base = Mask + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    sh_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # INT8 P·V: the base (or shift) of the sums' unit
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)

    full_end = (LK // BLOCK_N) * BLOCK_N
    hi = LK
    if IS_CAUSAL:
        hi = tl.minimum(LK, (pid_m + 1) * BLOCK_M)
        full_end = tl.minimum(full_end, (pid_m * BLOCK_M // BLOCK_N) * BLOCK_N)

    for start_n in range(0, full_end, BLOCK_N):
        acc, l_i, m_i, sh_i = _attn_tile(
            acc, l_i, m_i, sh_i, q, qs, offs_m, start_n, k_base, ks_base, v_base, tb_base, mask_base, KDesc, VDesc, bhk,
            stride_vn, stride_vd, stride_mm, stride_mn, LQ, LK, D,
            BLOCK_N, D_PAD, False, IS_CAUSAL, MASK_KIND, PV_MODE, P_LOG2, EVEN_D, K_SCALAR, INTERPRETER,
            K_TMA, V_TMA, V_T, V_RES)
    for start_n in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i, sh_i = _attn_tile(
            acc, l_i, m_i, sh_i, q, qs, offs_m, start_n, k_base, ks_base, v_base, tb_base, mask_base, KDesc, VDesc, bhk,
            stride_vn, stride_vd, stride_mm, stride_mn, LQ, LK, D,
            BLOCK_N, D_PAD, True, IS_CAUSAL, MASK_KIND, PV_MODE, P_LOG2, EVEN_D, K_SCALAR, INTERPRETER,
            K_TMA, V_TMA, V_T, V_RES)

    if K_SCALAR and MASK_KIND == MASK_NONE_C:
        # The first loop is the hot one (logits from the integer row max, one FMA each): its rounding
        # margin holds below HOT_LOGIT_LIMIT. A row whose max got there (huge q and k) is made NaN, never
        # a silent 0 or a wrapped weight: the nodes' non-finite guard then runs SDPA for the call. A
        # check per row and program, nothing per tile (working such rows out again from materialized
        # logits spilled registers on sm90/sm120 whether it ran or not).
        if PV_MODE == PV_INT8_C:
            # From the last shift, not m_i: sh_i is within 20 of m_i (``int8_p_shift``; -20 for a row with no
            # live key), so this flags every row the check on m_i would, and a few 2^21-sized ones more.
            # Reading m_i after the loops cost sm90's hot loop 5 register moves (Triton 3.6, bench/NOTES.md).
            l_i = tl.where(tl.abs(sh_i) >= HOT_LOGIT_LIMIT - 32.0, float("nan"), l_i)
        else:
            limit: tl.constexpr = HOT_LOGIT_LIMIT_FP8 if PV_MODE == PV_FP8_C else HOT_LOGIT_LIMIT
            l_i = tl.where((tl.abs(m_i) >= limit) & (m_i > float("-inf")), float("nan"), l_i)
    out = finish_rows(acc, l_i, VScale, VMean, bhk, offs_d, D, HAS_VSCALE, HAS_VMEAN)
    d_ok = offs_d < D
    o_ptrs = (Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
              + offs_m[:, None].to(tl.int64) * stride_om + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])

    if RETURN_LSE:
        live = l_i != 0  # a fully masked row: LSE -inf, as SDPA (NaN stays NaN)
        # l_i is in units of 2^(m_i - P_LOG2), or with INT8 P·V 2^sh_i, sh_i less P_LOG2 where it holds the
        # hot path's shift (``_attn_tile``).
        if PV_MODE == PV_INT8_C:
            unit = sh_i - P_LOG2 if K_SCALAR and MASK_KIND == MASK_NONE_C else sh_i
        else:
            unit = m_i - P_LOG2
        lse = tl.where(live, (unit + tl.math.log2(tl.where(live, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        if HAS_QBIAS:
            lse += tl.load(QBias + bh.to(tl.int64) * LQ + offs_m, mask=m_ok, other=0.0)
        tl.store(Lse + bh.to(tl.int64) * LQ + offs_m, lse, mask=m_ok)
