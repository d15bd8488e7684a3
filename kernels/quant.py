"""Fused single-pass quantization of Q, K (INT8 with per-group scales) and V (FP8 or scaled FP16).

Each kernel reads its tensor once, in any layout and stride, and writes a contiguous, head-dim
padded copy the attention kernel can load without masks. Scales are stored per token (the group's
scale repeated), so the attention kernel loads one scale vector per tile whatever the granularity,
and a token holding NaN/Inf gets a NaN scale: its row (Q) or column (K) becomes NaN, as in SDPA,
without poisoning the other tokens of its group.
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634

MEAN_NONE, MEAN_SUBTRACT, MEAN_DOT = 0, 1, 2


@triton.jit
def to_fp8(x, dtype: tl.constexpr, FIX_ROUNDING: tl.constexpr):
    """Cast fp32 to an fp8 type.

    Triton's CPU interpreter mis-rounds fp8 casts whose mantissa carries into the next binade
    (7.9 → 4.0 instead of 8.0), so under the interpreter the value is first rounded to the fp8 grid
    in fp32 and the cast is then exact. Compiled GPU code never takes this path.
    """
    if FIX_ROUNDING:
        ax = tl.abs(x)
        min_exp: tl.constexpr = -7.0 if dtype == tl.float8e4b8 else -6.0
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(ax, 1e-30))), min_exp)
        ulp = tl.exp2(e - 3.0)
        x = tl.where(ax > 0, tl.floor(x / ulp + 0.5) * ulp, x)
    return x.to(dtype)


@triton.jit
def _group_max(row_max, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """Max over consecutive groups of GROUP rows, broadcast back to every row of the group."""
    if GROUP == 1:
        return row_max
    g = tl.max(tl.reshape(row_max, (BLOCK // GROUP, GROUP)), axis=1)
    return tl.reshape(tl.broadcast_to(g[:, None], (BLOCK // GROUP, GROUP)), (BLOCK,))


@triton.jit
def _row_tile(X, stride_b, stride_h, stride_l, stride_d, H, L, D, BLOCK: tl.constexpr, D_PAD: tl.constexpr):
    """This program's BLOCK rows of one (batch, head) of a strided (B, H, L, D) tensor, in fp32,
    zero-padded to D_PAD columns. Returns (bh, rows, row_ok, cols, tile)."""
    pid_l = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_l = pid_l * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D_PAD)
    row_ok = offs_l < L
    x = tl.load(X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
                + offs_l[:, None].to(tl.int64) * stride_l + offs_d[None, :] * stride_d,
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    return bh, offs_l, row_ok, offs_d, x


@triton.jit
def quantize_int8_kernel(
    X, stride_xb, stride_xh, stride_xl, stride_xd,
    Mean, stride_mb, stride_mh,  # fp32 (B, H_mean, D) per-channel mean of K
    Out, Scale, Bias,  # int8 (B*H, L, D_PAD); fp32 (B*H, L) or (B*H, L/BLOCK); fp32 (B*H, L)
    H, H_MEAN_DIV, L, D, scale_mult,
    BLOCK: tl.constexpr, GROUP: tl.constexpr, D_PAD: tl.constexpr, MEAN_MODE: tl.constexpr,
    SCALE_PER_BLOCK: tl.constexpr,
):
    bh, offs_l, row_ok, offs_d, x = _row_tile(X, stride_xb, stride_xh, stride_xl, stride_xd, H, L, D, BLOCK, D_PAD)
    b = bh // H
    h = bh % H
    ld_mask = row_ok[:, None] & (offs_d[None, :] < D)

    # x - x is 0 for finite values and NaN for NaN/Inf: one test for both.
    finite = (x - x) == 0.0
    row_bad = tl.max(tl.where(finite, 0, 1), axis=1) > 0
    x = tl.where(finite, x, 0.0)

    if MEAN_MODE != 0:
        hm = h // H_MEAN_DIV
        mean = tl.load(Mean + b * stride_mb + hm * stride_mh + offs_d, mask=offs_d < D, other=0.0)
        if MEAN_MODE == 1:
            x = tl.where(ld_mask, x - mean[None, :], 0.0)
        else:
            # q·mean(K): the per-row constant smoothing removed from the logits, needed for the LSE.
            bias = tl.sum(x * mean[None, :], axis=1)
            tl.store(Bias + bh.to(tl.int64) * L + offs_l, bias, mask=row_ok)

    amax = _group_max(tl.max(tl.abs(x), axis=1), BLOCK, GROUP)
    scale = tl.where(amax > 0, amax / 127.0, 1.0)
    y = x / scale[:, None]
    y = tl.where(y >= 0, y + 0.5, y - 0.5)  # round half away from zero; the cast truncates
    q = tl.minimum(tl.maximum(y, -127.0), 127.0).to(tl.int8)

    out_ptrs = Out + bh.to(tl.int64) * L * D_PAD + offs_l[:, None].to(tl.int64) * D_PAD + offs_d[None, :]
    tl.store(out_ptrs, q, mask=row_ok[:, None])
    if SCALE_PER_BLOCK:
        # One scale per block (GROUP == BLOCK). A NaN/Inf key poisons its whole block: that changes
        # nothing, since SDPA turns every query row that sees such a key into NaN anyway.
        blk_bad = tl.max(tl.where(row_bad & row_ok, 1, 0), axis=0) > 0
        blk_scale = tl.where(blk_bad, float("nan"), tl.max(scale, axis=0) * scale_mult)
        tl.store(Scale + bh.to(tl.int64) * tl.cdiv(L, BLOCK) + tl.program_id(0), blk_scale)
    else:
        tok_scale = tl.where(row_bad, float("nan"), scale * scale_mult)
        tl.store(Scale + bh.to(tl.int64) * L + offs_l, tok_scale, mask=row_ok)


@triton.jit
def mma_operand_position(n):
    """Where key ``n`` goes when keys are stored in the 8-bit MMA A-operand order (see
    ``attention._mma_operand_order``): within each 32-key chunk, bits (h, j, t, i) of
    n = 16h + 8j + 2t + i move to 16h + 4t + 2j + i."""
    r = n % 32
    return n - r + (r & 16) + ((r >> 1) & 3) * 4 + ((r >> 3) & 1) * 2 + (r & 1)


@triton.jit
def convert_v_kernel(
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    VMin, VMax, Mean,  # (B*H, D) per-channel min/max over the sequence (any float dtype), fp32 mean
    Scale,  # fp32 (B*H, D) out: what the attention epilogue multiplies by
    Out, stride_ob, stride_ol, stride_od,  # (B*H, L, D_PAD) in any order of the last two
    H, L, L_OUT,
    D,
    BLOCK: tl.constexpr, D_PAD: tl.constexpr, HAS_MEAN: tl.constexpr, RANGE: tl.constexpr,
    POW2_SCALE: tl.constexpr, INTERPRETER: tl.constexpr, KEY_PERM: tl.constexpr,
):
    """V minus its mean (smooth_v), scaled per channel into [-RANGE, RANGE], cast to Out's dtype.

    The per-channel scale is derived here from the min/max statistics rather than by a chain of
    small torch ops: fewer launches, which is what short sequences pay for. With ``KEY_PERM`` the
    tokens are stored in MMA operand order and the L_OUT - L padding rows are written as zeros.
    """
    bh, offs_l, row_ok, offs_d, v = _row_tile(V, stride_vb, stride_vh, stride_vl, stride_vd, H, L, D, BLOCK, D_PAD)
    d_ok = offs_d < D
    vmin = tl.load(VMin + bh * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    vmax = tl.load(VMax + bh * D + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if HAS_MEAN:
        mean = tl.load(Mean + bh * D + offs_d, mask=d_ok, other=0.0)
        amax = tl.maximum(vmax - mean, mean - vmin)
    else:
        amax = tl.maximum(tl.abs(vmax), tl.abs(vmin))
    if POW2_SCALE:  # powers of two keep the scaling exact in fp16
        scale = tl.exp2(tl.ceil(tl.log2(tl.maximum(amax / RANGE, 1.0))))
    else:
        scale = tl.where(amax > 0, amax / RANGE, 1.0)
    if tl.program_id(0) == 0:
        tl.store(Scale + bh * D + offs_d, scale, mask=d_ok)

    if HAS_MEAN:
        v = v - mean[None, :]
    v = tl.where(d_ok[None, :] & row_ok[:, None], v / scale[None, :], 0.0)
    dest = mma_operand_position(offs_l) if KEY_PERM else offs_l
    o_ptrs = (Out + bh.to(tl.int64) * stride_ob + dest[:, None].to(tl.int64) * stride_ol
              + offs_d[None, :] * stride_od)
    if Out.dtype.element_ty == tl.float16:
        tl.store(o_ptrs, v.to(tl.float16), mask=dest[:, None] < L_OUT)
    else:
        tl.store(o_ptrs, to_fp8(v, Out.dtype.element_ty, INTERPRETER), mask=dest[:, None] < L_OUT)
