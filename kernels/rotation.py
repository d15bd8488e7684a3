"""The Q/K rotation's matrix and launch settings, shared by the kernels' host side (``api``) and the references."""
from __future__ import annotations

import math

import torch

ROTATION_BLOCK = 128  # channels one Hadamard block mixes (head dims above 128 get two blocks)
# How the quantization launches rotate (A/B in bench/rotation_cost_ab.py; clear ``replay`` after changing it):
#  "dot":   each program's rows divided by their max |x|, rounded to fp16, one 128x128 fp16 tl.dot; 8 warps, Q
#           programs of >= 128 rows. Any dtype and head dim; 64 KB of shared memory.
#  "tiled": the 16-bit rows as they are times the signs in their dtype, several tiles per program, loads
#           pipelined (``quant._quantize_rotated_tiles``); Hopper's (``KernelConfig.rotation_tiles``). Needs
#           16-bit inputs and unpadded head dims ("dot" otherwise) and ~115 KB of shared memory per K program.
#  "auto":  "tiled" where the config says so, else "dot".
METHODS = ("dot", "tiled")
METHOD = "auto"
TILES_PER_PROGRAM = 8  # at most; fewer where the launch would not fill the GPU twice over
PIPE_STAGES = 2  # 3 was slower on the H200 (bench/NOTES.md)
# Registers per thread of "tiled" launches (NVIDIA): two 8-warp K programs per SM on sm90; 96 spills.
TILED_MAXNREG = 128


def method_for(rotation_tiles: bool, q_dtype, k_dtype, head_dim: int, d_pad: int) -> str:
    """The method a call runs: METHOD unless "auto", then what its config says; "dot" wherever "tiled" cannot
    run (inputs not both fp16 or both bf16, or head dims padded to ``d_pad``)."""
    method = METHOD if METHOD != "auto" else "tiled" if rotation_tiles else "dot"
    tiled_ok = head_dim == d_pad and q_dtype == k_dtype and q_dtype in (torch.float16, torch.bfloat16)
    return method if method != "tiled" or tiled_ok else "dot"


def tiles(method: str, n_tiles: int, sms: int) -> int:
    """Tiles per program of a launch over ``n_tiles`` in all (0: one tile per program, the "dot" kernel):
    up to TILES_PER_PROGRAM, as long as there are programs for two per SM."""
    if method != "tiled":
        return 0
    return max(1, min(TILES_PER_PROGRAM, n_tiles // (2 * sms)))


def quant_warps(method: str, rows: int, d_pad: int) -> int:
    """Warps of a rotating quantization launch of ``rows`` x ``d_pad`` tiles (4 without the rotation)."""
    return 8 if method == "dot" or rows * d_pad >= 128 * 128 else 4


def q_rows(method: str, block_m: int) -> int:
    """Rows per Q program of a rotating launch: "dot" shares its signs' load over at least 128."""
    return max(block_m, 128) if method == "dot" else block_m


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
