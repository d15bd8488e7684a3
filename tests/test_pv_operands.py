"""``kernels/pv_operands.py``'s INT8 P rounding through the interpreter: ``round_p_offset_int8_sums`` gives the
bytes ``round_p_offset_int8`` gives (P rounded to nearest, ties to even, less 128) and the exact row sums of the
rounded P, which it takes from the biased floats' bits with wrapping int32 adds."""
import pytest
import torch
import triton
import triton.language as tl
from sagetriton.kernels.pv_operands import round_p_offset_int8, round_p_offset_int8_sums


@triton.jit
def _round_rows(P, Bytes, Plain, Sums, M: tl.constexpr, N: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    p = tl.load(P + offs)
    p8, sums = round_p_offset_int8_sums(p)
    tl.store(Bytes + offs, p8)
    tl.store(Plain + offs, round_p_offset_int8(p))
    tl.store(Sums + tl.arange(0, M), sums)


@pytest.mark.parametrize("n", [64, 128])
def test_int8_p_row_sums_from_the_bits_are_the_rounded_sums(n):
    g = torch.Generator().manual_seed(n)
    p = torch.rand(8, n, generator=g) * 255.49
    p[0] = 255.0  # every weight at the top: the largest sum
    p[1] = 0.0
    p[2, : n // 2] = torch.arange(n // 2) + 0.5  # ties go to even, as torch.round
    p[3] = torch.rand(n, generator=g) * 1e-3  # all round to 0
    bytes_, plain = torch.empty(8, n, dtype=torch.int8), torch.empty(8, n, dtype=torch.int8)
    sums = torch.empty(8, dtype=torch.int32)
    _round_rows[(1,)](p, bytes_, plain, sums, M=8, N=n)
    rounded = torch.round(p.double())
    assert torch.equal(bytes_, (rounded - 128).to(torch.int8)) and torch.equal(bytes_, plain)
    assert torch.equal(sums.long(), rounded.sum(1).long()), (sums, rounded.sum(1))
    assert int(sums[0]) == 255 * n and int(sums[1]) == 0 and int(sums[3]) == 0
