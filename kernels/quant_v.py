"""V's conversion for the attention kernel: minus its mean, scaled, cast to FP8/INT8/FP16, 8-bit V with its
tokens in MMA operand order (``quant.mma_operand_order``)."""
from __future__ import annotations

import triton
import triton.language as tl

from .quant import P_OFFSET, _row_tile, mma_operand_order, pdl_start, round_to_int8, to_fp8


@triton.jit
def convert_v_kernel(
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    Scale, Mean,  # fp32 (B*H, D) per-channel scale and mean (HAS_MEAN), from _finalize_kv_stats
    Out, stride_ob, stride_ol, stride_od,  # (B*H, L, D_PAD) in any order of the last two
    TileBias,  # int8 Out: int32 (B*H, L_OUT / BLOCK, D_PAD)
    H, L, L_OUT, D,
    BLOCK: tl.constexpr, D_PAD: tl.constexpr, HAS_MEAN: tl.constexpr, INTERPRETER: tl.constexpr,
    KEY_PERM: tl.constexpr, RESIDUAL: tl.constexpr, PDL: tl.constexpr,
):
    """V minus its mean (smooth_v), divided by its per-channel scale, cast to Out's dtype (int8: rounded).

    With ``KEY_PERM`` the tokens are stored in MMA operand order and the L_OUT - L padding rows are
    written as zeros. With ``RESIDUAL`` (fp8 only) the rounding error of each value is stored too,
    rounded to fp8 in turn, D_PAD channel rows below V: V ≈ hi + lo to about 7 mantissa bits.
    With int8 Out, BLOCK is the attention kernel's key tile, and each tile's column sums times
    P_OFFSET go to ``TileBias``: the kernels add them to the tile's (P - P_OFFSET)·V sums.
    """
    bh, offs_l, row_ok, offs_d, v = _row_tile(V, stride_vb, stride_vh, stride_vl, stride_vd, H, L, D, BLOCK, D_PAD)
    pdl_start(PDL)
    d_ok = offs_d < D
    scale = tl.load(Scale + bh * D + offs_d, mask=d_ok, other=1.0)
    if HAS_MEAN:
        v = v - tl.load(Mean + bh * D + offs_d, mask=d_ok, other=0.0)[None, :]
    v = tl.where(d_ok[None, :] & row_ok[:, None], v / scale[None, :], 0.0)
    if KEY_PERM:  # permuted in registers, so the stores stay contiguous (BLOCK is a multiple of 32)
        v = tl.trans(mma_operand_order(tl.trans(v), BLOCK))
    o_ptrs = (Out + bh.to(tl.int64) * stride_ob + offs_l[:, None].to(tl.int64) * stride_ol
              + offs_d[None, :] * stride_od)
    keep = offs_l[:, None] < L_OUT
    if Out.dtype.element_ty == tl.float16:
        tl.store(o_ptrs, v.to(tl.float16), mask=keep)
    elif Out.dtype.element_ty == tl.int8:
        v8 = round_to_int8(v)
        tl.store(o_ptrs, v8, mask=keep)
        col_sums = tl.sum(tl.where(keep, v8, 0).to(tl.int32), axis=0)
        tl.store(TileBias + (bh.to(tl.int64) * tl.num_programs(0) + tl.program_id(0)) * D_PAD + offs_d,
                 col_sums * P_OFFSET)
    else:
        v8 = to_fp8(v, Out.dtype.element_ty, INTERPRETER)
        tl.store(o_ptrs, v8, mask=keep)
        if RESIDUAL:  # what rounding to fp8 lost, itself in fp8, D_PAD channel rows further on
            tl.store(o_ptrs + D_PAD * stride_od, to_fp8(v - v8.to(tl.float32), Out.dtype.element_ty, INTERPRETER),
                     mask=keep)
