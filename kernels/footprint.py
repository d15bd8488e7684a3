"""GPU memory of one attention call beyond its output, against the budget of the Hopper issue:
no more than SDPA's peak plus the quantized copies of Q, K and V.

Pure arithmetic on shapes, so the CPU tests (tests/test_memory.py, which count what a real call
allocates on meta tensors) and ``bench/bench_kernels.py`` (which measures the GPU's peak) use the
same numbers.
"""
from __future__ import annotations

import triton

FP32 = 4


def head_dim_padded(d: int) -> int:
    """The head dim the kernels store and load: int8 MMAs need a reduction dim of at least 32 and
    power-of-two tiles."""
    return max(32, triton.next_power_of_2(d))


def quantized_copy_bytes(batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, head_dim: int,
                         v_residual: bool = False) -> int:
    """The quantized copies a call needs: INT8 Q and K and FP8 V (twice V with fp8+residual: V's
    rounding error is a second fp8 copy), one byte per element at the padded head dim, and an fp32
    scale per Q and K token. The allowance the memory target grants beside SDPA's own peak."""
    d_pad = head_dim_padded(head_dim)
    q = batch * heads * q_len * (d_pad + FP32)
    k = batch * kv_heads * k_len * (d_pad + FP32)
    v = batch * kv_heads * k_len * d_pad * (2 if v_residual else 1)
    return q + k + v


def split_workspace_bytes(n_tail_ctas: int, cta_rows: int) -> int:
    """Hopper's split last wave (``tail_split``): a row max and row sum, twice, per row of each tail CTA
    (its shares hand them on in turn), 3 KB per CTA of 192 rows. Their flags are ``split_flags`` int32s."""
    return n_tail_ctas * cta_rows * 2 * 2 * FP32


def split_flags(n_tail_ctas: int, consumers: int) -> int:
    """int32s of the split last wave's hand-over: the ticket counter, then a flag per warpgroup of each tail CTA."""
    return 1 + n_tail_ctas * consumers


def max_split_workspace_bytes(n_sms: int, cta_rows: int, consumers: int) -> int:
    """The most the split last wave can take on a GPU with ``n_sms`` SMs: fewer tail CTAs than SMs, each
    with its rows' (max, sum) pairs and a flag per warpgroup, and one ticket counter (400 KB on an H200)."""
    return split_workspace_bytes(n_sms - 1, cta_rows) + split_flags(n_sms - 1, consumers) * FP32
