"""The quantization launches of one call: K/V statistics, INT8 Q and K (optionally rotated), the converted V."""
from __future__ import annotations

import math

import torch

from . import attention as attn
from . import devices, quant, quant_v, rotation
from .arch import FP8_MAX, KernelConfig, interpreter_enabled
from .launch import _cdiv, _launch, _pdl_launch
from .rotation import hadamard_block

_FP8_TORCH = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
# fp16 per-tile accumulation: keep |V| small enough that a tile of BLOCK_N keys sums below 65504.
_FP16_TILE_V_LIMIT = 256.0
INT8_MAX = 127.0  # V's range with INT8 P·V
INT8_P_MAX = 255.0  # P's largest weight with INT8 P·V (fed to the MMA as P - 128: ``quant.P_OFFSET``)


def _kv_stats(k, v, k_sum: bool, v_stats: int, d_pad: int, pdl: bool = False):
    """One pass over K and V (same B, H, L) for the per-channel statistics the quantization needs.

    Returns ``(parts, n_parts, k_tokens)``: fp32 (4, B*H, n_parts, D_PAD) partials, slots K sum, V
    min, V max (or max |v| with ``V_ABSMAX``), V sum, which the Q launch reduces
    (``quant._finalize_kv_stats``), and how many keys K's sum covers (``quant.k_mean_sample``).
    ``None`` when nothing needs statistics.
    """
    if not k_sum and v_stats == quant.V_NONE:
        return None, 0, 0
    B, H, L, D = k.shape
    block = quant.stats_block(d_pad)
    tiles = _cdiv(L, block)
    per_part = _cdiv(tiles, quant.STATS_PARTS)
    n_parts = _cdiv(tiles, per_part)  # every chunk holds at least one real token
    k_stride, k_tokens = quant.k_mean_sample(L, d_pad)
    parts = torch.empty((4, B * H, n_parts, d_pad), dtype=torch.float32, device=k.device)
    _launch(quant.kv_stats_kernel, (n_parts, B * H), (
        k, *k.stride(), v, *v.stride(), *parts.unbind(0), H, L, D, per_part, k_stride,
    ), dict(BLOCK=block, D_PAD=d_pad, K_SUM=k_sum, V_STATS=v_stats, PDL=pdl,
            INTERPRETER=interpreter_enabled()), num_warps=8)
    return parts, n_parts, k_tokens


_signs: dict = {}


def _rotation_signs(d_pad: int, block: int, device, dtype=torch.float16) -> torch.Tensor:
    """``rotation.hadamard_block`` times sqrt(block) (±1 and 0, exact in any float dtype), made once per device,
    size and dtype."""
    key = (d_pad, block, device, dtype)  # torch.device hashes fast; str(device) cost ~20 µs a call
    if key not in _signs:
        _signs[key] = (hadamard_block(d_pad, block) * math.sqrt(block)).round().to(dtype).to(device)
    return _signs[key]


def _quantize_qk(x, group, block, d_pad, scale_mult, mean_mode=quant.MEAN_NONE, stats=None, kv_div=1,
                 bias=None, bias_mult=1.0, per_block=False, finalize=None, pdl=False, after=True, rotate=0,
                 method="dot"):
    """INT8 copy (B*H, L, D_PAD) and scales: one per block with ``per_block`` (group == block), else
    one per token (the group's scale repeated; ``quant.K_SM90_GROUPS``: SageAttention's sm90 K groups).

    ``stats``: ``_kv_stats``'s partials, the key count, the keys K's sum covers, and the (3, B*H_KV, D)
    K mean / V scale / V mean buffer.
    ``finalize``: ``(k_sum, v_stats, v_range, v_pow2)`` for the launch that reduces the partials
    into that buffer (the first one after the statistics).
    ``pdl``: the call's launches are chained (``KernelConfig.pdl``); ``after``: this is not the
    call's first launch, so it may start before the one before it ends.
    ``rotate``: block size of the Hadamard rotation applied before rounding (0: none); ``method``: how
    (``rotation.METHOD``).
    """
    B, H, L, D = x.shape
    assert group != quant.K_SM90_GROUPS or block % 128 == 0, "SageAttention's sm90 K groups tile 128 keys"
    out = torch.empty((B * H, L, d_pad), dtype=torch.int8, device=x.device)
    scale = torch.empty((B * H, _cdiv(L, block) if per_block else L), dtype=torch.float32, device=x.device)
    parts, n_parts, l_kv, k_tokens, final = stats if stats is not None else (scale, 0, 0, 0, scale)
    slots = (parts[0].numel(), final[0].numel()) if stats is not None else (0, 0)
    k_sum, v_stats, v_range, v_pow2 = finalize or (False, quant.V_NONE, 1.0, False)
    tiles = rotation.tiles(method, B * H * _cdiv(L, block), devices.sm_count(x.device)) if rotate else 0
    grid = (_cdiv(_cdiv(L, block), max(tiles, 1)), B * H)
    if tiles:  # the tiled product leaves 1/sqrt(block) to the scales
        scale_mult = scale_mult / math.sqrt(rotate)
    _launch(quant.quantize_int8_kernel, grid, (
        x, *x.stride(), parts, slots[0], final, slots[1],
        out, scale, bias if bias is not None else scale,
        _rotation_signs(d_pad, rotate, x.device, x.dtype if tiles else torch.float16) if rotate else scale,
        H, kv_div, L, l_kv, k_tokens, D, n_parts, scale_mult, bias_mult,
    ), dict(BLOCK=block, GROUP=group, D_PAD=d_pad, MEAN_MODE=mean_mode, SCALE_PER_BLOCK=per_block,
            FINALIZE=finalize is not None, K_SUM=k_sum, V_STATS=v_stats, V_RANGE=v_range, V_POW2=v_pow2,
            PARTS_PAD=quant.STATS_PARTS, PDL=pdl, ROTATE=rotate, INTERPRETER=interpreter_enabled(),
            ROTATE_TILES=tiles, ROTATE_STAGES=rotation.PIPE_STAGES),
            num_warps=rotation.quant_warps(method, block, d_pad) if rotate else 4,
            **({"maxnreg": rotation.TILED_MAXNREG} if tiles and x.is_cuda and torch.version.hip is None else {}),
            **_pdl_launch(pdl and after))
    return out, scale


