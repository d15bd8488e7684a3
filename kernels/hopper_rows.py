"""Where one warpgroup of Hopper's Gluon kernel (``hopper_gluon``) puts its rows: the output rows' pointers, and
for ring attention the natural-log LSE with Q's K-mean bias (``hopper_lse``'s twins)."""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon: hopper_gluon.AVAILABLE is False and nothing here is used
    gluon = None

if gluon is not None:

    @gluon.jit
    def qbias_rows(QBias, bh, row0, LQ, ROWS: gl.constexpr):
        """Q's K-mean bias for one warpgroup's rows, a row per thread (``store_lse``'s layout)."""
        one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        offs = row0 + gl.arange(0, ROWS, layout=one)
        return gl.load(QBias + bh.to(gl.int64) * LQ + offs, mask=offs < LQ, other=0.0)

    @gluon.jit
    def store_lse(Lse, QBias, m, l_sum, bh, row0, LQ, P_LOG2: gl.constexpr, HAS_QBIAS: gl.constexpr, qbias=None):
        """One warpgroup's rows of the natural-log LSE (B·H, LQ), from the row max (or INT8 shift) ``m`` and
        the row sums in units of 2^(m - P_LOG2), as the portable kernel writes it: -inf for a row with no
        live key, NaN where the sums are; plus Q's K-mean bias (``QBias``) when K was smoothed (``qbias``: those
        rows of it, loaded already by ``qbias_rows``)."""
        ROWS: gl.constexpr = m.type.shape[0]
        one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a row per thread: few registers at the end
        m = gl.convert_layout(m, one)
        l_sum = gl.convert_layout(l_sum, one)
        offs = row0 + gl.arange(0, ROWS, layout=one)
        live = l_sum != 0
        lse = gl.where(live, (m - P_LOG2 + gl.log2(gl.where(live, l_sum, 1.0))) * 0.6931471805599453, float("-inf"))
        ok = offs < LQ
        base = bh.to(gl.int64) * LQ
        if HAS_QBIAS:
            if qbias is None:
                qbias = gl.load(QBias + base + offs, mask=ok, other=0.0)
            lse += qbias
        gl.store(Lse + base + offs, lse, mask=ok)

    @gluon.jit
    def out_rows(tile, Out, stride_ob, stride_oh, stride_om, b, h, row0, LQ, D):
        """Pointers to one warpgroup's output rows of head (b, h) from row ``row0``, in the shape and
        layout of ``tile`` (a layout is no argument Triton 3.6 can pass), and the mask of the real
        rows and channels."""
        ROWS: gl.constexpr = tile.type.shape[0]
        D_PAD: gl.constexpr = tile.type.shape[1]
        rows_o: gl.constexpr = gl.SliceLayout(1, tile.type.layout)
        cols_o: gl.constexpr = gl.SliceLayout(0, tile.type.layout)
        offs_mo = row0 + gl.arange(0, ROWS, layout=rows_o)
        offs_do = gl.arange(0, D_PAD, layout=cols_o)
        # Out is api's own buffer: channels contiguous (no channel stride is passed) and, with D % 8 == 0
        # (api's condition), every row 16-byte aligned. Said explicitly because Triton 3.6 does not
        # carry the launch's alignment facts into the partitions (scalar 2-byte stores there).
        row_off = gl.multiple_of(b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
                                 + offs_mo.to(gl.int64) * stride_om, 8)
        o_ptrs = gl.multiple_of(Out, 16) + row_off[:, None] + offs_do[None, :]
        return o_ptrs, (offs_mo < LQ)[:, None] & (offs_do < D)[None, :]
