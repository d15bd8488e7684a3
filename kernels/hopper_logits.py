"""One Q·Kᵀ tile of Hopper's Gluon kernel (``hopper_gluon``) as base-2 logits: its K scales and its row max.

With one K scale per 128-key tile (per_block, per_warp) the row max is taken on the int32 sums, and
each logit is scaled inside the exp2's FMA: no multiply of its own. With one K scale per key (per_thread:
per-token Q and K scales, ``K_COLS``) the tile's 128 scales are a column vector, loaded once per tile and
warpgroup; the sums are multiplied by them (one FMUL per logit), the row max is taken on those floats (an
FMNMX per logit where the three-input integer max took 0.7), and Q's row scale (positive, so it keeps the
max where it is) goes into the max afterwards and into each logit's exp2 FMA as before (bench/NOTES.md).
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon: hopper_gluon.AVAILABLE is False and nothing here is used
    gluon = None

if gluon is not None:

    @gluon.jit
    def tile_logits(s, qs, ks_base, i, key0, LK, MASKED: gl.constexpr, K_COLS: gl.constexpr):
        """(x, row max, m) of the int32 tile ``s``, the i-th of a CTA's key range (its keys from ``key0
        + i·BN``; ``ks_base``: the K scale of its first tile, or of its first key with K_COLS; ``qs``: the
        rows' Q scales, with sm_scale·log2(e); with K_COLS rows past LQ hold 1, not 0, so that -inf stays
        -inf). The exp2 takes ``x·m - base``, or ``x - base`` for the last tile of per-tile scales (MASKED):
        there, as in the masked tile of K_COLS, the logits of keys past LK are -inf (they belong to the next
        head, or were zero-filled).

        K_COLS is built for FP8 P·V only: a NaN key gives NaN logits in its column, which fp8 P carries
        into every row's sums, and with INT8 P·V (which rounds NaN to a number and would need the
        portable kernel's poisoning of the row max) the cross-compiled kernel spilled 171 times."""
        BN: gl.constexpr = s.type.shape[1]
        if K_COLS:
            cols = gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
            if MASKED:
                live = key0 + i * BN + cols < LK
                ks = gl.load(ks_base + i * BN + cols, mask=live, other=0.0)
                x = gl.where(live[None, :], s.to(gl.float32) * ks[None, :], float("-inf"))
            else:
                ks = gl.load(ks_base + i * BN + cols)
                x = s.to(gl.float32) * ks[None, :]
            t_max = gl.max(x, axis=1) * qs
            m = qs
        else:
            m = qs * gl.load(ks_base + i)
            if MASKED:
                offs_n = key0 + i * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
                x = gl.where((offs_n < LK)[None, :], s.to(gl.float32) * m[:, None], float("-inf"))
                t_max = gl.max(x, axis=1)
            else:  # scales are positive: the row max is taken on the integers
                x = s
                t_max = gl.max(s, axis=1).to(gl.float32) * m
        return x, t_max, m
