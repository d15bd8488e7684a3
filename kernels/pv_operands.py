"""8-bit MMA operands, rounded without a float → int conversion: INT8 Q and K (``round_to_int8``), INT8 P
(``round_p_offset_int8``, with its row sums ``round_p_offset_int8_sums``), fp8 P and V (``to_fp8``), and the key
order that lets P feed P·V without shuffles (``mma_operand_order``). Shared by the quantization launches and every
attention kernel."""
from __future__ import annotations

import triton
import triton.language as tl

# Adding 1.5·2²³ to a float of magnitude below 2²² rounds it to an integer (to nearest even) held
# in the low mantissa bits, whose low byte is then that integer as two's-complement int8.
_ROUNDING_BIAS = tl.constexpr(12582912.0)
# INT8 P·V: P is rounded to 0..255 and fed to the int8 MMA as P - 128 (Triton multiplies int8 by int8
# only); 128 times each key tile's column sums of V puts the offset back (``convert_v_kernel``).
P_OFFSET = tl.constexpr(128)


@triton.jit
def round_p_offset_int8(p):
    """P in 0..255 (fp32) rounded to the nearest integer (ties to even) and stored as P - P_OFFSET, int8."""
    return (p + (_ROUNDING_BIAS - P_OFFSET)).to(tl.int32, bitcast=True).to(tl.int8)


@triton.jit
def round_p_offset_int8_sums(p):
    """``round_p_offset_int8(p)`` and P's row sums (int32, exact, the offset back in). The sums add the biased
    floats' bits, 0x4B400000 + P - P_OFFSET each, as wrapping int32 and take the N biases off at the end: exact
    mod 2^32, and the sum fits. Summing the int8 values instead sign-extends each byte first (one PRMT a logit)."""
    bits = (p + (_ROUNDING_BIAS - P_OFFSET)).to(tl.int32, bitcast=True)
    N: tl.constexpr = p.shape[1]
    # N biases of 0x4B400000 (1.5·2²³'s bits) less each one's offset, wrapped to int32 as the sums wrap
    BIASES: tl.constexpr = (N * (0x4B400000 - P_OFFSET) + 2**31) % 2**32 - 2**31
    return bits.to(tl.int8), tl.sum(bits, 1) - BIASES


@triton.jit
def to_fp8(x, dtype: tl.constexpr, FIX_ROUNDING: tl.constexpr):
    """Cast fp32 to an fp8 type.

    Triton's CPU interpreter mis-rounds fp8 casts whose mantissa carries into the next binade
    (7.9 → 4.0 instead of 8.0) and turns NaN into a number (384 in e4m3fn), so under the interpreter
    the value is first rounded to the fp8 grid in fp32, ties to even as the GPU's cvt.rn does, the
    cast is then exact, and NaN is written as its bits. Compiled GPU code never takes this path.
    """
    if FIX_ROUNDING:
        ax = tl.abs(x)
        min_exp: tl.constexpr = -7.0 if dtype == tl.float8e4b8 else -6.0
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(ax, 1e-30))), min_exp)
        ulp = tl.exp2(e - 3.0)
        x = tl.where(ax > 0, ((x / ulp + _ROUNDING_BIAS) - _ROUNDING_BIAS) * ulp, x)  # x / ulp < 16
        nan_bits: tl.constexpr = -128 if dtype == tl.float8e4b8 else 127  # fnuz: 0x80, fn: 0x7F
        return tl.where(x == x, x.to(dtype), tl.full(x.shape, nan_bits, tl.int8).to(dtype, bitcast=True))
    return x.to(dtype)


@triton.jit
def round_to_int8(y):
    """``y`` clamped to ±127 and rounded to the nearest integer (ties to even, as torch.round), as
    int8, with one add instead of a float → int conversion per element."""
    y = tl.minimum(tl.maximum(y, -127.0), 127.0) + _ROUNDING_BIAS
    return y.to(tl.int32, bitcast=True).to(tl.int8)


# Keys are reordered within chunks of this many (the k-extent of one 8-bit MMA instruction).
KEY_PERM_CHUNK = 32


@triton.jit
def mma_operand_order(x, N: tl.constexpr):
    """Reorder the N keys along axis 1 of ``x`` from an MMA accumulator's column order to the 8-bit
    A operand's: within each 32-key chunk, key 16h + 8j + 2t + i moves to 16h + 4t + 2j + i.

    A thread holds accumulator columns 2t, 2t+1, 8+2t, 9+2t of each 32, and the fp8 A operand wants
    4 consecutive keys per thread. A sum over keys ignores their order, so P is relabelled for free
    (the attention kernel) and V's tokens are stored in the same order (``convert_v_kernel``); P
    then feeds P·V without shuffles."""
    M: tl.constexpr = x.shape[0]
    x = tl.reshape(x, (M, N // 32, 2, 2, 4, 2))
    x = tl.permute(x, (0, 1, 2, 4, 3, 5))
    return tl.reshape(x, (M, N))
