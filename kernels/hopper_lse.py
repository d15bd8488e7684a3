"""Hopper's long-sequence kernels (``hopper_gluon``) that also return the LSE, for ring attention.

Every step of sequence-parallel ring attention (yunchang, xDiT, diffusers) asks for the natural-log
log-sum-exp of each query row, to merge the partial outputs of the key shards. These are
``hopper_gluon``'s two kernels with that output: each warpgroup stores its 64 rows' LSE after its
output rows (a split CTA's last key share, once its rows are merged). Kernels of their own, so the
plain ones keep their arguments and code as measured; ``api`` picks them when ``return_lse``.
"""
from __future__ import annotations

from .hopper_gluon import AVAILABLE

if AVAILABLE:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from .hopper_gluon import LSE_STORE, LSE_STORE_QBIAS, _attention

    @gluon.jit
    def shared_kv_attention_lse_kernel(
        q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out,
        stride_ob, stride_oh, stride_om,
        H, H_KV, LQ, LK, D,
        Lse, QBias,  # fp32 (B*H, LQ): the LSE written, Q's K-mean bias added to it (with HAS_QBIAS)
        P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr,
        REGISTERS: gl.constexpr, V_RES: gl.constexpr, HAS_QBIAS: gl.constexpr, K_COLS: gl.constexpr,
    ):
        """``shared_kv_attention_kernel`` that also stores each row's LSE (its own kernel: arguments only
        it needs stay out of the plain kernel's code)."""
        _attention(q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out, stride_ob, stride_oh, stride_om,
                   H, H_KV, LQ, LK, D, 0, 1, QS, QS, Lse, QBias, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN, REGISTERS,
                   V_RES, False, LSE_STORE_QBIAS if HAS_QBIAS else LSE_STORE, K_COLS)

    @gluon.jit
    def shared_kv_split_lse_kernel(
        q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out,
        stride_ob, stride_oh, stride_om,
        H, H_KV, LQ, LK, D,
        n_whole, splits, Flags, ML, Lse, QBias,
        P_LOG2: gl.constexpr, STAGES: gl.constexpr, HAS_VSCALE: gl.constexpr, HAS_VMEAN: gl.constexpr,
        REGISTERS: gl.constexpr, V_RES: gl.constexpr, HAS_QBIAS: gl.constexpr, K_COLS: gl.constexpr,
    ):
        """``shared_kv_split_kernel`` that also stores each row's LSE, from the last share of its CTA."""
        _attention(q_desc, k_desc, v_desc, QS, KS, VScale, VMean, TileBias, Out, stride_ob, stride_oh, stride_om,
                   H, H_KV, LQ, LK, D, n_whole, splits, Flags, ML, Lse, QBias, P_LOG2, STAGES, HAS_VSCALE, HAS_VMEAN,
                   REGISTERS, V_RES, True, LSE_STORE_QBIAS if HAS_QBIAS else LSE_STORE, K_COLS)
