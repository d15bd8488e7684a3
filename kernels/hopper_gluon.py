"""Hopper (sm90) attention for long sequences, in Gluon: three warpgroups share every K/V tile.

The portable kernel runs one warpgroup (64 query rows) per CTA, three CTAs per SM, and each CTA
streams the whole K and V of its head: three copies of every tile cross L2 into shared memory, and
Nsight Compute had L2 at 62 % of its throughput, the busiest unit of that kernel. Here one CTA holds
three warpgroups of 64 rows each (192 rows); consumer 0 also fills a ring of K/V tiles through TMA
copies, and each tile is released once all three have multiplied it. The warpgroups run their loops
independently (no turn-taking: a FlashAttention-3 style ping-pong of two warpgroups measured 15-20 %
slower than three free-running ones, bench/NOTES.md), with the same registers as the
portable kernel (168, so 3 × 128 threads fill the register file).

The math is the portable kernel's, in the same order: INT8 Q·Kᵀ with one K scale per tile, integer
row max, one FMA per logit into exp2 (per-token K scales: one multiply more, ``hopper_logits``), P
rounded to fp8 and relabelled into MMA operand order (``quant.mma_operand_order``; V is stored that
way), a fresh fp32 P·V accumulator per tile added into
the running output. One difference: the softmax's row sums come from the tensor cores (an MMA of the
fp8 P with a block of ones), which takes 64 adds and two shuffles per thread and tile off the
softmax (bench/NOTES.md). They sum the fp8-rounded P that the numerator uses, so outputs
differ from the portable kernel's by that rounding (bench/gpu_check.py: cosine between them ≥ 0.99995).

One CTA per SM and equal work per CTA: when the last wave is partial, ``shared_kv_split_kernel``
runs its CTAs in key shares instead, which merge their rows into the output in turn
(``kernels/tail_split.py``).

Scope: FP8 P·V (with fp8+residual, a second MMA with V's rounding error into the same tile sum) or
INT8 P·V (P shifted by each tile's own row max and rounded to 0..255, exact int32 sums scaled back),
head_dim padded to 128 and a multiple of 8 (16-byte output stores), K scales per tile or per token
(``K_COLS``: per_thread, the drop-in's default), no mask, not causal. With the LSE (ring attention's
every step), ``hopper_lse``'s twins of both kernels also store each row's natural-log log-sum-exp
(the last key share of a split CTA, once merged). It wins from
4,608 query tokens (bench/results/sm90_gluon_min_len_ab2.json); ``api`` sends it nothing
else. Gluon ships inside the triton package (3.5+); without it ``AVAILABLE`` is False and the portable
kernel runs.
"""
from __future__ import annotations

from .attention import (  # Triton functions: Gluon inlines them
    HOT_LOGIT_LIMIT,
    HOT_LOGIT_LIMIT_FP8,
    finish_rows,
    int8_p_shift,
)
from .quant import P_OFFSET, mma_operand_order, round_p_offset_int8
from .tail_split import merge_rows

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .hopper_logits import KEY, tile_arg, tile_logits
    from .hopper_rows import out_rows, qbias_rows, store_lse  # one warpgroup's rows out
    from .triton_compat import TRITON_VERSION, partition_barrier, tma_load  # what differs between Tritons

    # Triton 3.9 spills hundreds of registers when a second async MMA is issued while P·V's runs:
    # fp8+residual's residual MMA onto P·V's accumulator (254-287 spill instructions, 3.8: none), INT8's
    # row-sum MMA (228-243, 3.8: 18-35). Waiting for P·V's MMA first brings fp8+residual to the plain
    # fp8 kernel's count and INT8 to 33-64 (bench/NOTES.md, "Triton 3.9").
    WAIT_PV_MMA = gl.constexpr(TRITON_VERSION >= (3, 9))
    # ``_attention``'s LSE: none, each row's LSE, or the LSE plus Q's K-mean bias (``hopper_lse``'s twins).
    LSE_NONE, LSE_STORE, LSE_STORE_QBIAS = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)

    AVAILABLE = True
