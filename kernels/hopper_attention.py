"""Hopper (sm90) attention kernel, written in Gluon: INT8 Q·Kᵀ and FP8 P·V on warpgroup MMAs.

Why a second kernel: in the portable Triton kernel each warpgroup runs Q·Kᵀ, waits for it, runs
the softmax, runs P·V and waits again, so the tensor cores idle while the special-function units
compute exp2 (as many cycles per tile as both matmuls). Gluon exposes the asynchronous warpgroup
MMA directly, so here the Q·Kᵀ of tile j+1 is issued before the softmax of tile j and runs under
it (FlashAttention-3's intra-warpgroup overlap). K and V tiles stream through a ring of shared
memory buffers filled by TMA copies, and with 8 warps two warpgroups share each K/V tile.

Scope: the hot path only. No mask, not causal, per-tile K scales (``per_warp``/``per_block``), FP8
P·V, head_dim padded to 64 or 128. Everything else runs the portable kernel. Numerics match it:
the same quantized inputs, the same exp2 argument, P rounded to fp8 the same way, and a fresh
fp32 accumulator per tile added into the running output (two-level accumulation).

Gluon ships inside the triton package (3.5+); without it ``AVAILABLE`` is False and nothing here
is used.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    AVAILABLE = True
except ImportError:  # triton without Gluon: the portable kernel serves every call
    AVAILABLE = False

HEAD_DIMS = (64, 128)  # padded head dims this kernel is built for

if AVAILABLE:
    # Triton renamed the CTA-wide barrier (3.6: thread_barrier, 3.8: barrier).
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

    @gluon.jit
    def _int_to_float(s):
        """int32 → fp32 without the conversion unit (exact below 2^22; see attention.int_to_float)."""
        return (s + 0x4B400000).to(gl.float32, bitcast=True) - 12582912.0

    @gluon.jit
    def _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, tile, n_tiles, k_row0, v_row0,
                 STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
        """Start the TMA copies of K and Vᵀ tile ``tile`` into ring slot tile % STAGES (if it exists).
        One barrier per slot for both: fewer CTA-wide syncs around the expect."""
        st = tile % STAGES
        ok = tile < n_tiles
        bar = kv_bar.index(st)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=ok)
        tma.async_copy_global_to_shared(k_desc, [k_row0 + tile * BLOCK_N, 0], bar, k_smem.index(st), pred=ok)
        tma.async_copy_global_to_shared(v_desc, [v_row0, tile * BLOCK_N], bar, v_smem.index(st), pred=ok)

    @gluon.jit
    def _qk(q_smem, k_smem, kv_bar, tile, STAGES: gl.constexpr, s_zero):
        """Issue Q·Kᵀ for ``tile`` (asynchronous) once its K and Vᵀ have landed."""
        st = tile % STAGES
        mbarrier.wait(kv_bar.index(st), (tile // STAGES) & 1)
        return warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)

    @gluon.jit
    def _pv(p, v_smem, tile, STAGES: gl.constexpr, o_zero, p_layout: gl.constexpr):
        """Issue P·V for ``tile`` (asynchronous); its slot was waited for by ``_qk``."""
        p8 = gl.convert_layout(p.to(v_smem.dtype), p_layout)
        return warpgroup_mma(p8, v_smem.index(tile % STAGES).permute((1, 0)), o_zero, use_acc=False, is_async=True)

    @gluon.jit
    def _epilogue(acc, m_i, l_i, row0, b, h, bh, bhk, VScale, VMean, QBias, Out, Lse,
                  stride_ob, stride_oh, stride_om, stride_od, LQ, D, P_LOG2: gl.constexpr,
                  HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr, HAS_QBIAS: gl.constexpr,
                  RETURN_LSE: gl.constexpr):
        """Normalise and store rows row0.. of the output (and their LSE), as the portable kernel does:
        a NaN row sum stays NaN (SDPA semantics), a row with no live key gets 0."""
        o_layout: gl.constexpr = acc.type.layout
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
        BLOCK_M: gl.constexpr = acc.type.shape[0]
        D_PAD: gl.constexpr = acc.type.shape[1]
        live = l_i > 0
        out = acc / gl.convert_layout(gl.where(live, l_i, 1.0), row_o)[:, None]
        offs_d = gl.arange(0, D_PAD, layout=col_o)
        d_ok = offs_d < D
        if HAS_VSCALE:
            out = out * gl.load(VScale + bhk * D + offs_d, mask=d_ok, other=0.0)[None, :]
        if HAS_VMEAN:
            live_o = gl.convert_layout(live, row_o)
            out = out + gl.where(live_o[:, None], gl.load(VMean + bhk * D + offs_d, mask=d_ok, other=0.0)[None, :],
                                 0.0)
        offs_mo = row0 + gl.arange(0, BLOCK_M, layout=row_o)
        o_ptrs = (Out + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
                  + offs_mo[:, None].to(gl.int64) * stride_om + offs_d[None, :] * stride_od)
        gl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_mo < LQ)[:, None] & d_ok[None, :])
        if RETURN_LSE:
            # A plain 1-D layout for the store: triton 3.6 cannot lower a store in a sliced MMA layout
            # inside a warp-specialized partition.
            flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
            offs_m = row0 + gl.arange(0, BLOCK_M, layout=flat)
            lse = gl.where(live, (m_i + gl.log2(gl.where(live, l_i, 1.0)) - P_LOG2) * 0.6931471805599453,
                           float("-inf"))
            lse = gl.convert_layout(lse, flat)
            if HAS_QBIAS:
                lse += gl.load(QBias + bh.to(gl.int64) * LQ + offs_m, mask=offs_m < LQ, other=0.0)
            gl.store(Lse + bh.to(gl.int64) * LQ + offs_m, lse, mask=offs_m < LQ)

    @gluon.jit
    def hopper_attention_kernel(
        q_desc, k_desc, v_desc,  # int8 Q (B*H*LQ, D_PAD), int8 K (B*H_KV*LK, D_PAD), fp8 Vᵀ (B*H_KV*D_PAD, LK)
        QS, KS, VScale, VMean, QBias, Out, Lse,
        stride_ob, stride_oh, stride_om, stride_od,
        H, H_KV, LQ, LK, D,
        P_LOG2: gl.constexpr, STAGES: gl.constexpr,
        HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr, HAS_QBIAS: gl.constexpr, RETURN_LSE: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
        D_PAD: gl.constexpr = q_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]

        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        bhk = b * H_KV + h // (H // H_KV)  # GQA: consecutive query heads share one KV head

        # Warps stacked along M: each warpgroup owns 64 query rows. int8 and fp8 MMAs have K = 32.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 32])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, D_PAD, 32])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, D_PAD], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D_PAD], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, D_PAD, BLOCK_N], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_bar.index(i), count=1)
        fence_async_shared()

        n_tiles = gl.cdiv(LK, BLOCK_N)
        k_row0 = bhk * LK
        v_row0 = bhk * D_PAD
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bh * LQ + pid_m * BLOCK_M, 0], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, i, n_tiles, k_row0, v_row0, STAGES, BLOCK_N)

        offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)
        # Q scales already hold sm_scale·log2(e): logits come out in base-2 units.
        qs = gl.load(QS + bh.to(gl.int64) * LQ + offs_m, mask=offs_m < LQ, other=0.0)
        ks_base = KS + bhk.to(gl.int64) * n_tiles

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        acc = gl.zeros([BLOCK_M, D_PAD], gl.float32, o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_layout)
        o_zero = gl.zeros([BLOCK_M, D_PAD], gl.float32, o_layout)

        mbarrier.wait(q_bar, 0)
        s = warpgroup_mma_wait(0, deps=(_qk(q_smem, k_smem, kv_bar, 0, STAGES, s_zero),))

        # Full tiles: every tile but the last has all BLOCK_N keys in range.
        for j in range(0, n_tiles - 1):
            s_tok = _qk(q_smem, k_smem, kv_bar, j + 1, STAGES, s_zero)
            # Softmax of tile j runs while the tensor cores compute tile j+1. Scales are positive,
            # so the row max is taken on the integers; the rescale and P's fp8 range factor fold
            # into one FMA per logit.
            row_scale = qs * gl.load(ks_base + j)
            m_new = gl.maximum(m_i, gl.max(s, axis=1).to(gl.float32) * row_scale)
            p = gl.exp2(_int_to_float(s) * row_scale[:, None] - (m_new - P_LOG2)[:, None])
            alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            pv_tok = _pv(p, v_smem, j, STAGES, o_zero, p_layout)
            s, pv = warpgroup_mma_wait(0, deps=(s_tok, pv_tok))
            acc = acc * gl.convert_layout(alpha, row_o)[:, None] + pv
            # Every warpgroup is done with ring slot j: refill it with tile j + STAGES.
            _cta_barrier()
            _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, j + STAGES, n_tiles, k_row0, v_row0,
                     STAGES, BLOCK_N)

        # Last tile: keys past LK (zero-filled, or the next head's rows) are masked out.
        last = n_tiles - 1
        row_scale = qs * gl.load(ks_base + last)
        offs_n = last * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_s)
        x = gl.where((offs_n < LK)[None, :], _int_to_float(s) * row_scale[:, None], float("-inf"))
        m_new = gl.maximum(m_i, gl.max(x, axis=1))
        p = gl.exp2(x - (m_new - P_LOG2)[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        pv_tok = _pv(p, v_smem, last, STAGES, o_zero, p_layout)
        pv = warpgroup_mma_wait(0, deps=(pv_tok,))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None] + pv

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(kv_bar.index(i))

        _epilogue(acc, m_i, l_i, pid_m * BLOCK_M, b, h, bh, bhk, VScale, VMean, QBias, Out, Lse,
                  stride_ob, stride_oh, stride_om, stride_od, LQ, D, P_LOG2, HAS_VSCALE, HAS_VMEAN, HAS_QBIAS,
                  RETURN_LSE)

    # ------------------------------------------------------------------------------------------
    # Ping-pong variant (FlashAttention-3's schedule): a 128-row Q tile, two consumer warpgroups of
    # 64 rows each and a one-warp TMA producer. A consumer's turn on the tensor cores issues its
    # Q·Kᵀ of tile j and P·V of tile j-1 back to back, then hands the turn to the other consumer and
    # runs its softmax while the other one's matmuls execute. The exp2 work of one warpgroup thus
    # hides under the matmuls of the other instead of both warpgroups contending for each in turn.

    @gluon.jit
    def _softmax(s, m_i, l_i, row_scale, j, LK, P_LOG2: gl.constexpr, BLOCK_N: gl.constexpr, p_layout: gl.constexpr,
                 p_dtype: gl.constexpr):
        """One tile's online softmax in base 2; P comes back in fp8, laid out as the P·V A operand.
        Only the last tile can hold keys past LK; it alone pays for the mask."""
        if (j + 1) * BLOCK_N > LK:
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
            x = gl.where((offs_n < LK)[None, :], _int_to_float(s) * row_scale[:, None], float("-inf"))
            m_new = gl.maximum(m_i, gl.max(x, axis=1))
            p = gl.exp2(x - (m_new - P_LOG2)[:, None])
        else:
            m_new = gl.maximum(m_i, gl.max(s, axis=1).to(gl.float32) * row_scale)
            p = gl.exp2(_int_to_float(s) * row_scale[:, None] - (m_new - P_LOG2)[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return gl.convert_layout(p.to(p_dtype), p_layout), alpha, m_new, l_i

    @gluon.jit
    def _pingpong_consumer(args, C: gl.constexpr, P_LOG2: gl.constexpr, STAGES: gl.constexpr,
                           HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr, HAS_QBIAS: gl.constexpr,
                           RETURN_LSE: gl.constexpr):
        (q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, turn, QS, KS, VScale, VMean, QBias, Out, Lse,
         stride_ob, stride_oh, stride_om, stride_od, H, H_KV, LQ, LK, D) = args
        HALF: gl.constexpr = q_smem.type.shape[1]
        D_PAD: gl.constexpr = q_smem.type.shape[2]
        BLOCK_N: gl.constexpr = k_smem.type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 32])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D_PAD, 32])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        bhk = b * H_KV + h // (H // H_KV)
        row0 = pid_m * (2 * HALF) + C * HALF
        offs_m = row0 + gl.arange(0, HALF, layout=row_s)
        qs = gl.load(QS + bh.to(gl.int64) * LQ + offs_m, mask=offs_m < LQ, other=0.0)
        n_tiles = gl.cdiv(LK, BLOCK_N)
        ks_base = KS + bhk.to(gl.int64) * n_tiles
        q = q_smem.index(C)
        s_zero = gl.zeros([HALF, BLOCK_N], gl.int32, s_layout)
        o_zero = gl.zeros([HALF, D_PAD], gl.float32, o_layout)
        acc = gl.zeros([HALF, D_PAD], gl.float32, o_layout)
        m_i = gl.full([HALF], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([HALF], gl.float32, row_s)

        # Turn k of consumer 0 waits for parity (k & 1) ^ 1 (its first turn is free), consumer 1's for
        # parity k & 1 (its first turn comes when consumer 0 hands over).
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(turn.index(C), C ^ 1)
        mbarrier.wait(kv_ready.index(0), 0)
        s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.arrive(turn.index(1 - C), count=1)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qs * gl.load(ks_base), 0, LK, P_LOG2, BLOCK_N, p_layout,
                                      v_smem.dtype)
        for j in range(1, n_tiles):
            st = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(turn.index(C), (j & 1) ^ (C ^ 1))
            mbarrier.wait(kv_ready.index(st), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            pv_tok = warpgroup_mma(p, v_smem.index(prev).permute((1, 0)), o_zero, use_acc=False, is_async=True)
            mbarrier.arrive(turn.index(1 - C), count=1)
            s, pv = warpgroup_mma_wait(0, deps=(s_tok, pv_tok))
            mbarrier.arrive(kv_empty.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None] + pv
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qs * gl.load(ks_base + j), j, LK, P_LOG2, BLOCK_N, p_layout,
                                          v_smem.dtype)
        last = n_tiles - 1
        mbarrier.wait(turn.index(C), (n_tiles & 1) ^ (C ^ 1))
        pv_tok = warpgroup_mma(p, v_smem.index(last % STAGES).permute((1, 0)), o_zero, use_acc=False,
                               is_async=True)
        mbarrier.arrive(turn.index(1 - C), count=1)
        pv = warpgroup_mma_wait(0, deps=(pv_tok,))
        mbarrier.arrive(kv_empty.index(last % STAGES), count=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None] + pv
        _epilogue(acc, m_i, l_i, row0, b, h, bh, bhk, VScale, VMean, QBias, Out, Lse,
                  stride_ob, stride_oh, stride_om, stride_od, LQ, D, P_LOG2, HAS_VSCALE, HAS_VMEAN, HAS_QBIAS,
                  RETURN_LSE)

    # Constexprs travel as annotated parameters: inside a tuple they would reach the partitions as
    # runtime values. Worker partitions share one signature.
    @gluon.jit
    def _pingpong_consumer0(args, P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr,
                            HAS_VMEAN: gl.constexpr, HAS_QBIAS: gl.constexpr, RETURN_LSE: gl.constexpr):
        _pingpong_consumer(args, 0, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, HAS_QBIAS, RETURN_LSE)

    @gluon.jit
    def _pingpong_consumer1(args, descs, P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr,
                            HAS_VMEAN: gl.constexpr, HAS_QBIAS: gl.constexpr, RETURN_LSE: gl.constexpr):
        _pingpong_consumer(args, 1, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, HAS_QBIAS, RETURN_LSE)

    @gluon.jit
    def _pingpong_producer(args, descs, P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr,
                           HAS_VMEAN: gl.constexpr, HAS_QBIAS: gl.constexpr, RETURN_LSE: gl.constexpr):
        """One warp: Q once, then K and Vᵀ tiles into the ring as soon as both consumers free a slot."""
        (q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, turn, QS, KS, VScale, VMean, QBias, Out, Lse,
         stride_ob, stride_oh, stride_om, stride_od, H, H_KV, LQ, LK, D) = args
        q_desc, k_desc, v_desc = descs
        HALF: gl.constexpr = q_smem.type.shape[1]
        D_PAD: gl.constexpr = q_smem.type.shape[2]
        BLOCK_N: gl.constexpr = k_smem.type.shape[1]
        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        bhk = b * H_KV + (bh % H) // (H // H_KV)
        q_row = bh * LQ + pid_m * (2 * HALF)
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
        tma.async_copy_global_to_shared(q_desc, [q_row + HALF, 0], q_bar, q_smem.index(1))
        for j in range(gl.cdiv(LK, BLOCK_N)):
            st = j % STAGES
            bar = kv_ready.index(st)
            mbarrier.wait(kv_empty.index(st), ((j // STAGES) & 1) ^ 1)
            mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [bhk * LK + j * BLOCK_N, 0], bar, k_smem.index(st))
            tma.async_copy_global_to_shared(v_desc, [bhk * D_PAD, j * BLOCK_N], bar, v_smem.index(st))

    @gluon.jit
    def hopper_pingpong_kernel(
        q_desc, k_desc, v_desc,  # as hopper_attention_kernel; q_desc blocks are 64 rows (one consumer)
        QS, KS, VScale, VMean, QBias, Out, Lse,
        stride_ob, stride_oh, stride_om, stride_od,
        H, H_KV, LQ, LK, D,
        P_LOG2: gl.constexpr, STAGES: gl.constexpr,
        HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr, HAS_QBIAS: gl.constexpr, RETURN_LSE: gl.constexpr,
        CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    ):
        HALF: gl.constexpr = q_desc.block_type.shape[0]
        D_PAD: gl.constexpr = q_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, HALF, D_PAD], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, D_PAD], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, D_PAD, BLOCK_N], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kv_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)  # both consumers release a slot
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        fence_async_shared()

        args = (q_smem, k_smem, v_smem, q_bar, kv_ready, kv_empty, turn, QS, KS, VScale, VMean, QBias, Out, Lse,
                stride_ob, stride_oh, stride_om, stride_od, H, H_KV, LQ, LK, D)
        descs = (q_desc, k_desc, v_desc)
        gl.warp_specialize([
            (_pingpong_consumer0, (args, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, HAS_QBIAS, RETURN_LSE)),
            (_pingpong_consumer1, (args, descs, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, HAS_QBIAS, RETURN_LSE)),
            (_pingpong_producer, (args, descs, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, HAS_QBIAS, RETURN_LSE)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])

    # Register split of the ping-pong kernel: 3 warpgroups share 64K registers; the producer needs few.
    PINGPONG_MAXNREG, PINGPONG_CONSUMER_REGS, PINGPONG_PRODUCER_REGS = 168, 240, 24

    def descriptors(q8, k8, v_t, LK: int, block_m: int, block_n: int):
        """TMA descriptors over the quantized tensors, as 2-D views.

        q8: int8 (B*H, LQ, D_PAD); k8: int8 (B*H_KV, LK, D_PAD); v_t: fp8 (B*H_KV, D_PAD, L_PAD) with
        L_PAD ≥ LK. Vᵀ's logical width is LK, so its tail tile is zero-filled by the TMA unit rather
        than read from the (uninitialised) padding.
        """
        d_pad = q8.shape[-1]
        q2 = q8.view(-1, d_pad)
        k2 = k8.view(-1, d_pad)
        v2 = v_t.view(-1, v_t.shape[-1])
        fp8 = gl.float8e4nv if str(v_t.dtype).endswith("e4m3fn") else gl.float8e4b8

        def make(t, shape, block, dtype):
            layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
            return TensorDescriptor(t, shape, [t.stride(0), 1], block, layout)

        return (make(q2, list(q2.shape), [block_m, d_pad], gl.int8),
                make(k2, list(k2.shape), [block_n, d_pad], gl.int8),
                make(v2, [v2.shape[0], LK], [d_pad, block_n], fp8))
