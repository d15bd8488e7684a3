"""The sparse kernel's step over two listed key blocks at once (``sparse_attention_kernel``).

The dense tile (``attention._attn_tile``) pays its per-step work (row max, alpha, the running output's
rescale over the whole 64 x D_PAD accumulator, INT8 P·V's int32 -> fp32 conversion and tile bias) once
per 64 keys. Here two unchecked 64-key blocks from the router's list (any two, not adjacent in general)
share one row max and one update of acc, l and m: their P·V sums meet in one tile sum first. The
numerics are ``_attn_tile``'s hot path (no mask, no key bounds) on a 128-key tile; results differ from
two single steps only in rounding order.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .attention import (
    HOT_LOGIT_LIMIT,
    INT8_SHIFT_FLOOR,
    PV_16BIT_C,
    PV_16BIT_TILE_C,
    PV_FP8_C,
    PV_INT8_C,
    _load_v,
    exact_p_base,
    int8_p_shift,
)
from .quant import P_OFFSET, mma_operand_order, round_p_offset_int8, to_fp8


@triton.jit
def _block_logits(q, qs, start_n, k_base, ks_base, k_desc, bhk, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                  PV_MODE: tl.constexpr, K_SCALAR: tl.constexpr, K_TMA: tl.constexpr):
    """One full key block's INT8 Q·Kᵀ (int32 s), its scale and row max in base 2, as ``_attn_tile``:
    K_SCALAR, ``a`` is the row scale (the logits are s·a, formed inside exp2's argument); per-token K
    scales, ``a`` is the logits themselves."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if K_TMA:
        k = k_desc.load([bhk, start_n, 0]).reshape(BLOCK_N, D_PAD)
    else:
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * D_PAD + tl.arange(0, D_PAD)[None, :])
    s = tl.dot(q, tl.trans(k))  # int32
    if K_SCALAR:
        a = qs * tl.load(ks_base + start_n // BLOCK_N)
        t_max = tl.max(s, 1).to(tl.float32) * a  # scales are positive: the max on the integers
    elif PV_MODE == PV_INT8_C:
        # Per-token K scales with INT8 P: ``a`` is s times the key's scale only; the row's Q scale (positive)
        # joins in ``_block_p``'s FMA, as the hot loop's one (one multiply per logit more than it, not two).
        # A NaN/Inf key (NaN scale) needs no poisoning here: K's mean is then non-finite, so every row's
        # tail offset, and with it the row, is NaN already (``sparse_attention_kernel``'s TailOff).
        a = s.to(tl.float32) * tl.load(ks_base + offs_n)[None, :]
        t_max = tl.max(a, 1) * qs
    else:
        ks = tl.load(ks_base + offs_n)
        a = s.to(tl.float32) * qs[:, None] * ks[None, :]
        t_max = tl.max(a, 1)
    return s, a, t_max


@triton.jit
def _block_p(s, a, qs, base, PV_MODE: tl.constexpr, K_SCALAR: tl.constexpr):
    if K_SCALAR:
        x = s.to(tl.float32) * a[:, None] - base[:, None]
    elif PV_MODE == PV_INT8_C:
        x = a * qs[:, None] - base[:, None]
    else:
        x = a - base[:, None]
    return tl.math.exp2(x)


@triton.jit
def attn_pair(
    acc, l_i, m_i, sh_i, q, qs, n0, n1,
    k_base, ks_base, v_base, tb_base, k_desc, v_desc, bhk, stride_vn, stride_vd, D,
    D_PAD: tl.constexpr, PV_MODE: tl.constexpr, P_LOG2: tl.constexpr, EVEN_D: tl.constexpr,
    K_SCALAR: tl.constexpr, INTERPRETER: tl.constexpr, K_TMA: tl.constexpr, V_TMA: tl.constexpr,
    V_T: tl.constexpr, V_RES: tl.constexpr,
):
    """``_attn_tile`` (no mask, no bounds) over key blocks starting at n0 and n1, as one 128-key tile."""
    BLOCK_N: tl.constexpr = 64
    s0, a0, t0 = _block_logits(q, qs, n0, k_base, ks_base, k_desc, bhk, BLOCK_N, D_PAD, PV_MODE, K_SCALAR, K_TMA)
    s1, a1, t1 = _block_logits(q, qs, n1, k_base, ks_base, k_desc, bhk, BLOCK_N, D_PAD, PV_MODE, K_SCALAR, K_TMA)
    # NaN-propagating: a NaN in either block's max reaches the row as it does from a single tile
    t_max = tl.maximum(t0, t1, propagate_nan=tl.PropagateNan.ALL)
    m_new = tl.maximum(m_i, t_max)
    if K_SCALAR:
        # ``_attn_tile``'s hot loop: rows past HOT_LOGIT_LIMIT are made NaN after the loop (the kernel's epilogue)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        if PV_MODE == PV_INT8_C:
            shift = int8_p_shift(t_max, m_use)
            alpha = tl.math.exp2(sh_i - shift)
            base = shift - P_LOG2
        else:
            base = m_use - P_LOG2
            alpha = tl.math.exp2(m_i - m_use)
    else:
        m_use = tl.where(m_new == float("-inf"), -3.0e38, m_new)
        if PV_MODE == PV_INT8_C:
            # The FMA's logit is exact where t_max is its rounded product: raised by a few of its ulps (as
            # ``int8_p_shift``), so the largest weight never rounds past 255; past the hot loop's limit, where
            # that costs P its bits, the row is made NaN (as the hot loop's rows), never wrong.
            tgt = tl.maximum(t_max, m_use - INT8_SHIFT_FLOOR, propagate_nan=tl.PropagateNan.ALL)
            base = exact_p_base(tgt + tl.abs(tgt) * 4.0e-7, P_LOG2)
            base = tl.where(tl.abs(tgt) < HOT_LOGIT_LIMIT, base, float("nan"))
            alpha = tl.math.exp2(sh_i - base)
        else:
            base = exact_p_base(m_use, P_LOG2)
            alpha = tl.math.exp2(m_i - m_use)
    p0 = _block_p(s0, a0, qs, base, PV_MODE, K_SCALAR)
    p1 = _block_p(s1, a1, qs, base, PV_MODE, K_SCALAR)

    if PV_MODE == PV_INT8_C:
        p80 = round_p_offset_int8(p0)  # P - 128
        p81 = round_p_offset_int8(p1)
        l_i = l_i * alpha + (tl.sum(p80.to(tl.int32), 1) + tl.sum(p81.to(tl.int32), 1)
                             + P_OFFSET * 2 * BLOCK_N).to(tl.float32)
    else:
        l_i = l_i * alpha + (tl.sum(p0, 1) + tl.sum(p1, 1))
    acc = acc * alpha[:, None]

    offs_d = tl.arange(0, D_PAD)
    offs_n0 = n0 + tl.arange(0, BLOCK_N)
    offs_n1 = n1 + tl.arange(0, BLOCK_N)
    v_ptrs0 = v_base + offs_n0[:, None].to(tl.int64) * stride_vn + offs_d[None, :] * stride_vd
    v_ptrs1 = v_base + offs_n1[:, None].to(tl.int64) * stride_vn + offs_d[None, :] * stride_vd
    v0 = _load_v(v_desc, v_ptrs0, bhk, 0, n0, offs_n0, offs_d, 0, D, BLOCK_N, D_PAD, False, PV_MODE, EVEN_D, V_TMA,
                 V_T)
    v1 = _load_v(v_desc, v_ptrs1, bhk, 0, n1, offs_n1, offs_d, 0, D, BLOCK_N, D_PAD, False, PV_MODE, EVEN_D, V_TMA,
                 V_T)
    if PV_MODE == PV_16BIT_C:
        if v0.dtype == tl.float32:  # fp32 inputs: P·V in bf16, as ``_attn_tile``
            v0 = v0.to(tl.bfloat16)
            v1 = v1.to(tl.bfloat16)
        if INTERPRETER and v0.dtype == tl.bfloat16:  # the CPU interpreter's bf16 dot is wrong
            acc = tl.dot(p0.to(v0.dtype).to(tl.float32), v0.to(tl.float32), acc)
            acc = tl.dot(p1.to(v1.dtype).to(tl.float32), v1.to(tl.float32), acc)
        else:
            acc = tl.dot(p0.to(v0.dtype), v0, acc)
            acc = tl.dot(p1.to(v1.dtype), v1, acc)
    elif PV_MODE == PV_16BIT_TILE_C:
        pv = tl.dot(p0.to(tl.float16), v0.to(tl.float16), out_dtype=tl.float16)
        pv = tl.dot(p1.to(tl.float16), v1.to(tl.float16), pv, out_dtype=tl.float16)
        acc += pv.to(tl.float32)
    elif PV_MODE == PV_FP8_C:
        # V's tokens are stored in the MMA operand order per 64-key chunk; each block's P is relabelled to match.
        p80 = mma_operand_order(to_fp8(p0, v0.dtype, INTERPRETER), BLOCK_N)
        p81 = mma_operand_order(to_fp8(p1, v1.dtype, INTERPRETER), BLOCK_N)
        pv = tl.dot(p80, v0)
        pv = tl.dot(p81, v1, pv)
        if V_RES:  # V's fp8 rounding residual, D_PAD rows below V: into the same tile sum
            pv = tl.dot(p80, _load_v(v_desc, v_ptrs0 + D_PAD * stride_vd, bhk, D_PAD, n0, offs_n0, offs_d, 0, D,
                                     BLOCK_N, D_PAD, False, PV_MODE, EVEN_D, V_TMA, V_T), pv)
            pv = tl.dot(p81, _load_v(v_desc, v_ptrs1 + D_PAD * stride_vd, bhk, D_PAD, n1, offs_n1, offs_d, 0, D,
                                     BLOCK_N, D_PAD, False, PV_MODE, EVEN_D, V_TMA, V_T), pv)
        acc += pv
    else:
        # int32, exact: (P - 128)·V over both blocks (|sum| < 2^22), plus both blocks' tile biases (128·ΣV)
        pv = tl.dot(mma_operand_order(p80, BLOCK_N), v0)
        pv = tl.dot(mma_operand_order(p81, BLOCK_N), v1, pv, out_dtype=tl.int32)  # Triton 3.6 wants it said
        tb = tl.load(tb_base + (n0 // BLOCK_N) * D_PAD + offs_d) + tl.load(tb_base + (n1 // BLOCK_N) * D_PAD + offs_d)
        acc += (pv + tb[None, :]).to(tl.float32)
    if PV_MODE == PV_INT8_C:
        if K_SCALAR:
            sh_i = shift
        else:
            sh_i = base
    return acc, l_i, m_new, sh_i
