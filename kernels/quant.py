"""Fused single-pass quantization of Q, K (INT8 with per-group scales) and V (FP8 or scaled FP16).

Each kernel reads its tensor once, in any layout and stride, and writes a contiguous, head-dim
padded copy the attention kernel can load without masks. Q scales are stored per token (the
group's scale repeated), so the attention kernel loads one scale vector per tile whatever the
granularity; K scales are one per key tile whenever the granularity allows (a scalar per tile in the
kernel's loop), else per token. A query token holding NaN/Inf gets a NaN scale, so its row becomes
NaN as in SDPA without poisoning the other tokens of its group; a key holding one gives its tile's
scale (or its own, per token) NaN, and SDPA turns every row that sees such a key into NaN anyway.
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # grid dependency control: triton >= 3.4 (arch.pdl_available); a no-op otherwise
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton
    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

from .pv_operands import (  # noqa: F401 - re-exported: the kernels' 8-bit operands, also quant's to callers
    _ROUNDING_BIAS,
    KEY_PERM_CHUNK,
    P_OFFSET,
    mma_operand_order,
    round_p_offset_int8,
    round_p_offset_int8_sums,
    round_to_int8,
    to_fp8,
)

LOG2E = 1.4426950408889634

MEAN_NONE, MEAN_SUBTRACT, MEAN_DOT = 0, 1, 2
MEAN_SUBTRACT_C, MEAN_DOT_C = tl.constexpr(MEAN_SUBTRACT), tl.constexpr(MEAN_DOT)  # as the kernels compare MEAN_MODE


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """With programmatic dependent launch, let the call's next launch start (it waits here, in turn,
    for this one's output) and wait for the previous launch's output. Call it after
    loading the user's tensors, before reading anything an earlier launch of the call wrote, and
    before any store: a buffer freed by an earlier launch may be handed out again."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def _rotate(x, Signs, D_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """``x @ reference.hadamard_block`` on the 16-bit tensor cores. ``Signs``: that matrix times sqrt(BLOCK)
    (±1 and 0, exact in fp16), made once per device by the host (``host_quant._rotation_signs``), not per program.
    Each row is divided by its max |x| first, so fp16's 11 bits hold it to 1/2048 of that max (INT8
    keeps 1/127 of it); 1/sqrt(BLOCK) and the row max are applied to the fp32 sums. A row holding
    NaN/Inf stays non-finite."""
    r = tl.max(tl.abs(x), 1)
    r = tl.where(r > 0, r, 1.0)
    d = tl.arange(0, D_PAD)
    signs = tl.load(Signs + d[:, None] * D_PAD + d[None, :])
    y = tl.dot((x * (1.0 / r)[:, None]).to(tl.float16), signs)
    return y * (r * (1.0 / tl.sqrt(BLOCK * 1.0)))[:, None]


# ``GROUP`` of K's scales as SageAttention's sm90 per_thread kernel groups keys: per 128-key tile, the keys whose
# accumulator columns one thread of the MMA holds (key % 8 // 2 alike), 32 per scale (``hopper_logits``).
K_SM90_GROUPS = 0
K_SM90_GROUPS_C = tl.constexpr(K_SM90_GROUPS)  # as the kernels compare GROUP


@triton.jit
def _mma_column_group_max(row_max, BLOCK: tl.constexpr):
    """Max over the keys 8j + 2t + e (j < 16, e < 2) of each 128-key tile for each t < 4, broadcast back."""
    g = tl.max(tl.max(tl.reshape(row_max, (BLOCK // 128, 16, 4, 2)), axis=3), axis=1)
    return tl.reshape(tl.broadcast_to(g[:, None, :, None], (BLOCK // 128, 16, 4, 2)), (BLOCK,))


@triton.jit
def _group_max(row_max, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """Max over consecutive groups of GROUP rows, broadcast back to every row of the group."""
    if GROUP == 1:
        return row_max
    g = tl.max(tl.reshape(row_max, (BLOCK // GROUP, GROUP)), axis=1)
    return tl.reshape(tl.broadcast_to(g[:, None], (BLOCK // GROUP, GROUP)), (BLOCK,))


@triton.jit
def _load_rows(X, stride_b, stride_h, stride_l, stride_d, bh, H, offs_l, L, D, D_PAD: tl.constexpr,
               DTYPE: tl.constexpr = tl.float32):
    """Rows ``offs_l`` of head ``bh`` of a strided (B, H, L, D) tensor, in DTYPE, zero-padded to D_PAD
    columns (and zero past L). Returns (row_ok, cols, tile)."""
    b = bh // H
    h = bh % H
    offs_d = tl.arange(0, D_PAD)
    row_ok = offs_l < L
    x = tl.load(X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
                + offs_l[:, None].to(tl.int64) * stride_l + offs_d[None, :] * stride_d,
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0).to(DTYPE)
    return row_ok, offs_d, x


@triton.jit
def _row_tile(X, stride_b, stride_h, stride_l, stride_d, H, L, D, BLOCK: tl.constexpr, D_PAD: tl.constexpr,
              DTYPE: tl.constexpr = tl.float32):
    """This program's BLOCK rows of one (batch, head) of a strided (B, H, L, D) tensor, in DTYPE,
    zero-padded to D_PAD columns. Returns (bh, rows, row_ok, cols, tile)."""
    bh = tl.program_id(1)
    offs_l = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_ok, offs_d, x = _load_rows(X, stride_b, stride_h, stride_l, stride_d, bh, H, offs_l, L, D, D_PAD, DTYPE)
    return bh, offs_l, row_ok, offs_d, x


# ---- K/V statistics: one pass over K and V writes per-chunk partials, the consumers reduce them.
#
# Why partials: a finished grid-wide reduction needs a second launch, float atomics (their order
# varies run to run, so outputs would not be bit-reproducible) or a last-program-finalizes ticket
# (fragile memory ordering). Instead the Q quantization launch, which runs next, reduces each head's
# partials (at most STATS_PARTS rows of D_PAD floats, L2-resident) in a fixed order in one program
# per head (_finalize_kv_stats), and the K and V launches after it read the finished mean and scale:
# the same bits every run. STATS_PARTS bounds that cost; a stats program loops over as many token
# tiles as its chunk holds.
STATS_PARTS = 16
# Elements per token block and tensor (8 warps: 8 fp32 registers a thread). On an H200 the fastest
# of 2048-8192 at 4K-16K tokens, and with 16 partials the fastest of the sweep in
# bench/results/sm90_k_mean_sampling_ab.json.
STATS_TILE = 2048
V_NONE, V_ABSMAX, V_MINMAXSUM = 0, 1, 2
V_NONE_C, V_ABSMAX_C, V_MINMAXSUM_C = map(tl.constexpr, (V_NONE, V_ABSMAX, V_MINMAXSUM))  # as kernels compare V_STATS
REDUCE_SUM, REDUCE_MAX, REDUCE_MIN = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)

# K smoothing subtracts one vector from every key: softmax is unchanged for any vector, and the mean
# is the one that best centres K's channels for INT8. An estimate does that as well, so on long
# sequences the statistics pass reads every K_MEAN_MAX_STRIDE-th block of K (V, whose maximum must
# be exact, in full): 8K tokens read 112 instead of 200 MB. At least K_MEAN_MIN_BLOCKS blocks
# (1,024 tokens at head_dim 128) are averaged; shorter sequences average every token.
K_MEAN_MIN_BLOCKS = 64
K_MEAN_MAX_STRIDE = 8


def stats_block(d_pad: int) -> int:
    """Tokens per block of the statistics pass."""
    return max(16, STATS_TILE // d_pad)


def k_mean_sample(length: int, d_pad: int) -> tuple[int, int]:
    """(stride, tokens): K's mean is taken over the blocks of ``stats_block`` tokens whose index is a
    multiple of ``stride``, ``tokens`` keys in all."""
    block = stats_block(d_pad)
    blocks = -(-length // block)
    stride = max(1, min(K_MEAN_MAX_STRIDE, blocks // K_MEAN_MIN_BLOCKS))
    sampled = -(-blocks // stride)
    last = (sampled - 1) * stride  # the last sampled block, maybe partial
    return stride, (sampled - 1) * block + min(block, length - last * block)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _reduce_nan(x, axis: tl.constexpr, IS_MAX: tl.constexpr, INTERPRETER: tl.constexpr):
    """Max (``IS_MAX``) or min of ``x`` along ``axis``, NaN where any element is NaN (as torch.amax).
    The interpreter calls a custom combine function once per element in Python (minutes per test),
    so there the NaNs are counted apart and the max or min is numpy's; compiled code keeps the
    one-pass reduction."""
    if INTERPRETER:
        nan = x != x
        if IS_MAX:
            res = tl.max(tl.where(nan, float("-inf"), x), axis)
        else:
            res = tl.min(tl.where(nan, float("inf"), x), axis)
        res = tl.where(tl.max(nan.to(tl.int32), axis) > 0, float("nan"), res)
    elif IS_MAX:
        res = tl.reduce(x, axis, _max_nan)
    else:
        res = tl.reduce(x, axis, _min_nan)
    return res


@triton.jit
def kv_stats_kernel(
    K, stride_kb, stride_kh, stride_kl, stride_kd,
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    KSum, VLo, VHi, VSum,  # fp32 (B*H, n_parts, D_PAD) out: partials per chunk of tiles_per_part tiles
    H, L, D, tiles_per_part, k_stride,
    BLOCK: tl.constexpr, D_PAD: tl.constexpr, K_SUM: tl.constexpr, V_STATS: tl.constexpr, PDL: tl.constexpr,
    INTERPRETER: tl.constexpr = False,
):
    """Per-channel partials of K's sum over every ``k_stride``-th token block (``k_mean_sample``) and
    of V's max |v| (V_ABSMAX) or min, max and sum (V_MINMAXSUM) over every token, reading each block
    once. Min/max propagate NaN, as torch.aminmax does."""
    part = tl.program_id(0)
    bh = tl.program_id(1)
    if PDL:  # the first launch of a call: it waits for what came before it, the Q launch need not
        gdc_launch_dependents()
    # Element-wise accumulators, reduced across rows once at the end (no cross-warp step per tile).
    ksum = tl.zeros((BLOCK, D_PAD), tl.float32)
    vsum = tl.zeros((BLOCK, D_PAD), tl.float32)
    vlo = tl.full((BLOCK, D_PAD), float("inf"), tl.float32)
    vhi = tl.full((BLOCK, D_PAD), float("-inf"), tl.float32)
    for i in range(0, tiles_per_part):
        blk = part * tiles_per_part + i
        offs_l = blk * BLOCK + tl.arange(0, BLOCK)
        if K_SUM:
            if blk % k_stride == 0:
                _, _, k = _load_rows(K, stride_kb, stride_kh, stride_kl, stride_kd, bh, H, offs_l, L, D, D_PAD)
                ksum += k
        if V_STATS == V_ABSMAX_C:  # Padding rows load as 0: neutral for max |v|
            _, _, v = _load_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, bh, H, offs_l, L, D, D_PAD)
            vhi = _max_nan(vhi, tl.abs(v))
        elif V_STATS == V_MINMAXSUM_C:
            row_ok, _, v = _load_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, bh, H, offs_l, L, D, D_PAD)
            vlo = _min_nan(vlo, tl.where(row_ok[:, None], v, float("inf")))
            vhi = _max_nan(vhi, tl.where(row_ok[:, None], v, float("-inf")))
            vsum += v
    dst = (bh.to(tl.int64) * tl.num_programs(0) + part) * D_PAD + tl.arange(0, D_PAD)
    if K_SUM:
        tl.store(KSum + dst, tl.sum(ksum, axis=0))
    if V_STATS != V_NONE_C:
        tl.store(VHi + dst, _reduce_nan(vhi, 0, True, INTERPRETER))
    if V_STATS == V_MINMAXSUM_C:
        tl.store(VLo + dst, _reduce_nan(vlo, 0, False, INTERPRETER))
        tl.store(VSum + dst, tl.sum(vsum, axis=0))


@triton.jit
def _reduce_parts(P, bh, n_parts, OP: tl.constexpr, PARTS_PAD: tl.constexpr, D_PAD: tl.constexpr,
                  INTERPRETER: tl.constexpr):
    """One head's partials (n_parts rows of D_PAD) reduced over the rows, in a fixed order."""
    r = tl.arange(0, PARTS_PAD)
    ptrs = P + (bh.to(tl.int64) * n_parts + r[:, None]) * D_PAD + tl.arange(0, D_PAD)[None, :]
    ok = r[:, None] < n_parts
    if OP == REDUCE_SUM:
        res = tl.sum(tl.load(ptrs, mask=ok, other=0.0), axis=0)
    elif OP == REDUCE_MAX:
        res = _reduce_nan(tl.load(ptrs, mask=ok, other=float("-inf")), 0, True, INTERPRETER)
    else:
        res = _reduce_nan(tl.load(ptrs, mask=ok, other=float("inf")), 0, False, INTERPRETER)
    return res


