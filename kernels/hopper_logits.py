"""One Q·Kᵀ tile of Hopper's Gluon kernel (``hopper_gluon``) as base-2 logits: its K scales and its row max.

With one K scale per 128-key tile (per_block, per_warp) the row max is taken on the int32 sums, and
each logit is scaled inside the exp2's FMA: no multiply of its own. With one K scale per key (per_thread:
per-token Q and K scales, ``K_COLS``) the tile's 128 scales are a column vector, loaded once per tile and
warpgroup; the sums are multiplied by them (one FMUL per logit), the row max is taken on those floats (an
FMNMX per logit where the three-input integer max took 0.7), and Q's row scale (positive, so it keeps the
max where it is) goes into the max afterwards and into each logit's exp2 FMA as before (bench/NOTES.md).
With SageAttention's sm90 per_thread groups (``K_PER_GROUP``: the keys of a 128-key tile whose accumulator
columns one thread holds share a scale, ``quant.K_SM90_GROUPS``) each thread's row max is taken on its integers
and scaled once, and each logit takes one FMA into the exp2, as with a scale per tile: the tile is viewed as
(rows, 16, 4 column groups, 2), the scales and row scales meet in a (rows, 4) factor.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # no Gluon: hopper_gluon.AVAILABLE is False and nothing here is used
    gluon = None

# ``K_COLS``: how K's scales are laid out: one per 128-key tile, one per key, or one per key that is equal over
# each tile's MMA column groups (read once per group; the portable kernel reads the same array per key).
K_PER_TILE, K_PER_KEY, K_PER_GROUP = 0, 1, 2

if gluon is not None:
    KEY, GROUP = gl.constexpr(K_PER_KEY), gl.constexpr(K_PER_GROUP)  # as the kernels see them

    @gluon.jit
    def tile_logits(s, qs, ks_base, i, key0, LK, MASKED: gl.constexpr, K_COLS: gl.constexpr):
        """(x, row max, m) of the int32 tile ``s``, the i-th of a CTA's key range (its keys from ``key0
        + i·BN``; ``ks_base``: the K scale of its first tile, or of its first key with K_COLS; ``qs``: the
        rows' Q scales, with sm_scale·log2(e); with K_COLS rows past LQ hold 1, not 0, so that -inf stays
        -inf). ``tile_arg`` makes the exp2's argument from them. There, for the last tile (MASKED), the
        logits of keys past LK are -inf (they belong to the next head, or were zero-filled).

        K_PER_KEY and K_PER_GROUP are built for FP8 P·V only: a NaN key gives NaN logits in its column (its
        group's with K_PER_GROUP: ``quant`` gives the group a NaN scale), which fp8 P carries into every row's
        sums, and with INT8 P·V (which rounds NaN to a number and would need the portable kernel's poisoning
        of the row max) the cross-compiled per-key kernel spilled 171 times."""
        BN: gl.constexpr = s.type.shape[1]
        if K_COLS == GROUP:
            ROWS: gl.constexpr = s.type.shape[0]
            s4 = gl.reshape(s, [ROWS, BN // 8, 4, 2])  # key 8j + 2t + e: lane t of each quad holds group t
            # each thread's own 32 columns as one axis: one three-input integer max tree, no shuffle
            g_max = gl.max(gl.reshape(gl.permute(s4, (0, 2, 1, 3)), [ROWS, 4, BN // 4]), axis=2)
            lay: gl.constexpr = g_max.type.layout
            grp = gl.arange(0, 4, layout=gl.SliceLayout(0, lay))
            if MASKED:
                ks = gl.load(ks_base + i * BN + 2 * grp, mask=key0 + i * BN + 2 * grp < LK, other=1.0)
            else:
                ks = gl.load(ks_base + i * BN + 2 * grp)  # the group's first key holds its scale
            m = gl.convert_layout(qs, gl.SliceLayout(1, lay))[:, None] * ks[None, :]
            g4: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(3, s4.type.layout))  # (rows, 4) of the 4-D view
            m4 = gl.expand_dims(gl.expand_dims(gl.convert_layout(m, g4), 1), 3)
            if MASKED:
                cols = gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
                x = gl.convert_layout(gl.reshape(s4.to(gl.float32) * m4, [ROWS, BN]), s.type.layout)
                x = gl.where((key0 + i * BN + cols < LK)[None, :], x, float("-inf"))
                t_max = gl.max(x, axis=1)
            else:  # scales are positive: each thread's max is taken on its integers
                x = s4
                t_max = gl.convert_layout(gl.max(g_max.to(gl.float32) * m, axis=1), gl.SliceLayout(1, s.type.layout))
            m = m4
        elif K_COLS == KEY:
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

    @gluon.jit
    def tile_arg(x, m, base, s_layout: gl.constexpr, MASKED: gl.constexpr, K_COLS: gl.constexpr):
        """The exp2's argument ``x·m - base`` (one FMA per logit) of ``tile_logits``'s (x, m), in ``s_layout``:
        ``x - base`` where x is already scaled (the masked tile of per-tile or per-group scales)."""
        if MASKED and K_COLS != KEY:
            arg = x - base[:, None]
        elif K_COLS == GROUP:  # (rows, 16, 4, 2) times the (rows, 1, 4, 1) factor, back to the tile's layout
            row: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(3, x.type.layout)))
            b4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.convert_layout(base, row), 1), 1), 3)
            arg = gl.convert_layout(gl.reshape(x.to(gl.float32) * m - b4, [x.type.shape[0], x.type.shape[1] * 8]),
                                    s_layout)
        else:
            arg = x.to(gl.float32) * m[:, None] - base[:, None]
        return arg
