"""The Q/K rotation's matrix, shared by the kernels' host side (``api``) and the references."""
from __future__ import annotations

import math

import torch

ROTATION_BLOCK = 128  # channels one Hadamard block mixes (head dims above 128 get two blocks)
# The rotation only on heads whose keys have outlier channels or tokens (``quant.rotate_head``); False
# rotates every head (the code before issue 42, for A/B runs: clear ``replay`` after changing it).
DETECT = False
# K's range for that choice from the K mean's sample of keys instead of every key (A/B runs: cheaper
# statistics pass, but an outlier key outside the sample goes unseen).
RANGE_SAMPLED = False


def hadamard_block(d_pad: int, block: int, dtype=torch.float64) -> torch.Tensor:
    """The kernels' rotation: block-diagonal Sylvester Hadamard, ``block`` (a power of two) per block, entries
    ±1/sqrt(block) (entry (i, j): the parity of the bits i and j share). Orthogonal, so Q·Kᵀ is unchanged when
    both are multiplied by it, while one large channel is spread over the block before INT8 rounding."""
    i = torch.arange(d_pad)
    shared = (i[:, None] & i[None, :] & (block - 1))
    parity = torch.zeros_like(shared)
    for bit in range(max(block.bit_length() - 1, 0)):
        parity ^= (shared >> bit) & 1
    same_block = (i[:, None] // block) == (i[None, :] // block)
    return torch.where(same_block, (1.0 - 2.0 * parity.to(dtype)) / math.sqrt(block), 0.0).to(dtype)
