"""Rotary position embedding as ComfyUI applies it before attention (Flux, Chroma, HiDream, Wan), in one
launch: each pair (x[2i], x[2i+1]) of a row times its 2x2 matrix from ``freqs`` in fp32, rounded once to
the input's dtype.

ComfyUI's own version (``comfy.ldm.flux.math``, up to 0.3.75) runs five eager passes over fp32 copies of
q and k; this reads each input once and writes each output once, rounding each product and sum as the
function it stands in for does (``apply``'s ``fma``), so the outputs are ComfyUI's bits.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .arch import interpreter_enabled
from .devices import wrapped

BLOCK_ROWS = 4  # rows per program, one warp: fastest on the H200 at Flux and Wan shapes (bench/NOTES.md)
NUM_WARPS = 1
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _rope_rows(X, Out, F, rows, live, S1, S2, sx0, sx1, sx2, so0, so1, so2, sf0, sf1, sf2,
               D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, FMA: tl.constexpr):
    """Whole rows, loaded and stored contiguously; pairs and matrices taken apart in registers."""
    i2 = rows % S2
    i1 = (rows // S2) % S1
    i0 = rows // (S1 * S2)
    d = tl.arange(0, D_PAD)
    ok = live[:, None] & (d < D)[None, :]
    x = tl.load(X + (i0 * sx0 + i1 * sx1 + i2 * sx2)[:, None] + d[None, :], mask=ok, other=0.0).to(tl.float32)
    xe, xd = tl.split(tl.reshape(x, (BLOCK, D_PAD // 2, 2)))
    j = tl.arange(0, 2 * D_PAD)  # each pair's 2x2 matrix, row-major: 4 floats
    fok = live[:, None] & (j < 2 * D)[None, :]
    f = tl.load(F + (i0 * sf0 + i1 * sf1 + i2 * sf2)[:, None] + j[None, :], mask=fok, other=0.0)
    fc0, fc1 = tl.split(tl.reshape(f, (BLOCK, D_PAD // 2, 2, 2)))  # column 0 and 1 of each matrix
    f00, f10 = tl.split(fc0)
    f01, f11 = tl.split(fc1)
    if FMA:  # torch's addcmul_: the second product added without rounding it first
        ye = tl.fma(f01, xd, f00 * xe)
        yd = tl.fma(f11, xd, f10 * xe)
    else:
        ye = f00 * xe + f01 * xd
        yd = f10 * xe + f11 * xd
    y = tl.reshape(tl.join(ye, yd), (BLOCK, D_PAD)).to(Out.dtype.element_ty)
    tl.store(Out + (i0 * so0 + i1 * so1 + i2 * so2)[:, None] + d[None, :], y, mask=ok)


@triton.jit
def rope_kernel(X, OX, Y, OY, F, n_rows, S1, S2,
                sx0, sx1, sx2, so0, so1, so2, sy0, sy1, sy2, sp0, sp1, sp2, sf0, sf1, sf2,
                D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, PAIR: tl.constexpr,
                FMA: tl.constexpr):
    """``BLOCK`` rows of X (and of Y with the same ``freqs``, when ``PAIR``) of a (S0, S1, S2, D) tensor whose
    last dimension is contiguous; ``F`` broadcast to (S0, S1, S2, D/2, 2, 2) by strides, its last three
    dimensions contiguous."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = rows < n_rows
    _rope_rows(X, OX, F, rows, live, S1, S2, sx0, sx1, sx2, so0, so1, so2, sf0, sf1, sf2, D, D_PAD, BLOCK, FMA)
    if PAIR:
        _rope_rows(Y, OY, F, rows, live, S1, S2, sy0, sy1, sy2, sp0, sp1, sp2, sf0, sf1, sf2, D, D_PAD, BLOCK, FMA)


def unsupported(x: torch.Tensor, freqs: torch.Tensor) -> Optional[str]:
    """Why ``apply`` cannot take ``x`` with ``freqs`` (None: it can)."""
    if not isinstance(x, torch.Tensor) or not isinstance(freqs, torch.Tensor) or wrapped(x, freqs):
        return "not plain tensors"  # a wrapper subclass's pointer need not be its data (``devices``)
    if x.dtype not in DTYPES or freqs.dtype != torch.float32:
        return f"dtypes {x.dtype} / {freqs.dtype}"
    if x.device != freqs.device or not (x.is_cuda or (x.device.type == "cpu" and interpreter_enabled())):
        return f"device {x.device}"
    if torch.is_grad_enabled() and (x.requires_grad or freqs.requires_grad):
        return "needs gradients"
    if not 3 <= x.dim() <= 4 or x.shape[-1] % 2 or x.stride(-1) != 1 or x.numel() == 0:
        return f"shape {tuple(x.shape)} / strides {x.stride()}"
    want = (*x.shape[:-1], x.shape[-1] // 2, 2, 2)
    if freqs.dim() > len(want) or tuple(freqs.shape[-3:]) != want[-3:]:
        return f"freqs shape {tuple(freqs.shape)}"
    try:
        if torch.broadcast_shapes(freqs.shape, want) != torch.Size(want):
            return f"freqs shape {tuple(freqs.shape)}"
    except RuntimeError:
        return f"freqs shape {tuple(freqs.shape)}"
    return None


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """A 3-D (S1, S2, D) tensor as (1, S1, S2, D): the kernel walks three leading dimensions."""
    return t if t.dim() == 4 else t.unsqueeze(0)


def apply(x: torch.Tensor, freqs: torch.Tensor, y: Optional[torch.Tensor] = None, fma: bool = False):
    """RoPE of ``x`` (and of ``y``, same shape, with the same ``freqs``): new contiguous tensors of the
    inputs' dtypes. ``fma``: each sum rounded as torch's ``addcmul_`` rounds it (ComfyUI's ``apply_rope1``),
    else as ``a * b + c * d`` (the RoPE ComfyUI 0.3.64's ``attention`` inlines). Callers check
    ``unsupported`` for each input first."""
    if y is not None and (y.shape != x.shape or y.device != x.device):
        raise ValueError(f"y: shape {tuple(y.shape)} on {y.device}, expected x's {tuple(x.shape)} on {x.device}")
    half = x.shape[-1] // 2
    xv = _rows_view(x)
    if freqs.stride()[-3:] != (4, 2, 1):  # each pair's matrix contiguous, as ComfyUI builds them
        freqs = freqs.contiguous()
    f = freqs.expand(*xv.shape[:-1], half, 2, 2)
    ox = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    pair = y is not None
    yv = _rows_view(y) if pair else xv
    oy = torch.empty(y.shape, dtype=y.dtype, device=y.device) if pair else ox
    oxv, oyv = _rows_view(ox), _rows_view(oy)
    S0, S1, S2 = xv.shape[:3]
    n_rows = S0 * S1 * S2
    grid = (triton.cdiv(n_rows, BLOCK_ROWS),)
    from .launch import _launch  # the library's one launch path (the installer's cross-compile records it)

    _launch(rope_kernel, grid, (xv, oxv, yv, oyv, f, n_rows, S1, S2, *xv.stride()[:3], *oxv.stride()[:3],
                                *yv.stride()[:3], *oyv.stride()[:3], *f.stride()[:3]),
            dict(D=2 * half, D_PAD=triton.next_power_of_2(2 * half), BLOCK=BLOCK_ROWS, PAIR=pair, FMA=fma),
            num_warps=NUM_WARPS, enable_fp_fusion=False)
    return (ox, oy) if pair else ox
