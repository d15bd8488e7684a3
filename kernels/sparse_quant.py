"""``sparse_attn``'s INT8 quantization of Q and K: the dense path's rounding (``quant``: its scales, its rotation
by either method) in a launch that also writes the router's block proxies from the rows it reads anyway.

Per 64-token block it writes the fp32 mean of the raw rows (Q's centroids, K's block means), so the sparse
call reads Q and K once each before the attention kernel instead of twice (issue 54: the routing share). K
is centred by an estimate of its centre made before its launch (``sparse_launch``: a sample of K's rows), not
by the mean of its block means, which only exists after the launch; the Q launch, which runs after it, writes
per row the dot products with given vectors (the kernel's per-row tail offset and the LSE's bias), from the
unrotated rows in fp32.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import devices, rotation
from .arch import interpreter_enabled
from .host_quant import _rotation_signs
from .launch import _cdiv, _launch
from .quant import MEAN_SUBTRACT_C, _quantize_rotated_tiles, _quantize_tile
from .sparse_reference import BLOCK

__all__ = ["sparse_quantize_int8_kernel", "quantize_with_means"]

# Registers per thread of a 4-warp "tiled" launch (NVIDIA; 8-warp ones keep ``rotation.TILED_MAXNREG``). Its
# ~57 KB of shared memory already holds an H200 SM to 3 such programs, which 168 registers allow too; at
# ``rotation.TILED_MAXNREG`` (128) the block means and row dots spilled (2-60 local loads and stores, sm90
# cross-compiled), at 168 none.
TILED_4WARP_MAXNREG = 168

# Columns of the small MMAs below: the smallest N of a tensor-core product in Triton.
SUMS_COLS = tl.constexpr(16)


@triton.jit
def _mma(a, b, INTERPRETER: tl.constexpr):
    """a @ b in fp32; the interpreter's 16-bit dot reads the bits as integers: the same exact values in fp32."""
    if INTERPRETER:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


@triton.jit
def _split3(v, dtype: tl.constexpr):
    """fp32 ``v`` as three ``dtype`` parts whose sum is ``v`` (24 bits: fp32's), so 16-bit rows times them on the
    tensor cores are exact products; non-finite ``v``: NaN parts."""
    hi = v.to(dtype).to(tl.float32)
    mid = (v - hi).to(dtype).to(tl.float32)
    lo = (v - hi - mid).to(dtype).to(tl.float32)
    return hi, mid, lo


@triton.jit
def _row_dots_operand(shift, centre, dtype: tl.constexpr, ROW_DOTS: tl.constexpr, D_PAD: tl.constexpr):
    """(D_PAD, SUMS_COLS): columns 0-2 ``shift`` split in three (``_split3``), 3-5 ``centre`` (ROW_DOTS == 2)."""
    c = tl.arange(0, SUMS_COLS)[None, :]
    op = tl.zeros((D_PAD, SUMS_COLS), tl.float32)
    if ROW_DOTS > 0:
        hi, mid, lo = _split3(shift, dtype)
        op = tl.where(c == 0, hi[:, None], tl.where(c == 1, mid[:, None], tl.where(c == 2, lo[:, None], op)))
    if ROW_DOTS == 2:
        hi, mid, lo = _split3(centre, dtype)
        op = tl.where(c == 3, hi[:, None], tl.where(c == 4, mid[:, None], tl.where(c == 5, lo[:, None], op)))
    return op.to(dtype)


@triton.jit
def _store_mean(Means, total, bh, blk, L, NB, d, D_PAD: tl.constexpr):
    """Block ``blk``'s mean (its column sums over its live rows); a tile's blocks past the last are skipped."""
    n_live = tl.minimum(L - blk * 64, 64).to(tl.float32)
    # The mask as a tensor: Triton 3.9's interpreter refuses a scalar one.
    tl.store(Means + (bh.to(tl.int64) * NB + blk) * D_PAD + d, total / n_live, mask=(d * 0 + blk) < NB)