@triton.jit
def _k_mean(Parts, kvh, n_parts, k_tokens, PARTS_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """K's mean for key/value head ``kvh`` from the statistics pass's sums over its ``k_tokens``
    sampled keys. The one formula for Final's K mean and the LSE bias, so both are the same bits."""
    return _reduce_parts(Parts, kvh, n_parts, REDUCE_SUM, PARTS_PAD, D_PAD, False) / k_tokens


# Final's slot of K's mean times the rotation's signs (``_quantize_rotated_tiles``: K·H - mean·H), after K
# mean, V scale and V mean; D_PAD per head.
ROTATED_MEAN_SLOT = tl.constexpr(3)


@triton.jit
def _finalize_kv_stats(Parts, part_slot, Final, final_slot, kvh, n_parts, L, k_tokens, D, K_SUM: tl.constexpr,
                       V_STATS: tl.constexpr, V_RANGE: tl.constexpr, V_POW2: tl.constexpr,
                       PARTS_PAD: tl.constexpr, D_PAD: tl.constexpr, INTERPRETER: tl.constexpr):
    """Reduce key/value head ``kvh``'s partials into Final (3, B*H_KV, D): K mean (over the
    ``k_tokens`` keys the statistics pass summed), V scale (what the attention epilogue multiplies
    by: V's range mapped onto [-V_RANGE, V_RANGE]) and V mean."""
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    dst = Final + kvh * D + offs_d
    if K_SUM:
        tl.store(dst, _k_mean(Parts, kvh, n_parts, k_tokens, PARTS_PAD, D_PAD), mask=d_ok)
    if V_STATS == V_MINMAXSUM_C:  # the range around the mean
        vmin = _reduce_parts(Parts + part_slot, kvh, n_parts, REDUCE_MIN, PARTS_PAD, D_PAD, INTERPRETER)
        vmax = _reduce_parts(Parts + 2 * part_slot, kvh, n_parts, REDUCE_MAX, PARTS_PAD, D_PAD, INTERPRETER)
        mean = _reduce_parts(Parts + 3 * part_slot, kvh, n_parts, REDUCE_SUM, PARTS_PAD, D_PAD, INTERPRETER) / L
        tl.store(dst + 2 * final_slot, mean, mask=d_ok)
        amax = tl.maximum(vmax - mean, mean - vmin)
    else:  # V_ABSMAX: max |v|, NaN if any v is
        amax = _reduce_parts(Parts + 2 * part_slot, kvh, n_parts, REDUCE_MAX, PARTS_PAD, D_PAD, INTERPRETER)
    if V_STATS != V_NONE_C:
        if V_POW2:  # powers of two keep the scaling exact in fp16
            scale = tl.exp2(tl.ceil(tl.log2(tl.maximum(amax / V_RANGE, 1.0))))
        else:
            # A NaN max keeps its NaN: INT8 V would clamp NaN to a number, and the epilogue's scale is
            # then what turns that channel NaN in every row, as SDPA.
            scale = tl.where(amax > 0, amax / V_RANGE, tl.where(amax == amax, 1.0, amax))
        tl.store(dst + final_slot, scale, mask=d_ok)


@triton.jit
def _store_rotated_mean(Parts, Final, final_slot, kvh, n_parts, k_tokens, Signs, PARTS_PAD: tl.constexpr,
                        D_PAD: tl.constexpr):
    """K's mean for head ``kvh`` times the unnormalised signs, into Final's ROTATED_MEAN_SLOT (D_PAD wide)."""
    mean = _k_mean(Parts, kvh, n_parts, k_tokens, PARTS_PAD, D_PAD)
    d = tl.arange(0, D_PAD)
    signs = tl.load(Signs + d[:, None] * D_PAD + d[None, :]).to(tl.float32)
    tl.store(Final + ROTATED_MEAN_SLOT * final_slot + kvh * D_PAD + d, tl.sum(mean[:, None] * signs, 0))


# Columns of ``_bias_mean_operand``: the smallest N of a tensor-core product in Triton.
BIAS_MEAN_COLS = tl.constexpr(16)


@triton.jit
def _bias_mean_operand(Parts, kvh, n_parts, k_tokens, dtype: tl.constexpr, PARTS_PAD: tl.constexpr,
                       D_PAD: tl.constexpr):
    """K's mean for head ``kvh`` split into three 16-bit parts (its rounding to ``dtype``, the rounding of what
    that leaves, and of what those two leave: 24 bits, fp32's), as columns 0-2 of a (D_PAD, BIAS_MEAN_COLS)
    operand. The 16-bit rows times it, one small MMA with exact products, sum to x·mean as the fp32 sum over
    the rows did, in the MMA's layout and with the operand in shared memory (``_quantize_rotated_tiles``)."""
    mean = _k_mean(Parts, kvh, n_parts, k_tokens, PARTS_PAD, D_PAD)
    hi = mean.to(dtype).to(tl.float32)
    mid = (mean - hi).to(dtype).to(tl.float32)
    lo = (mean - hi - mid).to(dtype).to(tl.float32)
    c = tl.arange(0, BIAS_MEAN_COLS)[None, :]
    return tl.where(c == 0, hi[:, None], tl.where(c == 1, mid[:, None], tl.where(c == 2, lo[:, None], 0.0))).to(dtype)


@triton.jit
def quantize_int8_kernel(
    X, stride_xb, stride_xh, stride_xl, stride_xd,
    Parts, part_slot,  # fp32 (4, B*H_KV, n_parts, D_PAD): kv_stats_kernel's partials
    Final, final_slot,  # fp32 (3, B*H_KV, D): K mean, V scale, V mean (and ROTATED_MEAN_SLOT with ROTATE_TILES)
    Out, Scale, Bias,  # int8 (B*H, L, D_PAD); fp32 (B*H, L) or (B*H, L/BLOCK); fp32 (B*H, L)
    Signs,  # (D_PAD, D_PAD) the rotation's signs (ROTATE), fp16 or, with ROTATE_TILES, X's dtype; else unused
    H, H_KV_DIV, L, L_KV, K_TOKENS, D, n_parts, scale_mult, bias_mult,
    BLOCK: tl.constexpr, GROUP: tl.constexpr, D_PAD: tl.constexpr, MEAN_MODE: tl.constexpr,
    SCALE_PER_BLOCK: tl.constexpr, FINALIZE: tl.constexpr, K_SUM: tl.constexpr, V_STATS: tl.constexpr,
    V_RANGE: tl.constexpr, V_POW2: tl.constexpr, PARTS_PAD: tl.constexpr, PDL: tl.constexpr,
    ROTATE: tl.constexpr = 0, INTERPRETER: tl.constexpr = False,
    ROTATE_TILES: tl.constexpr = 0, ROTATE_STAGES: tl.constexpr = 2,
):
    """Quantize one tile of Q or K. With FINALIZE (the Q launch, which runs right after the
    statistics), the first program of each key/value head also reduces the K/V partials into Final,
    which the K and V launches after it read: one reduction per head instead of one per program.
    With ROTATE (a block size), the tile is multiplied by a block Hadamard matrix (``_rotate``) before rounding; Q and
    K get the same rotation, so their product is unchanged. ROTATE_TILES > 0: the rotation as
    ``_quantize_rotated_tiles`` (``KernelConfig.rotation_tiles``)."""
    if ROTATE_TILES > 0:
        _quantize_rotated_tiles(X, stride_xb, stride_xh, stride_xl, stride_xd, Parts, part_slot, Final, final_slot,
                                Out, Scale, Bias, Signs, H, H_KV_DIV, L, L_KV, K_TOKENS, D, n_parts, scale_mult,
                                bias_mult, BLOCK, GROUP, D_PAD, MEAN_MODE, SCALE_PER_BLOCK, FINALIZE, K_SUM, V_STATS,
                                V_RANGE, V_POW2, PARTS_PAD, PDL, INTERPRETER, ROTATE_TILES, ROTATE_STAGES)
    else:
        _quantize_tile(X, stride_xb, stride_xh, stride_xl, stride_xd, Parts, part_slot, Final, final_slot, Out, Scale,
                       Bias, Signs, H, H_KV_DIV, L, L_KV, K_TOKENS, D, n_parts, scale_mult, bias_mult, BLOCK, GROUP,
                       D_PAD, MEAN_MODE, SCALE_PER_BLOCK, FINALIZE, K_SUM, V_STATS, V_RANGE, V_POW2, PARTS_PAD, PDL,
                       ROTATE, INTERPRETER)


@triton.jit
def _quantize_rows(x, Out, Scale, bh, L, offs_l, row_ok, offs_d, tile, scale_mult, BLOCK: tl.constexpr,
                   GROUP: tl.constexpr, D_PAD: tl.constexpr, SCALE_PER_BLOCK: tl.constexpr,
                   INTERPRETER: tl.constexpr, LOOPED: tl.constexpr):
    """Round fp32 rows to INT8 and store them with their scales, tile ``tile`` of its head (as ``_quantize_tile``)."""
    out_ptrs = Out + bh.to(tl.int64) * L * D_PAD + offs_l[:, None].to(tl.int64) * D_PAD + offs_d[None, :]
    if SCALE_PER_BLOCK:
        # One scale per block (GROUP == BLOCK), reduced straight to a scalar; NaN and Inf are found
        # by that same max instead of a test per element. The per-row path below (row max, group
        # max, broadcast back to rows) spilled at 128 rows and took twice as long on an H200
        # (bench/NOTES.md). A NaN/Inf key poisons its whole block: that changes nothing,
        # since SDPA turns every query row that sees such a key into NaN anyway.
        amax = _reduce_nan(_reduce_nan(tl.abs(x), 1, True, INTERPRETER), 0, True, INTERPRETER)
        ok = amax < float("inf")  # False for NaN and Inf
        scale = tl.where(ok & (amax > 0), amax / 127.0, 1.0)
        tl.store(out_ptrs, round_to_int8(x * (1.0 / scale)), mask=row_ok[:, None])
        scale_ptr = Scale + bh.to(tl.int64) * tl.cdiv(L, BLOCK) + tile
        if LOOPED:  # a program's tiles may run past the last one
            tl.store(scale_ptr, tl.where(ok, scale * scale_mult, float("nan")), mask=tile < tl.cdiv(L, BLOCK))
        else:
            tl.store(scale_ptr, tl.where(ok, scale * scale_mult, float("nan")))
    else:
        # Rows holding NaN/Inf are found by their NaN-propagating max and get a NaN scale (their
        # int8 values then do not matter); the group's shared scale skips them, so the other tokens
        # of the group stay exact.
        row_max = _reduce_nan(tl.abs(x), 1, True, INTERPRETER)
        row_bad = ~(row_max < float("inf"))
        if GROUP == K_SM90_GROUPS_C:  # a bad key poisons its group: the Gluon kernel reads one scale per group
            amax = _mma_column_group_max(tl.where(row_bad, float("inf"), row_max), BLOCK)
            row_bad = ~(amax < float("inf"))
            amax = tl.where(row_bad, 0.0, amax)
        else:
            amax = _group_max(tl.where(row_bad, 0.0, row_max), BLOCK, GROUP)
        scale = tl.where(amax > 0, amax / 127.0, 1.0)
        tl.store(out_ptrs, round_to_int8(x * (1.0 / scale)[:, None]), mask=row_ok[:, None])
        tl.store(Scale + bh.to(tl.int64) * L + offs_l, tl.where(row_bad, float("nan"), scale * scale_mult),
                 mask=row_ok)


@triton.jit
def _quantize_rotated_tiles(
    X, stride_xb, stride_xh, stride_xl, stride_xd, Parts, part_slot, Final, final_slot, Out, Scale, Bias, Signs,
    H, H_KV_DIV, L, L_KV, K_TOKENS, D, n_parts, scale_mult, bias_mult,
    BLOCK: tl.constexpr, GROUP: tl.constexpr, D_PAD: tl.constexpr, MEAN_MODE: tl.constexpr,
    SCALE_PER_BLOCK: tl.constexpr, FINALIZE: tl.constexpr, K_SUM: tl.constexpr, V_STATS: tl.constexpr,
    V_RANGE: tl.constexpr, V_POW2: tl.constexpr, PARTS_PAD: tl.constexpr, PDL: tl.constexpr,
    INTERPRETER: tl.constexpr, TILES: tl.constexpr, STAGES: tl.constexpr, MEANS: tl.constexpr = None, means_args=None,
    MEANS_C: tl.constexpr = None,
):
    """The rotation of TILES consecutive tiles of 16-bit rows per program: each tile's rows, exact as loaded,
    times the ±1 signs in their own dtype (fp32 sums: no row max, no rounding before the product), K's mean
    subtracted after it as mean·H (which the finalizing program stores), 1/sqrt(block) left to the scales
    (``scale_mult``). The signs are loaded once per program and the rows through Triton's pipeliner (STAGES),
    so the next tile's loads run while this one is multiplied and stored: per tile, the rotating launch
    otherwise waits on its own load → product → store chain with too little memory traffic in flight. MEANS: as
    ``_quantize_tile``'s."""
    bh = tl.program_id(1)
    kvh = bh // H_KV_DIV
    first = tl.program_id(0) * TILES
    rows = tl.arange(0, BLOCK)
    d = tl.arange(0, D_PAD)
    signs = tl.load(Signs + d[:, None] * D_PAD + d[None, :])  # made by the host once: read while the launch before ends
    pdl_start(PDL)
    if FINALIZE:
        if (tl.program_id(0) == 0) & (bh % H_KV_DIV == 0):
            _finalize_kv_stats(Parts, part_slot, Final, final_slot, kvh, n_parts, L_KV, K_TOKENS, D, K_SUM, V_STATS,
                               V_RANGE, V_POW2, PARTS_PAD, D_PAD, INTERPRETER)
            if K_SUM:
                _store_rotated_mean(Parts, Final, final_slot, kvh, n_parts, K_TOKENS, Signs, PARTS_PAD, D_PAD)
    if MEAN_MODE == MEAN_SUBTRACT_C:
        mean_h = tl.load(Final + ROTATED_MEAN_SLOT * final_slot + bh * D_PAD + d)
    if MEAN_MODE == MEAN_DOT_C:
        mean_op = _bias_mean_operand(Parts, kvh, n_parts, K_TOKENS, X.dtype.element_ty, PARTS_PAD, D_PAD)
    if MEANS is not None:
        means_args = MEANS[0](bh, means_args, MEANS_C)
    for i in tl.range(0, TILES, num_stages=STAGES):
        tile = first + i
        offs_l = tile * BLOCK + rows
        row_ok, _, x = _load_rows(X, stride_xb, stride_xh, stride_xl, stride_xd, bh, H, offs_l, L, D, D_PAD,
                                  X.dtype.element_ty)
        if MEANS is not None:
            MEANS[1](x, offs_l, row_ok, tile, bh, L, means_args, MEANS_C)
        if INTERPRETER:  # its bf16 dot reads the bits as integers: the same exact values in fp32
            y = tl.dot(x.to(tl.float32), signs.to(tl.float32))
        else:
            y = tl.dot(x, signs)
        if MEAN_MODE == MEAN_DOT_C:  # q·mean(K) for the LSE: a second product of the rows as loaded
            if INTERPRETER:
                qm = tl.dot(x.to(tl.float32), mean_op.to(tl.float32))
            else:
                qm = tl.dot(x, mean_op)
            tl.store(Bias + bh.to(tl.int64) * L + offs_l, tl.sum(qm, axis=1) * bias_mult, mask=row_ok)
        if MEAN_MODE == MEAN_SUBTRACT_C:
            y = y - mean_h[None, :]
        y = tl.where(row_ok[:, None], y, 0.0)
        _quantize_rows(y, Out, Scale, bh, L, offs_l, row_ok, d, tile, scale_mult, BLOCK, GROUP, D_PAD,
                       SCALE_PER_BLOCK, INTERPRETER, True)


@triton.jit
def _quantize_tile(
    X, stride_xb, stride_xh, stride_xl, stride_xd, Parts, part_slot, Final, final_slot, Out, Scale, Bias, Signs,
    H, H_KV_DIV, L, L_KV, K_TOKENS, D, n_parts, scale_mult, bias_mult,
    BLOCK: tl.constexpr, GROUP: tl.constexpr, D_PAD: tl.constexpr, MEAN_MODE: tl.constexpr,
    SCALE_PER_BLOCK: tl.constexpr, FINALIZE: tl.constexpr, K_SUM: tl.constexpr, V_STATS: tl.constexpr,
    V_RANGE: tl.constexpr, V_POW2: tl.constexpr, PARTS_PAD: tl.constexpr, PDL: tl.constexpr,
    ROTATE: tl.constexpr, INTERPRETER: tl.constexpr, MEANS: tl.constexpr = None, means_args=None,
    MEANS_C: tl.constexpr = None, mean_row=None,
):
    """The quantization of one tile (``quantize_int8_kernel``). MEANS (None, or two @triton.jit hooks: the sparse
    launch's block means and row dots, ``sparse_quant``): ``MEANS[0](bh, means_args, MEANS_C)`` once per program
    gives what ``MEANS[1](x, rows, row_ok, tile, bh, L, it, MEANS_C)`` takes for each tile's rows as loaded (X's
    dtype), before any change to them. ``mean_row``: Final's row stride for MEAN_SUBTRACT (None: D)."""
    if MEANS is not None:  # the hooks' per-program part before the rows' load, as the sparse kernel had it
        means_args = MEANS[0](tl.program_id(1), means_args, MEANS_C)
    bh, offs_l, row_ok, offs_d, x = _row_tile(X, stride_xb, stride_xh, stride_xl, stride_xd, H, L, D, BLOCK, D_PAD,
                                              tl.float32 if MEANS is None else X.dtype.element_ty)
    pdl_start(PDL)
    ld_mask = row_ok[:, None] & (offs_d[None, :] < D)
    kvh = bh // H_KV_DIV  # GQA: query head bh reads key/value head kvh
    if FINALIZE:
        if (tl.program_id(0) == 0) & (bh % H_KV_DIV == 0):
            _finalize_kv_stats(Parts, part_slot, Final, final_slot, kvh, n_parts, L_KV, K_TOKENS, D, K_SUM, V_STATS,
                               V_RANGE, V_POW2, PARTS_PAD, D_PAD, INTERPRETER)
    if MEANS is not None:
        MEANS[1](x, offs_l, row_ok, tl.program_id(0), bh, L, means_args, MEANS_C)
        x = x.to(tl.float32)

    if MEAN_MODE == MEAN_SUBTRACT_C:
        mean = tl.load(Final + bh * (D if mean_row is None else mean_row) + offs_d, mask=offs_d < D, other=0.0)
        x = tl.where(ld_mask, x - mean[None, :], 0.0)

    if MEAN_MODE == MEAN_DOT_C:
        # q·mean(K): the per-row constant smoothing removed from the logits, needed for the LSE.
        # Every program needs it before Final exists, so each reduces the K partials itself.
        mean = _k_mean(Parts, kvh, n_parts, K_TOKENS, PARTS_PAD, D_PAD)
        bias = tl.sum(x * mean[None, :], axis=1) * bias_mult
        tl.store(Bias + bh.to(tl.int64) * L + offs_l, bias, mask=row_ok)
    if ROTATE:
        x = _rotate(x, Signs, D_PAD, ROTATE)

    _quantize_rows(x, Out, Scale, bh, L, offs_l, row_ok, offs_d, tl.program_id(0), scale_mult, BLOCK, GROUP, D_PAD,
                   SCALE_PER_BLOCK, INTERPRETER, False)
