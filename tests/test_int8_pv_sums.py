"""INT8 P·V's int32 tile sums reach fp32 through their bits (``quant.small_int_to_f32``), not I2F: exactly,
over the whole range those sums can take, and through I2F again for tiles too wide for that range."""
import pytest
import torch
import triton
import triton.language as tl
from sagetriton.kernels import quant


@triton.jit
def _convert(X, Out, N: tl.constexpr, KEYS: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Out + offs, quant.int8_pv_to_f32(tl.load(X + offs), KEYS))


def _run(x: torch.Tensor, keys: int) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.float32)
    _convert[(1,)](x, out, N=x.numel(), KEYS=keys)
    return out


def test_every_sum_a_128_key_tile_can_hold_converts_exactly():
    most = 255 * 127 * 128  # P 0..255 times V ±127 over 128 keys
    assert most < quant.INT_TO_F32_EXACT_LIMIT
    edges = torch.tensor([0, 1, -1, 2, -2, most, -most, most - 1, -most + 1, 2**22 - 1, -(2**22)], dtype=torch.int32)
    g = torch.Generator().manual_seed(3)
    rand = torch.randint(-most, most + 1, (4096 - edges.numel(),), generator=g, dtype=torch.int32)
    x = torch.cat([edges, rand])
    assert torch.equal(_run(x, 128), x.to(torch.float64).to(torch.float32))


def test_the_bits_trick_is_wrong_past_its_range_so_wider_tiles_keep_i2f():
    x = torch.tensor([2**22 + 5, -(2**22) - 7, 255 * 127 * 256, -255 * 127 * 256] + [0] * 4, dtype=torch.int32)
    assert not torch.equal(_run(x, 128), x.float())  # what 256-key tiles would get from the trick
    assert torch.equal(_run(x, 256), x.float())


@pytest.mark.parametrize("keys", [16, 32, 64, 128])
def test_tiles_up_to_128_keys_take_the_bits_path(keys):
    # A sum the trick cannot hold comes out wrong on that path: proof the path is the one taken.
    x = torch.tensor([2**23 + 1] + [0] * 7, dtype=torch.int32)
    assert float(_run(x, keys)[0]) != float(2**23 + 1)