@triton.jit
def _shared_proxies(bh, args, FLAGS: tl.constexpr):
    """``quant``'s first MEANS hook, once per program: what ``_block_proxies`` needs for every tile. In the tiled
    body it runs after the signs' load, where this kernel had it: its Q launches' SASS is unchanged by the fold
    (bench/NOTES.md). ``X`` is there for its dtype."""
    Means, NB, Offset, Bias, bias_mult, Centre, Mu, off_mult, H_KV_DIV, X = args
    ROW_DOTS: tl.constexpr = FLAGS[0]
    MMA_SUMS: tl.constexpr = FLAGS[1]
    D_PAD: tl.constexpr = FLAGS[3]
    kvh = bh // H_KV_DIV  # GQA: query head bh reads key/value head kvh
    d = tl.arange(0, D_PAD)
    # Compiled tuples take no None: zeros stand in for what the launch does not use (and are dropped).
    centre = tl.zeros((D_PAD,), tl.float32)
    shift = centre
    dots_op = tl.zeros((D_PAD, SUMS_COLS), X.dtype.element_ty)
    if ROW_DOTS > 0:
        centre = tl.load(Centre + kvh.to(tl.int64) * D_PAD + d)
        shift = tl.load(Mu + kvh.to(tl.int64) * D_PAD + d) - centre
        # A non-finite K mean (a NaN/Inf key off the sample) makes every row NaN, as a non-finite centre does.
        shift = tl.where(tl.abs(shift) < float("inf"), shift, float("nan")) * off_mult
        if MMA_SUMS:  # the per-row dots' operand, once per program
            dots_op = _row_dots_operand(shift, centre if ROW_DOTS == 2 else None, X.dtype.element_ty, ROW_DOTS,
                                        D_PAD)
    return Means, NB, Offset, Bias, bias_mult, shift, centre, dots_op


