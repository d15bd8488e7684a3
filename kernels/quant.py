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

LOG2E = 1.4426950408889634

MEAN_NONE, MEAN_SUBTRACT, MEAN_DOT = 0, 1, 2


# Adding 1.5·2²³ to a float of magnitude below 2²² rounds it to an integer (to nearest even) held
# in the low mantissa bits, whose low byte is then that integer as two's-complement int8.
_ROUNDING_BIAS = tl.constexpr(12582912.0)


@triton.jit
def to_fp8(x, dtype: tl.constexpr, FIX_ROUNDING: tl.constexpr):
    """Cast fp32 to an fp8 type.

    Triton's CPU interpreter mis-rounds fp8 casts whose mantissa carries into the next binade
    (7.9 → 4.0 instead of 8.0) and turns NaN into a number (384 in e4m3fn), so under the interpreter
    the value is first rounded to the fp8 grid in fp32, ties to even as the GPU's cvt.rn does, the
    cast is then exact, and NaN is written as its bits. Compiled GPU code never takes this path.
    """
    if FIX_ROUNDING:
        ax = tl.abs(x)
        min_exp: tl.constexpr = -7.0 if dtype == tl.float8e4b8 else -6.0
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(ax, 1e-30))), min_exp)
        ulp = tl.exp2(e - 3.0)
        x = tl.where(ax > 0, ((x / ulp + _ROUNDING_BIAS) - _ROUNDING_BIAS) * ulp, x)  # x / ulp < 16
        nan_bits: tl.constexpr = -128 if dtype == tl.float8e4b8 else 127  # fnuz: 0x80, fn: 0x7F
        return tl.where(x == x, x.to(dtype), tl.full(x.shape, nan_bits, tl.int8).to(dtype, bitcast=True))
    return x.to(dtype)


@triton.jit
def round_to_int8(y):
    """``y`` clamped to ±127 and rounded to the nearest integer (ties to even, as torch.round), as
    int8, with one add instead of a float → int conversion per element (bench/NOTES.md, attempt 24)."""
    y = tl.minimum(tl.maximum(y, -127.0), 127.0) + _ROUNDING_BIAS
    return y.to(tl.int32, bitcast=True).to(tl.int8)


