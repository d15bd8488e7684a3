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
# How the quantization launches rotate (issue 42 item 2, A/B in bench/rotation_cost_ab.py; clear ``replay`` after
# changing it). All apply the same Hadamard to the same fp16-rounded rows; only the fp32 sum order differs.
#  "dot":    one 128x128 fp16 tl.dot, 8 warps, Q programs of >= 128 rows (the default until measured)
#  "narrow": the same dot in the unrotated launch's configuration (4 warps, the config's block rows)
#  "split2": H_128 = H_2 (x) H_64: two 64-column slices loaded apart, each times the 64x64 signs, then one fp32
#            butterfly; unrotated configuration, a quarter of the signs' bytes and half the MMA work
#  "split4": H_4 (x) H_32 the same way: four 32-column slices, 2 KB of signs, two butterfly stages
#  "split4w": "split4" with 8 warps on tiles of 128+ rows (the K launch: 187 registers at 4 warps on sm90)
#  "native": the 16-bit input rows times the signs in their own dtype (no row max, no rounding before the sums),
#            K's mean subtracted after the product; 8 warps, Q programs of >= 128 rows. fp32 inputs and padded
#            head dims take "dot"
#  "native4": "native" in the unrotated launch's configuration
#  "fwht":   fp32 butterflies (log2(block) add/sub stages), the unrotated launch's configuration but 8 warps on
#            tiles of 128+ rows
#  "ntiles": "native" with each program looping over TILES_PER_PROGRAM tiles, the next tile's rows loaded in
#            registers while this one is multiplied; "npipe": the same loop pipelined by Triton (PIPE_STAGES)
#  "tiled":  "npipe" with the Q launch in the unrotated configuration (4 warps, the config's rows), 128
#            registers (two programs per SM on sm90): KernelConfig.rotation_tiles
METHODS = ("dot", "narrow", "split2", "split4", "split4w", "native", "native4", "fwht", "ntiles", "npipe", "tiled")
# "auto": "tiled" where the config says so (``KernelConfig.rotation_tiles``), else "dot"; a name: that one.
METHOD = "auto"
TILES_PER_PROGRAM = 8  # at most; fewer where the launch would not fill the GPU twice over
PIPE_STAGES = 2
MAXNREG = 0  # a register cap on the native methods' launches (0: none; "tiled" has its own), for A/B runs
TILED_MAXNREG = 128
LOOP_METHODS = ("ntiles", "npipe", "tiled")
NATIVE_METHODS = ("native", "native4", "ntiles", "npipe", "tiled")


def split_slices(method: str, d_pad: int, block: int) -> int:
    """Column slices a method multiplies apart (1: one dot over the whole row). Split only where the row is
    one Hadamard block whose slices still make 16-wide dots; "narrow" otherwise."""
    slices = {"split2": 2, "split4": 4, "split4w": 4}.get(method, 1)
    return slices if d_pad == block and block // slices >= 16 else 1


def quant_warps(method: str, rows: int, d_pad: int) -> int:
    """Warps of a rotating quantization launch of ``rows`` x ``d_pad`` tiles (4 without the rotation)."""
    wide = ("split4w", "fwht", "tiled")
    if method in ("dot", "native", "ntiles", "npipe") or (method in wide and rows * d_pad >= 128 * 128):
        return 8
    return 4


def mode(method: str) -> int:
    """``quant.ROTATE_MODE`` of a method: 0 the normalised fp16 dot, 1 the native dot, 2 butterflies."""
    return 1 if method in NATIVE_METHODS else 2 if method == "fwht" else 0


def method_for(rotation_tiles: bool) -> str:
    """The method a call runs: METHOD unless "auto", then what its config says."""
    if METHOD != "auto":
        return METHOD
    return "tiled" if rotation_tiles else "dot"


def tiles(method: str, n_tiles: int, sms: int) -> int:
    """Tiles per program of a looping method over ``n_tiles`` in all (0: one tile per program): up to
    TILES_PER_PROGRAM, as long as there are programs for two per SM."""
    if method not in LOOP_METHODS:
        return 0
    return max(1, min(TILES_PER_PROGRAM, n_tiles // (2 * sms)))


def register_cap(method: str) -> int:
    """``maxnreg`` for a rotating launch of ``method`` (0: none). NVIDIA only."""
    return MAXNREG or (TILED_MAXNREG if method == "tiled" else 0)


def pipe(method: str) -> int:
    """``quant.ROTATE_PIPE``: 0 the next tile in registers, else Triton's pipeliner stages."""
    return PIPE_STAGES if method in ("npipe", "tiled") else 0


def unnormalised(method: str) -> bool:
    """Whether the method's product leaves out 1/sqrt(block) (folded into the scales instead)."""
    return mode(method) != 0


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