@triton.jit
def _block_proxies(x, offs_l, row_ok, tile, bh, L, args, FLAGS: tl.constexpr):
    """``quant``'s MEANS hook, per tile: from tile ``tile``'s rows as loaded, the block means and the per-row dots."""
    Means, NB, Offset, Bias, bias_mult, shift, centre, dots_op = args
    BLOCK_ROWS: tl.constexpr = x.shape[0]
    D_PAD: tl.constexpr = x.shape[1]
    ROW_DOTS: tl.constexpr = FLAGS[0]
    MMA_SUMS: tl.constexpr = FLAGS[1]
    INTERPRETER: tl.constexpr = FLAGS[2]
    SUB: tl.constexpr = BLOCK_ROWS // 64  # 64-token blocks per tile
    rows = tl.arange(0, BLOCK_ROWS)
    d = tl.arange(0, D_PAD)
    cols = tl.arange(0, SUMS_COLS)
    xf = x.to(tl.float32)
    if MMA_SUMS:  # column sums and row dots as small MMAs of the 16-bit rows (exact products, fp32 sums)
        # row c of the product: block (c % SUB)'s column sums, every row filled so the max picks it exactly
        # (a where, not a cast of the bool: the interpreter turns True into bf16 0)
        sel = tl.where((cols % SUB)[:, None] == (rows // 64)[None, :], 1.0, 0.0).to(x.dtype)
        sums = _mma(sel, x, INTERPRETER)
        for s in tl.static_range(SUB):
            _store_mean(Means, tl.max(tl.where((cols % SUB == s)[:, None], sums, float("-inf")), axis=0), bh,
                        tile * SUB + s, L, NB, d, D_PAD)
        if ROW_DOTS > 0:
            r = _mma(x, dots_op, INTERPRETER)
            tl.store(Offset + bh.to(tl.int64) * L + offs_l, tl.sum(tl.where(cols[None, :] < 3, r, 0.0), 1),
                     mask=row_ok)
        if ROW_DOTS == 2:
            tl.store(Bias + bh.to(tl.int64) * L + offs_l,
                     tl.sum(tl.where((cols[None, :] >= 3) & (cols[None, :] < 6), r, 0.0), 1) * bias_mult,
                     mask=row_ok)
    else:  # fp32 rows: fp32 sums on the CUDA cores
        for s in tl.static_range(SUB):  # the block means (rows past L load as 0)
            if SUB == 1:
                total = tl.sum(xf, axis=0)
            else:
                total = tl.sum(tl.where((rows // 64 == s)[:, None], xf, 0.0), axis=0)
            _store_mean(Means, total, bh, tile * SUB + s, L, NB, d, D_PAD)
        if ROW_DOTS > 0:
            tl.store(Offset + bh.to(tl.int64) * L + offs_l, tl.sum(xf * shift[None, :], axis=1), mask=row_ok)
        if ROW_DOTS == 2:
            tl.store(Bias + bh.to(tl.int64) * L + offs_l, tl.sum(xf * centre[None, :], axis=1) * bias_mult,
                     mask=row_ok)


@triton.jit
def sparse_quantize_int8_kernel(
    X, stride_xb, stride_xh, stride_xl, stride_xd,
    Centre,  # fp32 (B*H_KV, D_PAD): K's centre; subtracted from each row (SUBTRACT; ROTATE_TILES: rotated)
    Mu,  # fp32 (B*H_KV, D_PAD): the mean of K's block means (ROW_DOTS)
    Out, Scale,  # int8 (B*H, L, D_PAD); fp32 (B*H, L) or (B*H, cdiv(L, BLOCK_ROWS))
    Means,  # fp32 (B*H, NB, D_PAD): the raw rows' mean per 64-token block
    Offset,  # fp32 (B*H, L): x·(mu - centre)·off_mult (ROW_DOTS >= 1)
    Bias,  # fp32 (B*H, L): x·centre·bias_mult (ROW_DOTS == 2)
    Signs,  # (D_PAD, D_PAD) the rotation's signs (ROTATE), fp16 or, with ROTATE_TILES, X's dtype; else unused
    H, H_KV_DIV, L, D, NB, scale_mult, off_mult, bias_mult,
    BLOCK_ROWS: tl.constexpr, GROUP: tl.constexpr, D_PAD: tl.constexpr, SCALE_PER_BLOCK: tl.constexpr,
    SUBTRACT: tl.constexpr, ROW_DOTS: tl.constexpr, ROTATE: tl.constexpr, ROTATE_TILES: tl.constexpr,
    STAGES: tl.constexpr, INTERPRETER: tl.constexpr, MMA_SUMS: tl.constexpr = False,
):
    """The dense launch's quantization (``quant._quantize_rotated_tiles`` with ROTATE_TILES, else
    ``quant._quantize_tile``; the centre subtracted as its MEAN_SUBTRACT, the tiled one's after the product) with
    ``_shared_proxies`` and ``_block_proxies`` as its MEANS hooks. A kernel of its own so that profiles and the
    cross-compile checks tell the sparse launch from the dense one."""
    args = (Means, NB, Offset, Bias, bias_mult, Centre, Mu, off_mult, H_KV_DIV, X)
    MODE: tl.constexpr = MEAN_SUBTRACT_C if SUBTRACT else 0
    # Centre stands in for the dense launch's statistics buffers, which MEAN_NONE and MEAN_SUBTRACT do not read
    # (K's centre is Final's only row per head: slot 0, row stride D_PAD).
    if ROTATE_TILES > 0:
        _quantize_rotated_tiles(X, stride_xb, stride_xh, stride_xl, stride_xd, Centre, 0, Centre, 0, Out, Scale,
                                Bias, Signs, H, H_KV_DIV, L, L, 0, D, 0, scale_mult, bias_mult, BLOCK_ROWS, GROUP,
                                D_PAD, MODE, SCALE_PER_BLOCK, False, False, 0, 1.0, False, 16, False, INTERPRETER,
                                ROTATE_TILES, STAGES, (_shared_proxies, _block_proxies), args,
                                (ROW_DOTS, MMA_SUMS, INTERPRETER, D_PAD))
    else:
        _quantize_tile(X, stride_xb, stride_xh, stride_xl, stride_xd, Centre, 0, Centre, 0, Out, Scale, Bias, Signs,
                       H, H_KV_DIV, L, L, 0, D, 0, scale_mult, bias_mult, BLOCK_ROWS, GROUP, D_PAD, MODE,
                       SCALE_PER_BLOCK, False, False, 0, 1.0, False, 16, False, ROTATE, INTERPRETER,
                       (_shared_proxies, _block_proxies), args, (ROW_DOTS, MMA_SUMS, INTERPRETER, D_PAD), D_PAD)


def quantize_with_means(x, group: int, rows: int, d_pad: int, scale_mult: float, centre=None, subtract=False,
                        mu=None, off_mult=1.0, bias_mult=None, kv_div: int = 1, per_block: bool = False,
                        rotate: int = 0, method: str = "dot", mma_sums: bool = True):
    """INT8 copy (B*H, L, D_PAD) and scales of a (B, H, L, D) view, as ``host_quant._quantize_qk`` makes them
    (``rows`` per tile, scale ``group``, one per tile with ``per_block``), plus the fp32 block means
    (B*H, nb, D_PAD) of the raw rows. ``centre`` (B*H_KV, D_PAD): K's centre, subtracted before rounding with
    ``subtract`` (with ``method`` "tiled" pass it times the rotation's signs). With ``mu`` (B*H_KV, D_PAD) also
    per row x·(mu - centre)·off_mult and, with ``bias_mult``, x·centre·bias_mult (each (B*H, L)). ``mma_sums``:
    for 16-bit ``x`` those sums as small MMAs of the rows as loaded (exact products, fp32 sums), not fp32
    reductions across the tile's rows, which cost the launch 60-70 % more instructions and several times
    the barriers of the plain launch (sm90 SASS, bench/sparse_route_xc.py).
    Returns (int8, scales, means, offsets or None, biases or None)."""
    B, H, L, D = x.shape
    nb = _cdiv(L, BLOCK)
    dev = x.device
    assert rows % BLOCK == 0, rows
    out = torch.empty((B * H, L, d_pad), dtype=torch.int8, device=dev)
    scale = torch.empty((B * H, _cdiv(L, rows) if per_block else L), dtype=torch.float32, device=dev)
    means = torch.empty((B * H, nb, d_pad), dtype=torch.float32, device=dev)
    row_dots = 0 if mu is None else 1 if bias_mult is None else 2
    offset = torch.empty((B * H, L), dtype=torch.float32, device=dev) if row_dots else None
    bias = torch.empty((B * H, L), dtype=torch.float32, device=dev) if row_dots == 2 else None
    tiles = rotation.tiles(method, B * H * _cdiv(L, rows), devices.sm_count(dev)) if rotate else 0
    if tiles:  # the tiled product leaves 1/sqrt(block) to the scales
        scale_mult = scale_mult / math.sqrt(rotate)
    signs = _rotation_signs(d_pad, rotate, dev, x.dtype if tiles else torch.float16) if rotate else scale
    warps = rotation.quant_warps(method, rows, d_pad) if rotate else 4
    regs = TILED_4WARP_MAXNREG if warps == 4 else rotation.TILED_MAXNREG
    _launch(sparse_quantize_int8_kernel, (_cdiv(_cdiv(L, rows), max(tiles, 1)), B * H), (
        x, *x.stride(), centre if centre is not None else scale, mu if mu is not None else scale, out, scale, means,
        offset if offset is not None else scale, bias if bias is not None else scale, signs, H, kv_div, L, D, nb,
        scale_mult, float(off_mult), float(bias_mult or 0.0),
    ), dict(BLOCK_ROWS=rows, GROUP=group, D_PAD=d_pad, SCALE_PER_BLOCK=per_block, SUBTRACT=subtract,
            ROW_DOTS=row_dots, ROTATE=rotate, ROTATE_TILES=tiles, STAGES=rotation.PIPE_STAGES if tiles else 1,
            INTERPRETER=interpreter_enabled(), MMA_SUMS=mma_sums and x.dtype in (torch.float16, torch.bfloat16)),
        num_warps=warps, **({"maxnreg": regs} if tiles and x.is_cuda and torch.version.hip is None else {}))
    return out, scale, means, offset, bias