def _v_stats_needed(cfg: KernelConfig, smooth_v: bool) -> int:
    """Which V statistics ``_prepare_v`` needs: none for the plain 16-bit path (V read in place)."""
    if smooth_v:
        return quant.V_MINMAXSUM
    if cfg.pv_precision in ("fp8", "int8") or cfg.pv_accum_dtype in ("fp16+fp32", "fp16"):
        return quant.V_ABSMAX
    return quant.V_NONE


def _v_range(cfg: KernelConfig) -> tuple[float, bool]:
    """(range V is scaled into, whether the scale is a power of two) for the converted V."""
    if cfg.pv_precision == "fp8":
        return FP8_MAX[cfg.fp8_format], False
    if cfg.pv_precision == "int8":
        return INT8_MAX, False
    return _FP16_TILE_V_LIMIT, True  # powers of two keep the scaling exact in fp16


def _prepare_v(v, cfg: KernelConfig, smooth_v: bool, d_pad: int, final, pdl: bool = False):
    """Return (v operand, strides (b, h, n, d), v_scale, v_mean, pv_mode, p_scale, tile bias).

    The plain 16-bit path reads V in place. FP8, INT8, smoothing and fp16 tile accumulation convert V
    with the scale and mean in ``final`` (slots 1 and 2, from ``quant._finalize_kv_stats``). 8-bit V
    is stored with its tokens in MMA operand order (``quant.KEY_PERM_CHUNK``-token chunks,
    zero-padded), matching P's order in the kernel. INT8 V also has per-key-tile column sums
    (``quant_v.convert_v_kernel``'s ``TileBias``, None otherwise).
    """
    B, H, L, D = v.shape
    fp8 = cfg.pv_precision == "fp8"
    int8 = cfg.pv_precision == "int8"
    tile16 = not (fp8 or int8) and cfg.pv_accum_dtype in ("fp16+fp32", "fp16")
    if _v_stats_needed(cfg, smooth_v) == quant.V_NONE:
        return v, v.stride(), None, None, attn.PV_16BIT, 1.0, None

    if fp8 or int8:
        if fp8:
            out_dtype, mode, p_scale = _FP8_TORCH[cfg.fp8_format], attn.PV_FP8, FP8_MAX[cfg.fp8_format]
        else:
            out_dtype, mode, p_scale = torch.int8, attn.PV_INT8, INT8_P_MAX
        # Stored (D_PAD, L) per head: 8-bit MMAs want P·V's B operand K-major (tokens contiguous).
        # Rows padded to whole operand-order chunks (16 bytes at least, as tensor descriptors need).
        l_pad = _cdiv(L, quant.KEY_PERM_CHUNK) * quant.KEY_PERM_CHUNK
        rows = 2 * d_pad if cfg.v_residual else d_pad  # the residual's channel rows follow V's
        out = torch.empty((B * H, rows, l_pad), dtype=out_dtype, device=v.device)
        stride_l, stride_d = 1, l_pad
    else:
        out_dtype, mode, p_scale = torch.float16, (attn.PV_16BIT_TILE if tile16 else attn.PV_16BIT), 1.0
        l_pad = L
        out = torch.empty((B * H, L, d_pad), dtype=out_dtype, device=v.device)
        stride_l, stride_d = d_pad, 1
    scale, mean = final[1], final[2]
    # INT8: one program per key tile of the attention kernel, which writes that tile's column sums.
    block = cfg.block_n if int8 else 64
    tile_bias = (torch.empty((B * H, _cdiv(L, block), d_pad), dtype=torch.int32, device=v.device)
                 if int8 else None)
    _launch(quant_v.convert_v_kernel, (_cdiv(L, block), B * H), (
        v, *v.stride(), scale, mean, out, out.stride(0), stride_l, stride_d,
        tile_bias if int8 else out, H, L, l_pad, D,
    ), dict(BLOCK=block, D_PAD=d_pad, HAS_MEAN=smooth_v, INTERPRETER=interpreter_enabled(), KEY_PERM=fp8 or int8,
            RESIDUAL=fp8 and cfg.v_residual, PDL=pdl), num_warps=8 if block * d_pad > 8192 else 4,
        **_pdl_launch(pdl))
    # Kernel-side strides of the converted V as (B, H, L, D_PAD).
    strides = (H * out.stride(0), out.stride(0), stride_l, stride_d)
    return out, strides, scale, mean if smooth_v else None, mode, p_scale, tile_bias