except ImportError:  # triton without Gluon: the portable kernel serves every call
    AVAILABLE = False

CONSUMERS = 3  # warpgroups per CTA, 64 query rows each
ROWS = 64
BLOCK_N = 128
STAGES = 4  # K/V ring depth: 24 KB of Q + 4 × 32 KB, one CTA per SM
SPLIT_RESIDUAL_STAGES = 3  # fp8+residual's split kernel: 3 × 48 KB, room for its output's layout change
HEAD_DIM = 128  # padded head dim this kernel is built for
REGISTERS = 168  # per thread: 3 warpgroups × 128 threads × 168 fill the 64K register file


def grid(lq: int, lk: int) -> tuple[int, int]:
    """(CTAs per head, key tiles per CTA) of a call with ``lq`` query and ``lk`` key tokens."""
    return -(-lq // (CONSUMERS * ROWS)), -(-lk // BLOCK_N)


if AVAILABLE:

    @gluon.jit
    def _fill(k_desc, v_desc, k_smem, v_smem, vres_smem, kv_ready, kv_empty, i, n_local, k_row0, v_row, v_col0,
              STAGES: gl.constexpr, V_RES: gl.constexpr):
        """Start the TMA copies of this CTA's ``i``-th K and Vᵀ tile (K rows from ``k_row0``, Vᵀ columns
        from ``v_col0``) into slot i % STAGES once every warpgroup has released the tile that slot held
        (no-op past its ``n_local`` tiles)."""
        BN: gl.constexpr = k_smem.type.shape[1]
        D_PAD: gl.constexpr = k_smem.type.shape[2]
        if i < n_local:
            st = i % STAGES
            mbarrier.wait(kv_empty.index(st), ((i // STAGES) & 1) ^ 1)
            bar = kv_ready.index(st)
            mbarrier.expect(bar, k_desc.block_type.nbytes + (1 + V_RES) * v_desc.block_type.nbytes)
            tma_load(k_desc, [k_row0 + i * BN, 0], bar, k_smem.index(st))
            tma_load(v_desc, [v_row, v_col0 + i * BN], bar, v_smem.index(st))
            if V_RES:  # V's rounding residual follows each head's V
                tma_load(v_desc, [v_row + D_PAD, v_col0 + i * BN], bar, vres_smem.index(st))

    @gluon.jit
    def _tile(q, k_smem, v_smem, vres_smem, ones_smem, kv_ready, kv_empty, s, pv, rs, acc, m_i, sh_i, l_acc, qs,
              ks_base, tb_base, i, key0, LK, k_desc, v_desc, n_local, k_row0, v_row, P_LOG2: gl.constexpr,
              STAGES: gl.constexpr, MASKED: gl.constexpr, p_layout: gl.constexpr, V_RES: gl.constexpr,
              FILL: gl.constexpr, K_COLS: gl.constexpr):
        """The ``i``-th K/V tile of this CTA's key range (``key0``: its first key; ``ks_base``: its
        first tile's K scale, or its first key's with K_COLS; ``tb_base``: its first tile's INT8 V column
        sums) for one warpgroup. ``s``, ``pv`` and ``rs`` are the previous tile's (dead) results, handed
        back as the MMAs' ignored accumulators so no zero tile stays live in registers.
        The row sums of P come from the tensor cores (P times a column block of ones, ``rs``), not
        from 64 adds and two shuffles per thread: ``l_acc`` holds them, every column the same.

        With FILL (warpgroup 0) the ring's refill, tile i + STAGES - 1, is started while this tile's P·V
        runs: its barrier waits and copies then cost that warpgroup nothing, where before the tile they
        made it the last of the three to finish every CTA."""
        BN: gl.constexpr = k_smem.type.shape[1]
        D_PAD: gl.constexpr = acc.type.shape[1]
        row_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        row_l: gl.constexpr = gl.SliceLayout(1, l_acc.type.layout)
        PV_INT8: gl.constexpr = v_smem.dtype == gl.int8
        st = i % STAGES
        mbarrier.wait(kv_ready.index(st), (i // STAGES) & 1)
        s = warpgroup_mma_wait(0, deps=(warpgroup_mma(q, k_smem.index(st).permute((1, 0)), s, use_acc=False,
                                                      is_async=True),))
        x, t_max, m = tile_logits(s, qs, ks_base, i, key0, LK, MASKED, K_COLS)
        m_new = gl.maximum(m_i, t_max)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        if PV_INT8:
            # P shifted by this tile's own row max (its largest weight rounds to 255); the sums are kept
            # in units of that shift (``attention._attn_tile``).
            shift = int8_p_shift(t_max, m_use)
            alpha = gl.exp2(sh_i - shift)
        else:
            shift = m_use
            alpha = gl.exp2(m_i - m_use)
        s_layout: gl.constexpr = s.type.layout
        arg = tile_arg(x, m, shift - P_LOG2, s_layout, MASKED, K_COLS)
        if PV_INT8:
            p8 = round_p_offset_int8(gl.exp2(arg))  # P - 128
        else:
            p8 = gl.exp2(arg).to(v_smem.dtype)
        p8 = gl.convert_layout(mma_operand_order(p8, BN), p_layout)  # no data movement
        pv = warpgroup_mma(p8, v_smem.index(st).permute((1, 0)), pv, use_acc=False, is_async=True)
        if V_RES:  # P times V's fp8 rounding residual, into the same tile sum
            if WAIT_PV_MMA:
                pv = warpgroup_mma_wait(0, deps=(pv,))
            pv = warpgroup_mma(p8, vres_smem.index(st).permute((1, 0)), pv, is_async=True)
        if PV_INT8 and WAIT_PV_MMA:
            pv = warpgroup_mma_wait(0, deps=(pv,))
        rs = warpgroup_mma(p8, ones_smem.permute((1, 0)), rs, use_acc=False, is_async=True)
        if FILL:
            _fill(k_desc, v_desc, k_smem, v_smem, vres_smem, kv_ready, kv_empty, i + STAGES - 1, n_local, k_row0,
                  v_row, key0, STAGES, V_RES)
        pv, rs = warpgroup_mma_wait(0, deps=(pv, rs))
        mbarrier.arrive(kv_empty.index(st), count=1)
        if PV_INT8:  # (P - 128)·V plus 128·V's column sums over this tile (``quant.convert_v_kernel``)
            tile_bias = gl.load(tb_base + i * D_PAD + gl.arange(0, D_PAD, layout=gl.SliceLayout(0, acc.type.layout)))
            pv_f = (pv + tile_bias[None, :]).to(gl.float32)
            rs_f = (rs + P_OFFSET * BN).to(gl.float32)
        else:
            pv_f = pv
            rs_f = rs
        acc = acc * gl.convert_layout(alpha, row_o)[:, None] + pv_f
        l_acc = l_acc * gl.convert_layout(alpha, row_l)[:, None] + rs_f
        return s, pv, rs, acc, m_new, shift, l_acc

    @gluon.jit
    def _warpgroup(args, descs, C: gl.constexpr, P_LOG2: gl.constexpr, STAGES: gl.constexpr,
                   HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr, V_RES: gl.constexpr, SPLIT: gl.constexpr,
                   LSE: gl.constexpr, K_COLS: gl.constexpr):
        """Rows C·64.. of this CTA's 192 query rows, over its key range (every key, or one share with
        SPLIT). Warpgroup 0 also loads Q and keeps the K/V ring STAGES - 1 tiles ahead of itself."""
        (q_smem, k_smem, v_smem, vres_smem, ones_smem, q_bar, kv_ready, kv_empty, QS, KS, VScale, VMean, TileBias,
         Out, stride_ob, stride_oh, stride_om, H, H_KV, LQ, LK, D, n_whole, splits, Flags, ML, ticket_smem, Lse,
         QBias) = args
        q_desc, k_desc, v_desc = descs
        NCONS: gl.constexpr = q_smem.type.shape[0]
        ROWS: gl.constexpr = q_smem.type.shape[1]
        D_PAD: gl.constexpr = q_smem.type.shape[2]
        BN: gl.constexpr = k_smem.type.shape[1]
        ONES_N: gl.constexpr = ones_smem.type.shape[0]
        # int8 and fp8 warpgroup MMAs have K = 32; one warpgroup's 4 warps stack along M.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BN, 32])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D_PAD, 32])
        l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, ONES_N, 32])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

        # CTAs of the whole kernel take every key. Those of the split kernel take a 1/splits share of the
        # keys of tail CTA n_whole + pid // splits and merge their rows into Out in turn (tail_split).
        pid = gl.program_id(0)
        n_tiles = gl.cdiv(LK, BN)
        if SPLIT:
            one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            pid = gl.max(ticket_smem.load(one), axis=0)
            cta = n_whole + pid // splits
            t0 = (pid % splits) * n_tiles // splits
            t1 = (pid % splits + 1) * n_tiles // splits
        else:
            cta = pid
            t0 = 0
            t1 = n_tiles
        n_m = gl.cdiv(LQ, NCONS * ROWS)
        pid_m = cta % n_m
        bh = cta // n_m
        b = bh // H
        h = bh % H
        bhk = b * H_KV + h // (H // H_KV)  # GQA: consecutive query heads share one KV head
        cta_row0 = pid_m * (NCONS * ROWS)
        row0 = cta_row0 + C * ROWS
        n_local = t1 - t0
        k_row0 = bhk * LK + t0 * BN
        v_row = bhk * (1 + V_RES) * D_PAD  # Vᵀ's rows of this head (then its residual's, with V_RES)
        if C == 0:
            mbarrier.expect(q_bar, NCONS * q_desc.block_type.nbytes)
            for i in gl.static_range(NCONS):
                tma_load(q_desc, [bh * LQ + cta_row0 + i * ROWS, 0], q_bar, q_smem.index(i))
            for i in gl.static_range(STAGES - 1):
                _fill(k_desc, v_desc, k_smem, v_smem, vres_smem, kv_ready, kv_empty, i, n_local, k_row0, v_row,
                      t0 * BN, STAGES, V_RES)

        offs_m = row0 + gl.arange(0, ROWS, layout=row_s)
        # Q scales already hold sm_scale·log2(e): logits come out in base-2 units.
        # Rows past LQ (never stored) take 1 with K_COLS: the masked tile's -inf logits times 0 would be NaN.
        qs = gl.load(QS + bh.to(gl.int64) * LQ + offs_m, mask=offs_m < LQ, other=1.0 if K_COLS else 0.0)
        if K_COLS:  # a scale per key (B·H_KV, LK)
            ks_base = KS + bhk.to(gl.int64) * LK + t0 * BN
        else:  # a scale per tile (B·H_KV, n_tiles)
            ks_base = KS + bhk.to(gl.int64) * n_tiles + t0
        tb_base = TileBias + (bhk.to(gl.int64) * n_tiles + t0) * D_PAD
        q = q_smem.index(C)
        # 8-bit MMAs sum into int32 (INT8 P·V) or fp32 (FP8).
        mma_sum: gl.constexpr = gl.int32 if v_smem.dtype == gl.int8 else gl.float32
        s = gl.zeros([ROWS, BN], gl.int32, s_layout)
        pv = gl.zeros([ROWS, D_PAD], mma_sum, o_layout)
        acc = gl.zeros([ROWS, D_PAD], gl.float32, o_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
        sh_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)  # INT8 P·V: the units of acc and l_acc
        rs = gl.zeros([ROWS, ONES_N], mma_sum, l_layout)
        l_acc = gl.zeros([ROWS, ONES_N], gl.float32, l_layout)
        mbarrier.wait(q_bar, 0)
        n_full = gl.minimum(t1, LK // BN) - t0  # whole tiles; a partial last one follows if t1 reaches it
        for i in range(n_full):
            s, pv, rs, acc, m_i, sh_i, l_acc = _tile(q, k_smem, v_smem, vres_smem, ones_smem, kv_ready, kv_empty, s,
                                                     pv, rs, acc, m_i, sh_i, l_acc, qs, ks_base, tb_base, i,
                                                     t0 * BN, LK, k_desc, v_desc, n_local, k_row0, v_row, P_LOG2,
                                                     STAGES, False, p_layout, V_RES, C == 0, K_COLS)
        if n_full < n_local:
            s, pv, rs, acc, m_i, sh_i, l_acc = _tile(q, k_smem, v_smem, vres_smem, ones_smem, kv_ready, kv_empty, s,
                                                     pv, rs, acc, m_i, sh_i, l_acc, qs, ks_base, tb_base, n_full,
                                                     t0 * BN, LK, k_desc, v_desc, n_local, k_row0, v_row, P_LOG2,
                                                     STAGES, True, p_layout, V_RES, C == 0, K_COLS)

        l_i = gl.convert_layout(gl.max(l_acc, axis=1), row_o)  # every column holds the row sum
        if v_smem.dtype == gl.int8:  # INT8 P's shift margin holds below HOT_LOGIT_LIMIT: NaN beyond, for the guard
            l_i = gl.where(gl.convert_layout((gl.abs(m_i) >= HOT_LOGIT_LIMIT) & (m_i > float("-inf")), row_o),
                           float("nan"), l_i)
        elif K_COLS == KEY:  # logits rounded once before the exp2's FMA: 2^-6 of P at 2^18, NaN beyond
            l_i = gl.where(gl.convert_layout((gl.abs(m_i) >= HOT_LOGIT_LIMIT_FP8) & (m_i > float("-inf")), row_o),
                           float("nan"), l_i)
        if not SPLIT and LSE == LSE_STORE_QBIAS:
            # Q's bias loaded before the output's epilogue, added after it: loaded at the end, its latency held
            # every warpgroup's exit (bench/NOTES.md, issue 52).
            qbias = qbias_rows(QBias, bh, row0, LQ, ROWS)
        else:
            qbias = None
        out = finish_rows(acc, l_i, VScale, VMean, bhk, gl.arange(0, D_PAD, layout=col_o), D, HAS_VSCALE,
                          HAS_VMEAN).to(Out.dtype.element_ty)
        if SPLIT or not V_RES:
            # Stored from a layout where each thread holds 8 consecutive channels: 16-byte stores of
            # whole rows, not the MMA layout's 4-byte pieces over 8 rows per instruction, whose issue
            # took ~5 µs of every CTA, and 8 addresses per thread instead of
            # 32 (a share's merge holds two tiles of rows: in the MMA layout it spilled). The layout change
            # goes through shared memory, which fp8+residual's 4-slot ring leaves no room for: its split
            # kernel runs a 3-slot ring (``SPLIT_RESIDUAL_STAGES``).
            out = gl.convert_layout(out, gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))
        o_ptrs, o_mask = out_rows(out, Out, stride_ob, stride_oh, stride_om, b, h, row0, LQ, D)
        if SPLIT:  # share p of this CTA: merged into what shares 0..p-1 left in Out, in turn (tail_split)
            rows: gl.constexpr = gl.SliceLayout(1, out.type.layout)
            if v_smem.dtype == gl.int8:  # the row sums are in units of the last shift, not of the max
                m_i = sh_i
            _merge_share(out, gl.convert_layout(m_i, rows), gl.convert_layout(l_i, rows), o_ptrs, o_mask, Flags, ML,
                         (pid // splits) * NCONS + C, pid % splits, splits, (Lse, QBias, bh, row0, LQ), P_LOG2, LSE)
        else:
            gl.store(o_ptrs, out, mask=o_mask)
            if LSE != LSE_NONE:  # the row sums are in units of 2^(max - P_LOG2), INT8's of its last shift
                unit = sh_i if v_smem.dtype == gl.int8 else m_i
                store_lse(Lse, QBias, gl.convert_layout(unit, row_o), l_i, bh, row0, LQ, P_LOG2,
                           LSE == LSE_STORE_QBIAS, qbias)

    @gluon.jit
    def _merge_share(out, m_i, l_i, o_ptrs, o_mask, Flags, ML, slot, p, splits, lse_args, P_LOG2: gl.constexpr,
                     LSE: gl.constexpr):
        """This share's finished rows (``out``, with their row max and row sum) merged into what shares
        0..p-1 of the CTA left at ``o_ptrs``, then handed on: the rows, then (row max, row sum) in
        ``ML`` (two buffers, by the parity of the writer), then ``Flags[slot] = p + 1``, released at
        GPU scope once every thread of the warpgroup has stored and fenced. Rows travel in the output's
        dtype: a 16-bit rounding per share, far below the fp8 P·V error. With ``LSE`` the last share, which
        holds the whole rows' max and sum, stores their LSE (``store_lse`` of ``lse_args``)."""
        ROWS: gl.constexpr = out.type.shape[0]
        r = gl.arange(0, ROWS, layout=m_i.type.layout).to(gl.int64)
        flag = Flags + slot
        ml_in = ML + ((slot * 2 + (p + 1) % 2) * ROWS + r) * 2  # what share p - 1 wrote
        ml_out = ML + ((slot * 2 + p % 2) * ROWS + r) * 2
        if p > 0:
            seen = gl.atomic_add(flag, 0, sem="acquire", scope="gpu")
            while seen < p:
                seen = gl.atomic_add(flag, 0, sem="acquire", scope="gpu")
            # .cg: from L2, where the predecessor's stores are, not from a stale L1 line.
            o_prev = gl.load(o_ptrs, mask=o_mask, other=0.0, cache_modifier=".cg").to(gl.float32)
            m_prev = gl.load(ml_in, cache_modifier=".cg")
            l_prev = gl.load(ml_in + 1, cache_modifier=".cg")
            merged, m_i, l_i = merge_rows(o_prev, m_prev, l_prev, out.to(gl.float32), m_i, l_i)
            out = merged.to(out.dtype)
        gl.store(o_ptrs, out, mask=o_mask)
        if LSE != LSE_NONE:
            if p + 1 == splits:
                Lse, QBias, bh, row0, LQ = lse_args
                store_lse(Lse, QBias, m_i, l_i, bh, row0, LQ, P_LOG2, LSE == LSE_STORE_QBIAS)
        if p + 1 < splits:
            gl.store(ml_out, m_i)
            gl.store(ml_out + 1, l_i)
            gl.inline_asm_elementwise("fence.acq_rel.gpu; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            partition_barrier()
            gl.atomic_xchg(flag, p + 1, sem="release", scope="gpu")

    # Partitions differ only in C. Constexprs travel as annotated parameters: inside the args tuple
    # they would reach the partitions as runtime values.
    @gluon.jit
    def _warpgroup0(args, descs, P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr,
                    HAS_VMEAN: gl.constexpr, V_RES: gl.constexpr, SPLIT: gl.constexpr, LSE: gl.constexpr,
                    K_COLS: gl.constexpr):
        _warpgroup(args, descs, 0, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, V_RES, SPLIT, LSE, K_COLS)

    @gluon.jit
    def _warpgroup1(args, descs, P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr,
                    HAS_VMEAN: gl.constexpr, V_RES: gl.constexpr, SPLIT: gl.constexpr, LSE: gl.constexpr,
                    K_COLS: gl.constexpr):
        _warpgroup(args, descs, 1, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, V_RES, SPLIT, LSE, K_COLS)

    @gluon.jit
    def _warpgroup2(args, descs, P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr,
                    HAS_VMEAN: gl.constexpr, V_RES: gl.constexpr, SPLIT: gl.constexpr, LSE: gl.constexpr,
                    K_COLS: gl.constexpr):
        _warpgroup(args, descs, 2, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, V_RES, SPLIT, LSE, K_COLS)

    @gluon.jit
    def _attention(q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out, stride_ob, stride_oh, stride_om,
                   H, H_KV, LQ, LK, D, n_whole, splits, Flags, ML, Lse, QBias, P_LOG2: gl.constexpr,
                   STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr, REGISTERS: gl.constexpr,
                   V_RES: gl.constexpr, SPLIT: gl.constexpr, LSE: gl.constexpr, K_COLS: gl.constexpr):
        NCONS: gl.constexpr = 3  # = CONSUMERS: one warp_specialize partition per warpgroup below
        ONES_N: gl.constexpr = 8  # columns of the row-sum MMA: the smallest N of a warpgroup MMA
        ROWS: gl.constexpr = q_desc.block_type.shape[0]
        D_PAD: gl.constexpr = q_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NCONS, ROWS, D_PAD], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D_PAD], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, D_PAD, BN], v_desc.layout)
        if V_RES:
            vres_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, D_PAD, BN], v_desc.layout)
        else:
            vres_smem = v_smem  # never read
        # B operand of the row-sum MMA: ONES_N columns of ones, K-major like Vᵀ.
        ones_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ONES_N, BN], v_desc.dtype)
        # 1.0 is byte 0x38 in e4m3 (this kernel only runs on NVIDIA's e4m3fn), 1 in int8. Triton 3.6 has
        # no fp8 constants, and an fp16 constant tile converted to fp8 stored wrong bytes there (H200), so
        # the bits are written directly.
        one_bits: gl.constexpr = 1 if v_desc.dtype == gl.int8 else 0x38
        ones = gl.full([ONES_N, BN], one_bits, gl.int8, gl.BlockedLayout([1, 16], [1, 32], [4, 1], [1, 0]))
        ones_smem = gl.allocate_shared_memory(v_desc.dtype, [ONES_N, BN], ones_layout,
                                              ones.to(v_desc.dtype, bitcast=True))
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=NCONS)  # every warpgroup releases each tile
        fence_async_shared()
        if SPLIT:
            # Which share this CTA is comes from a ticket taken as it starts, not from its program id: a
            # share waits for the one before it, and with tickets that one has always started already,
            # in whatever order the hardware dispatches CTAs (a single-pass scan's dynamic tile ids).
            # It reaches the warpgroups through shared memory: an argument only the split kernel had
            # changed the whole kernel's code (Triton 3.6: 3.5-7 % slower at every length).
            one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            ticket_smem = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            ticket_smem.store(gl.full([1], gl.atomic_add(Flags, 1, sem="relaxed", scope="gpu"), gl.int32, one))
            Flags = Flags + 1  # then one hand-over flag per warpgroup of each tail CTA
        else:
            ticket_smem = q_bar  # never read: the whole kernel's CTAs are their program ids
        args = (q_smem, k_smem, v_smem, vres_smem, ones_smem, q_bar, kv_ready, kv_empty, QS, KS, VScale, VMean,
                TileBias, Out, stride_ob, stride_oh, stride_om, H, H_KV, LQ, LK, D, n_whole, splits, Flags, ML,
                ticket_smem, Lse, QBias)
        descs = (q_desc, k_desc, v_desc)
        if not SPLIT:
            # Programmatic dependent launch. This kernel may be launched while the V conversion ends
            # (``pdl``): it waits for that launch's output before anything reads it (a no-op when not
            # launched so). Once every whole CTA has got past that wait, the split kernel (launched
            # with launch_pdl) may take each SM as its whole CTA ends, instead of waiting for the
            # last one; it needs nothing this kernel writes, so it never waits on it.
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        gl.warp_specialize([
            (_warpgroup0, (args, descs, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, V_RES, SPLIT, LSE, K_COLS)),
            (_warpgroup1, (args, descs, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, V_RES, SPLIT, LSE, K_COLS)),
            (_warpgroup2, (args, descs, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, V_RES, SPLIT, LSE, K_COLS)),
        ], [4, 4], [REGISTERS, REGISTERS])

    @gluon.jit
    def shared_kv_attention_kernel(
        q_desc, k_desc, v_desc,  # int8 Q (B*H*LQ, D_PAD), int8 K (B*H_KV*LK, D_PAD), fp8/int8 Vᵀ (B*H_KV*D_PAD, L_PAD)
        QS, KS, VScale, VMean, TileBias, Out,  # Out (B, H, LQ, D) by its first three strides, channels contiguous
        stride_ob, stride_oh, stride_om,
        H, H_KV, LQ, LK, D,
        P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr,
        REGISTERS: gl.constexpr, V_RES: gl.constexpr, K_COLS: gl.constexpr,
    ):
        """CTA i: query rows 192·(i mod ceil(LQ/192)) of head i div ceil(LQ/192), every key."""
        _attention(q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out, stride_ob, stride_oh, stride_om,
                   H, H_KV, LQ, LK, D, 0, 1, QS, QS, QS, QS, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, REGISTERS, V_RES,
                   False, LSE_NONE, K_COLS)

    @gluon.jit
    def shared_kv_split_kernel(
        q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out,
        stride_ob, stride_oh, stride_om,
        H, H_KV, LQ, LK, D,
        n_whole, splits, Flags, ML,
        P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr,
        REGISTERS: gl.constexpr, V_RES: gl.constexpr, K_COLS: gl.constexpr,
    ):
        """The CTAs from ``n_whole`` on, each cut into ``splits`` key shares (``tail_split``): program i is
        share i mod splits of CTA n_whole + i div splits, i the ticket it takes as it starts; the shares of
        a CTA merge into its Out rows in turn (``Flags``: int32, zeroed: the ticket counter, then a flag
        per warpgroup of each tail CTA; ``ML``: fp32 row max and sum)."""
        _attention(q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out, stride_ob, stride_oh, stride_om,
                   H, H_KV, LQ, LK, D, n_whole, splits, Flags, ML, QS, QS, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN,
                   REGISTERS, V_RES, True, LSE_NONE, K_COLS)

    def descriptors(q8, k8, v_t):
        """TMA descriptors over the quantized tensors as 2-D views: q8, k8 int8 (B*H, L, D_PAD), v_t
        fp8 (B*H_KV, D_PAD, L_PAD) in operand order (2·D_PAD rows with V's residual). Reads past a
        head's rows land in the next head (masked in the kernel) or past the tensor (zero-filled by
        the TMA unit)."""
        d_pad = q8.shape[-1]
        v_dtype = {"torch.int8": gl.int8, "torch.float8_e4m3fn": gl.float8e4nv}.get(str(v_t.dtype), gl.float8e4b8)

        def make(t, block, dtype):
            return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block,
                                    gl.NVMMASharedLayout.get_default_for(block, dtype))

        return (make(q8.view(-1, d_pad), [ROWS, d_pad], gl.int8), make(k8.view(-1, d_pad), [BLOCK_N, d_pad], gl.int8),
                make(v_t.view(-1, v_t.shape[-1]), [d_pad, BLOCK_N], v_dtype))