@triton.jit
def _group_max(row_max, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """Max over consecutive groups of GROUP rows, broadcast back to every row of the group."""
    if GROUP == 1:
        return row_max
    g = tl.max(tl.reshape(row_max, (BLOCK // GROUP, GROUP)), axis=1)
    return tl.reshape(tl.broadcast_to(g[:, None], (BLOCK // GROUP, GROUP)), (BLOCK,))


@triton.jit
def _load_rows(X, stride_b, stride_h, stride_l, stride_d, bh, H, offs_l, L, D, D_PAD: tl.constexpr):
    """Rows ``offs_l`` of head ``bh`` of a strided (B, H, L, D) tensor, in fp32, zero-padded to D_PAD
    columns (and zero past L). Returns (row_ok, cols, tile)."""
    b = bh // H
    h = bh % H
    offs_d = tl.arange(0, D_PAD)
    row_ok = offs_l < L
    x = tl.load(X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
                + offs_l[:, None].to(tl.int64) * stride_l + offs_d[None, :] * stride_d,
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    return row_ok, offs_d, x


@triton.jit
def _row_tile(X, stride_b, stride_h, stride_l, stride_d, H, L, D, BLOCK: tl.constexpr, D_PAD: tl.constexpr):
    """This program's BLOCK rows of one (batch, head) of a strided (B, H, L, D) tensor, in fp32,
    zero-padded to D_PAD columns. Returns (bh, rows, row_ok, cols, tile)."""
    bh = tl.program_id(1)
    offs_l = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_ok, offs_d, x = _load_rows(X, stride_b, stride_h, stride_l, stride_d, bh, H, offs_l, L, D, D_PAD)
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
REDUCE_SUM, REDUCE_MAX, REDUCE_MIN = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)

# Both statistics may be estimates. K smoothing subtracts one vector from every key: softmax is
# unchanged for any vector, and the mean is the one that best centres K's channels for INT8; an
# estimate does that as well. V's mean (smooth_v) is added back after P·V, exact for any vector too.
# V's scale must cover every |v|, which a sample can miss: see V_HEADROOM. So on long sequences the
# statistics pass reads every SAMPLE_MAX_STRIDE-th block of K and V: 8K tokens read 25 instead of
# 200 MB. At least SAMPLE_MIN_BLOCKS blocks (1,024 tokens at head_dim 128) are read; shorter
# sequences are read in full.
SAMPLE_MIN_BLOCKS = 64
SAMPLE_MAX_STRIDE = 8
# On a sampled sequence V's scale covers V_HEADROOM times the sample's largest |v|. FP8 keeps its
# 3-bit mantissa at every magnitude above 2^-6, so the headroom costs only values below
# V_HEADROOM * 2^-6 / 448 of the sample's max (fp64 on random and heavy-tailed V: no change in
# cosine). The V conversion checks every value against the scale; a channel that still overflows
# gets its true max recorded (an atomic max: order-free, so the same bits every run) and the K
# launch after it converts that head's V again with the exact scale (``redo_v``). Never saturated.
V_HEADROOM = 16.0


def stats_block(d_pad: int) -> int:
    """Tokens per block of the statistics pass."""
    return max(16, STATS_TILE // d_pad)


def stats_sample(length: int, d_pad: int) -> tuple[int, int]:
    """(stride, tokens): the statistics pass reads the blocks of ``stats_block`` tokens whose index
    is a multiple of ``stride``, ``tokens`` tokens in all (every token when ``stride`` is 1)."""
    block = stats_block(d_pad)
    blocks = -(-length // block)
    stride = max(1, min(SAMPLE_MAX_STRIDE, blocks // SAMPLE_MIN_BLOCKS))
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
def kv_stats_kernel(
    K, stride_kb, stride_kh, stride_kl, stride_kd,
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    KSum, VLo, VHi, VSum,  # fp32 (B*H, n_parts, D_PAD) out: partials per chunk of tiles_per_part tiles
    H, L, D, tiles_per_part, sample_stride,
    BLOCK: tl.constexpr, D_PAD: tl.constexpr, K_SUM: tl.constexpr, V_STATS: tl.constexpr,
):
    """Per-channel partials over every ``sample_stride``-th token block (``stats_sample``) of K's sum
    and of V's max |v| (V_ABSMAX) or min, max and sum (V_MINMAXSUM), reading each block once.
    Min/max propagate NaN, as torch.aminmax does."""
    part = tl.program_id(0)
    bh = tl.program_id(1)
    # Element-wise accumulators, reduced across rows once at the end (no cross-warp step per tile).
    ksum = tl.zeros((BLOCK, D_PAD), tl.float32)
    vsum = tl.zeros((BLOCK, D_PAD), tl.float32)
    vlo = tl.full((BLOCK, D_PAD), float("inf"), tl.float32)
    vhi = tl.full((BLOCK, D_PAD), float("-inf"), tl.float32)
    for i in range(0, tiles_per_part):
        blk = part * tiles_per_part + i
        offs_l = blk * BLOCK + tl.arange(0, BLOCK)
        if blk % sample_stride == 0:
            if K_SUM:
                _, _, k = _load_rows(K, stride_kb, stride_kh, stride_kl, stride_kd, bh, H, offs_l, L, D, D_PAD)
                ksum += k
            if V_STATS == 1:  # V_ABSMAX. Padding rows load as 0: neutral for max |v|
                _, _, v = _load_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, bh, H, offs_l, L, D, D_PAD)
                vhi = _max_nan(vhi, tl.abs(v))
            elif V_STATS == 2:  # V_MINMAXSUM
                row_ok, _, v = _load_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, bh, H, offs_l, L, D, D_PAD)
                vlo = _min_nan(vlo, tl.where(row_ok[:, None], v, float("inf")))
                vhi = _max_nan(vhi, tl.where(row_ok[:, None], v, float("-inf")))
                vsum += v
    dst = (bh.to(tl.int64) * tl.num_programs(0) + part) * D_PAD + tl.arange(0, D_PAD)
    if K_SUM:
        tl.store(KSum + dst, tl.sum(ksum, axis=0))
    if V_STATS != 0:
        tl.store(VHi + dst, tl.reduce(vhi, 0, _max_nan))
    if V_STATS == 2:
        tl.store(VLo + dst, tl.reduce(vlo, 0, _min_nan))
        tl.store(VSum + dst, tl.sum(vsum, axis=0))


@triton.jit
def _reduce_parts(P, bh, n_parts, OP: tl.constexpr, PARTS_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """One head's partials (n_parts rows of D_PAD) reduced over the rows, in a fixed order."""
    r = tl.arange(0, PARTS_PAD)
    ptrs = P + (bh.to(tl.int64) * n_parts + r[:, None]) * D_PAD + tl.arange(0, D_PAD)[None, :]
    ok = r[:, None] < n_parts
    if OP == REDUCE_SUM:
        res = tl.sum(tl.load(ptrs, mask=ok, other=0.0), axis=0)
    elif OP == REDUCE_MAX:
        res = tl.reduce(tl.load(ptrs, mask=ok, other=float("-inf")), 0, _max_nan)
    else:
        res = tl.reduce(tl.load(ptrs, mask=ok, other=float("inf")), 0, _min_nan)
    return res


@triton.jit
def _k_mean(Parts, kvh, n_parts, k_tokens, PARTS_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """K's mean for key/value head ``kvh`` from the statistics pass's sums over its ``k_tokens``
    sampled keys. The one formula for Final's K mean and the LSE bias, so both are the same bits."""
    return _reduce_parts(Parts, kvh, n_parts, REDUCE_SUM, PARTS_PAD, D_PAD) / k_tokens


@triton.jit
def _v_scale(amax, V_RANGE: tl.constexpr, V_POW2: tl.constexpr):
    """The scale that maps max |v| = ``amax`` into [-V_RANGE, V_RANGE]; NaN stays NaN. A channel with
    no nonzero value gets a tiny scale rather than 1, so any nonzero value the sample missed counts
    as an overflow (``_convert_v_rows``) instead of vanishing below fp8's smallest step."""
    if V_POW2:  # powers of two keep the scaling exact in fp16
        return tl.exp2(tl.ceil(tl.log2(tl.maximum(amax / V_RANGE, 1.0))))
    return tl.where(amax > 0, amax / V_RANGE, amax + 1e-30)


@triton.jit
def _finalize_kv_stats(Parts, part_slot, Final, final_slot, Flags, kvh, n_parts, sampled, D, v_headroom,
                       K_SUM: tl.constexpr, V_STATS: tl.constexpr, V_RANGE: tl.constexpr, V_POW2: tl.constexpr,
                       PARTS_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """Reduce key/value head ``kvh``'s partials into Final (4, B*H_KV, D): K mean and V mean (over the
    ``sampled`` tokens the statistics pass read), V scale (what the attention epilogue multiplies by:
    ``v_headroom`` times the sample's range mapped onto [-V_RANGE, V_RANGE]), and zeros in slot 3 and
    in Flags, where the V conversion records channels that overflow that scale."""
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    dst = Final + kvh * D + offs_d
    if K_SUM:
        tl.store(dst, _k_mean(Parts, kvh, n_parts, sampled, PARTS_PAD, D_PAD), mask=d_ok)
    if V_STATS == 2:  # V_MINMAXSUM: the range around the mean
        vmin = _reduce_parts(Parts + part_slot, kvh, n_parts, REDUCE_MIN, PARTS_PAD, D_PAD)
        vmax = _reduce_parts(Parts + 2 * part_slot, kvh, n_parts, REDUCE_MAX, PARTS_PAD, D_PAD)
        mean = _reduce_parts(Parts + 3 * part_slot, kvh, n_parts, REDUCE_SUM, PARTS_PAD, D_PAD) / sampled
        tl.store(dst + 2 * final_slot, mean, mask=d_ok)
        amax = tl.maximum(vmax - mean, mean - vmin)
    else:  # V_ABSMAX: max |v|, NaN if any v is
        amax = _reduce_parts(Parts + 2 * part_slot, kvh, n_parts, REDUCE_MAX, PARTS_PAD, D_PAD)
    if V_STATS != 0:
        tl.store(dst + final_slot, _v_scale(amax * v_headroom, V_RANGE, V_POW2), mask=d_ok)
        tl.store(dst + 3 * final_slot, tl.zeros((D_PAD,), tl.float32), mask=d_ok)
        tl.store(Flags + kvh, 0.0)


@triton.jit
def _store_int8(x, row_ok, offs_l, offs_d, bh, L, Out, Scale, scale_mult, BLOCK: tl.constexpr, GROUP: tl.constexpr,
                D_PAD: tl.constexpr, SCALE_PER_BLOCK: tl.constexpr):
    """Store this program's tile ``x`` (BLOCK rows at ``offs_l``, zero past D) as INT8 with its scales."""
    out_ptrs = Out + bh.to(tl.int64) * L * D_PAD + offs_l[:, None].to(tl.int64) * D_PAD + offs_d[None, :]
    if SCALE_PER_BLOCK:
        # One scale per block (GROUP == BLOCK), reduced straight to a scalar; NaN and Inf are found
        # by that same max instead of a test per element. The per-row path below (row max, group
        # max, broadcast back to rows) spilled at 128 rows and took twice as long on an H200
        # (bench/NOTES.md, attempt 29). A NaN/Inf key poisons its whole block: that changes nothing,
        # since SDPA turns every query row that sees such a key into NaN anyway.
        amax = tl.reduce(tl.reduce(tl.abs(x), 1, _max_nan), 0, _max_nan)
        ok = amax < float("inf")  # False for NaN and Inf
        scale = tl.where(ok & (amax > 0), amax / 127.0, 1.0)
        tl.store(out_ptrs, round_to_int8(x * (1.0 / scale)), mask=row_ok[:, None])
        tl.store(Scale + bh.to(tl.int64) * tl.cdiv(L, BLOCK) + tl.program_id(0),
                 tl.where(ok, scale * scale_mult, float("nan")))
    else:
        # Rows holding NaN/Inf are found by their NaN-propagating max and get a NaN scale (their
        # int8 values then do not matter); the group's shared scale skips them, so the other tokens
        # of the group stay exact.
        row_max = tl.reduce(tl.abs(x), 1, _max_nan)
        row_bad = ~(row_max < float("inf"))
        amax = _group_max(tl.where(row_bad, 0.0, row_max), BLOCK, GROUP)
        scale = tl.where(amax > 0, amax / 127.0, 1.0)
        tl.store(out_ptrs, round_to_int8(x * (1.0 / scale)[:, None]), mask=row_ok[:, None])
        tl.store(Scale + bh.to(tl.int64) * L + offs_l, tl.where(row_bad, float("nan"), scale * scale_mult),
                 mask=row_ok)


@triton.jit
def quantize_q_kernel(
    X, stride_xb, stride_xh, stride_xl, stride_xd,
    Parts, part_slot,  # fp32 (4, B*H_KV, n_parts, D_PAD): kv_stats_kernel's partials
    Final, final_slot, Flags,  # fp32 (4, B*H_KV, D): K mean, V scale, V mean, V overflow; (B*H_KV,) flags
    Out, Scale, Bias,  # int8 (B*H, L, D_PAD); fp32 (B*H, L); fp32 (B*H, L)
    H, H_KV_DIV, L, SAMPLED, D, n_parts, scale_mult, bias_mult, v_headroom,
    BLOCK: tl.constexpr, GROUP: tl.constexpr, D_PAD: tl.constexpr, MEAN_DOT: tl.constexpr,
    FINALIZE: tl.constexpr, K_SUM: tl.constexpr, V_STATS: tl.constexpr,
    V_RANGE: tl.constexpr, V_POW2: tl.constexpr, PARTS_PAD: tl.constexpr,
):
    """Quantize one tile of Q, scales per token (the group's repeated). With FINALIZE (the Q launch
    runs right after the statistics) the first program of each key/value head also reduces the K/V
    partials into Final, which the V and K launches after it read: one reduction per head instead of
    one per program. With MEAN_DOT it stores q·mean(K) per row, the constant smoothing removed from
    the logits, for the LSE."""
    bh, offs_l, row_ok, offs_d, x = _row_tile(X, stride_xb, stride_xh, stride_xl, stride_xd, H, L, D, BLOCK, D_PAD)
    kvh = bh // H_KV_DIV  # GQA: query head bh reads key/value head kvh
    if FINALIZE:
        if (tl.program_id(0) == 0) & (bh % H_KV_DIV == 0):
            _finalize_kv_stats(Parts, part_slot, Final, final_slot, Flags, kvh, n_parts, SAMPLED, D, v_headroom,
                               K_SUM, V_STATS, V_RANGE, V_POW2, PARTS_PAD, D_PAD)
    if MEAN_DOT:
        # Every program needs K's mean before Final exists, so each reduces the K partials itself.
        mean = _k_mean(Parts, kvh, n_parts, SAMPLED, PARTS_PAD, D_PAD)
        tl.store(Bias + bh.to(tl.int64) * L + offs_l, tl.sum(x * mean[None, :], axis=1) * bias_mult, mask=row_ok)
    _store_int8(x, row_ok, offs_l, offs_d, bh, L, Out, Scale, scale_mult, BLOCK, GROUP, D_PAD, False)


@triton.jit
def quantize_k_kernel(
    X, stride_xb, stride_xh, stride_xl, stride_xd,
    Final, final_slot, Flags,  # as quantize_q_kernel's, finalized by it
    Out, Scale,  # int8 (B*H_KV, L, D_PAD); fp32 (B*H_KV, L/BLOCK) with SCALE_PER_BLOCK, else (B*H_KV, L)
    V, stride_vb, stride_vh, stride_vl, stride_vd, VOut, stride_ob, stride_ol, stride_od,  # FIX_V: convert_v's
    H, L, L_OUT, D,
    BLOCK: tl.constexpr, GROUP: tl.constexpr, D_PAD: tl.constexpr, SUBTRACT_MEAN: tl.constexpr,
    SCALE_PER_BLOCK: tl.constexpr, FIX_V: tl.constexpr, V_RANGE: tl.constexpr, V_POW2: tl.constexpr,
    HAS_VMEAN: tl.constexpr, KEY_PERM: tl.constexpr, RESIDUAL: tl.constexpr, INTERPRETER: tl.constexpr,
):
    """Quantize one tile of K, minus K's mean with SUBTRACT_MEAN. With FIX_V, when the V conversion
    before this launch found a channel of this head beyond its sampled scale, also convert this
    tile's tokens of V again with the exact scale (``redo_v``)."""
    bh, offs_l, row_ok, offs_d, x = _row_tile(X, stride_xb, stride_xh, stride_xl, stride_xd, H, L, D, BLOCK, D_PAD)
    if SUBTRACT_MEAN:
        mean = tl.load(Final + bh * D + offs_d, mask=offs_d < D, other=0.0)
        x = tl.where(row_ok[:, None] & (offs_d[None, :] < D), x - mean[None, :], 0.0)
    _store_int8(x, row_ok, offs_l, offs_d, bh, L, Out, Scale, 1.0, BLOCK, GROUP, D_PAD, SCALE_PER_BLOCK)
    if FIX_V:
        if tl.load(Flags + bh) != 0:
            redo_v(V, stride_vb, stride_vh, stride_vl, stride_vd, Final, final_slot, VOut, stride_ob, stride_ol,
                   stride_od, bh, tl.program_id(0) * BLOCK, H, L, L_OUT, D, BLOCK, D_PAD, V_RANGE, V_POW2, HAS_VMEAN,
                   KEY_PERM, RESIDUAL, INTERPRETER)


# Keys are reordered within chunks of this many (the k-extent of one 8-bit MMA instruction).
KEY_PERM_CHUNK = 32


@triton.jit
def mma_operand_order(x, N: tl.constexpr):
    """Reorder the N keys along axis 1 of ``x`` from an MMA accumulator's column order to the 8-bit
    A operand's: within each 32-key chunk, key 16h + 8j + 2t + i moves to 16h + 4t + 2j + i.

    A thread holds accumulator columns 2t, 2t+1, 8+2t, 9+2t of each 32, and the fp8 A operand wants
    4 consecutive keys per thread. A sum over keys ignores their order, so P is relabelled for free
    (the attention kernel) and V's tokens are stored in the same order (``convert_v_kernel``); P
    then feeds P·V without shuffles."""
    M: tl.constexpr = x.shape[0]
    x = tl.reshape(x, (M, N // 32, 2, 2, 4, 2))
    x = tl.permute(x, (0, 1, 2, 4, 3, 5))
    return tl.reshape(x, (M, N))


@triton.jit
def _convert_v_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, scale, Final, final_slot, Out, stride_ob,
                    stride_ol, stride_od, bh, offs_l, H, L, L_OUT, D, D_PAD: tl.constexpr, HAS_MEAN: tl.constexpr,
                    KEY_PERM: tl.constexpr, RESIDUAL: tl.constexpr, INTERPRETER: tl.constexpr,
                    V_RANGE: tl.constexpr):
    """Rows ``offs_l`` of V head ``bh`` (a multiple of 32 with KEY_PERM), minus V's mean (HAS_MEAN),
    divided by ``scale`` (D_PAD channels), cast to Out's dtype and stored. Returns 1 if any value
    came out beyond ±V_RANGE (never for NaN), else 0."""
    row_ok, offs_d, v = _load_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, bh, H, offs_l, L, D, D_PAD)
    d_ok = offs_d < D
    if HAS_MEAN:
        v = v - tl.load(Final + 2 * final_slot + bh * D + offs_d, mask=d_ok, other=0.0)[None, :]
    v = tl.where(d_ok[None, :] & row_ok[:, None], v / scale[None, :], 0.0)
    # A flag, not the values' max: the max would keep every value live in registers (twice the
    # kernel's registers on sm90); a flag accumulates as the values stream to the stores.
    over = tl.max(tl.max((tl.abs(v) > V_RANGE).to(tl.int32), axis=1), axis=0)
    if KEY_PERM:  # permuted in registers, so the stores stay contiguous
        v = tl.trans(mma_operand_order(tl.trans(v), offs_l.shape[0]))
    o_ptrs = (Out + bh.to(tl.int64) * stride_ob + offs_l[:, None].to(tl.int64) * stride_ol
              + offs_d[None, :] * stride_od)
    keep = offs_l[:, None] < L_OUT
    if Out.dtype.element_ty == tl.float16:
        tl.store(o_ptrs, v.to(tl.float16), mask=keep)
    else:
        v8 = to_fp8(v, Out.dtype.element_ty, INTERPRETER)
        tl.store(o_ptrs, v8, mask=keep)
        if RESIDUAL:  # what rounding to fp8 lost, itself in fp8, D_PAD channel rows further on
            tl.store(o_ptrs + D_PAD * stride_od, to_fp8(v - v8.to(tl.float32), Out.dtype.element_ty, INTERPRETER),
                     mask=keep)
    return over


@triton.jit
def _record_overflow(V, stride_vb, stride_vh, stride_vl, stride_vd, scale, Final, final_slot, Flags, bh, row0,
                     H, L, D, ROWS: tl.constexpr, D_PAD: tl.constexpr, HAS_MEAN: tl.constexpr, V_RANGE: tl.constexpr):
    """For rows row0 .. row0 + ROWS, whose scaled values overflowed: each overflowing channel's max
    |v - mean| into Final's slot 3 (atomic max: order-free) and the head's flag, for ``redo_v``. It
    runs only when a sampled scale fell short, so it reloads the rows (from L2) 16 at a time rather
    than keep them live: a whole tile here doubled the kernel's registers on sm90."""
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    mean = tl.load(Final + 2 * final_slot + bh * D + offs_d, mask=d_ok & HAS_MEAN, other=0.0)
    amax = tl.zeros((D_PAD,), tl.float32)
    for c in tl.static_range(0, ROWS, 16):
        offs_l = row0 + c + tl.arange(0, 16)
        row_ok, _, v = _load_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, bh, H, offs_l, L, D, D_PAD)
        amax = tl.maximum(amax, tl.max(tl.where(row_ok[:, None], tl.abs(v - mean[None, :]), 0.0), axis=0))
    over = (amax / scale > V_RANGE) & d_ok  # the same division as the conversion's, so the same verdict
    tl.atomic_max(Final + 3 * final_slot + bh * D + offs_d, amax, mask=over)
    tl.store(Flags + bh, 1.0)


@triton.jit
def convert_v_kernel(
    V, stride_vb, stride_vh, stride_vl, stride_vd,
    Final, final_slot, Flags,  # from _finalize_kv_stats: slot 1 scale, 2 mean (HAS_MEAN), 3 overflow max
    Out, stride_ob, stride_ol, stride_od,  # (B*H, L, D_PAD) in any order of the last two
    H, L, L_OUT, D, check,
    BLOCK: tl.constexpr, D_PAD: tl.constexpr, HAS_MEAN: tl.constexpr, INTERPRETER: tl.constexpr,
    KEY_PERM: tl.constexpr, RESIDUAL: tl.constexpr, V_RANGE: tl.constexpr,
):
    """V minus its mean (smooth_v), divided by its per-channel scale, cast to Out's dtype.

    With ``KEY_PERM`` the tokens are stored in MMA operand order and the L_OUT - L padding rows are
    written as zeros. With ``RESIDUAL`` (fp8 only) the rounding error of each value is stored too,
    rounded to fp8 in turn, D_PAD channel rows below V: V ≈ hi + lo to about 7 mantissa bits.
    With ``check`` (the scale came from a sample) values beyond ±V_RANGE are recorded for the K
    launch, which converts their head again (``redo_v``).
    """
    bh = tl.program_id(1)
    offs_l = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D_PAD)
    scale = tl.load(Final + final_slot + bh * D + offs_d, mask=offs_d < D, other=1.0)
    over = _convert_v_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, scale, Final, final_slot, Out, stride_ob,
                           stride_ol, stride_od, bh, offs_l, H, L, L_OUT, D, D_PAD, HAS_MEAN, KEY_PERM, RESIDUAL,
                           INTERPRETER, V_RANGE)
    if check:
        if over != 0:
            _record_overflow(V, stride_vb, stride_vh, stride_vl, stride_vd, scale, Final, final_slot, Flags, bh,
                             tl.program_id(0) * BLOCK, H, L, D, BLOCK, D_PAD, HAS_MEAN, V_RANGE)


@triton.jit
def redo_v(V, stride_vb, stride_vh, stride_vl, stride_vd, Final, final_slot, Out, stride_ob, stride_ol, stride_od,
           bh, row0, H, L, L_OUT, D, ROWS: tl.constexpr, D_PAD: tl.constexpr, V_RANGE: tl.constexpr,
           V_POW2: tl.constexpr, HAS_MEAN: tl.constexpr, KEY_PERM: tl.constexpr, RESIDUAL: tl.constexpr,
           INTERPRETER: tl.constexpr):
    """Convert rows row0 .. row0 + ROWS of V head ``bh`` again, each channel that overflowed its
    sampled scale now scaled by its true max (the others keep theirs), and store that scale. Every
    program of the head stores the same values, so the order they run in does not matter."""
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    over = tl.load(Final + 3 * final_slot + bh * D + offs_d, mask=d_ok, other=0.0)
    scale = tl.load(Final + final_slot + bh * D + offs_d, mask=d_ok, other=1.0)
    scale = tl.where(over > 0, _v_scale(over, V_RANGE, V_POW2), scale)
    tl.store(Final + final_slot + bh * D + offs_d, scale, mask=d_ok)
    for c in tl.static_range(0, ROWS, 32):  # 32-row tiles (KEY_PERM_CHUNK; ROWS is a multiple): a rare path
        _convert_v_rows(V, stride_vb, stride_vh, stride_vl, stride_vd, scale, Final, final_slot, Out, stride_ob,
                        stride_ol, stride_od, bh, row0 + c + tl.arange(0, 32), H, L, L_OUT, D, D_PAD, HAS_MEAN,
                        KEY_PERM, RESIDUAL, INTERPRETER, V_RANGE)
