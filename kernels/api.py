"""``sageattn``: the public entry point, call-compatible with ``sageattention.sageattn``.

Host side only: validation, layout handling (strided views, never transposed copies), the
quantization launches and the attention launch. Registered as the custom op
``sagetriton::attention`` with a fake implementation so ``torch.compile(fullgraph=True)`` traces
through it.
"""
from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Optional

import torch

from . import attention as attn
from . import footprint, hopper_gluon, hopper_lse, quant, replay, rotation, tail_split
from .arch import (
    FP8_MAX,
    PV_ACCUM_DTYPES,
    QK_QUANT_GRANS,
    KernelConfig,
    arch_for_device,
    interpreter_enabled,
    resolve_config,
)
from .build_errors import root_cause
from .devices import device_scope, launch_device, wrapped
from .footprint import head_dim_padded
from .log import logger
from .rotation import ROTATION_BLOCK, hadamard_block
from .triton_compat import sm90_ptxas_scope

_FP8_TORCH = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
# fp16 per-tile accumulation: keep |V| small enough that a tile of BLOCK_N keys sums below 65504.
_FP16_TILE_V_LIMIT = 256.0
INT8_MAX = 127.0  # V's range with INT8 P·V
INT8_P_MAX = 255.0  # P's largest weight with INT8 P·V (fed to the MMA as P - 128: ``quant.P_OFFSET``)
_warned: set = set()
GRID_Y_LIMIT = 65535  # CUDA's largest grid y (and z); B·H programs go there


def _cdiv(a: int, b: int) -> int:
    # triton.cdiv is a constexpr function in Triton >= 3.7: ~10 µs of unwrapping per host call.
    return -(-a // b)


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        logger.warning("[SageTriton] %s", msg)


# Set by the installer's cross-compile check (``installer.crosscompile.record_launches``): each launch is
# handed to it, with its arguments, instead of being run. None: launch.
_launch_hook: Optional[Callable] = None


def set_launch_hook(hook: Optional[Callable]) -> Optional[Callable]:
    """Route launches to ``hook(kernel, grid, args, constexprs, options)`` (None: run them); returns the
    previous hook."""
    global _launch_hook
    previous, _launch_hook = _launch_hook, hook
    return previous


def _launch(kernel, grid, args: tuple, constexprs: dict, num_warps: int, num_stages: int = 1, **options) -> None:
    # Triton 3.10 turns fused multiply-adds off by default (3.9 warns about it); the kernels are tuned and
    # checked with them on, and say so rather than inherit the default.
    options.setdefault("enable_fp_fusion", True)
    if _launch_hook is not None:
        _launch_hook(kernel, grid, args, dict(constexprs), {"num_warps": num_warps, "num_stages": num_stages,
                                                            **options})
        return
    kwargs = {**constexprs, "num_warps": num_warps, "num_stages": num_stages, **options}
    device = launch_device(args)
    with device_scope(device) if device is not None else nullcontext():  # Triton launches on the current device
        compiled = kernel[grid](*args, **kwargs)
        replay.note_launch(kernel, grid, args, kwargs, compiled)


def _check_inputs(q, k, v, layout: str, attn_mask, is_causal: bool) -> None:
    # Named errors before any arithmetic (a 0 head size divided by zero in the scale; a list had no .dim()).
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} (use torch.as_tensor(...))")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if layout not in ("HND", "NHD"):
        raise ValueError(f"tensor_layout must be 'HND' (B, H, L, D) or 'NHD' (B, L, H, D), got {layout!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k and v must be 4-D tensors")
    h_dim = 1 if layout == "HND" else 2
    for name, n in (("H (q's heads)", q.shape[h_dim]), ("Hkv (k's heads)", k.shape[h_dim]),
                    ("Hkv (v's heads)", v.shape[h_dim]), ("D (q's head_dim)", q.shape[3])):
        if n == 0:
            raise ValueError(f"{name} is 0: every tensor needs at least one head and a head_dim of 1..256")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"sageattn supports float16, bfloat16 and float32 inputs, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on one device")
    if attn_mask is not None and attn_mask.device != q.device:
        raise ValueError(f"attn_mask is on {attn_mask.device}, q on {q.device}: move it with .to(q.device)")
    if q.device.type == "cpu" and not interpreter_enabled() and _launch_hook is None:
        raise RuntimeError("sageattn runs on CUDA/ROCm GPUs; CPU tensors need TRITON_INTERPRET=1 (tests only)")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be True or False, got {type(is_causal).__name__} {is_causal!r}")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal cannot both be set (same rule as torch SDPA)")


def _check_scale(sm_scale, head_dim: int) -> float:
    """``sm_scale`` as a float (None: 1/sqrt(head_dim)). Any finite value of either sign is computed; NaN or
    ±inf would make every logit non-finite (SDPA's output is NaN then), so they are refused by name."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a real number or None, got {type(sm_scale).__name__} {sm_scale!r}")
    value = float(sm_scale)
    if not math.isfinite(value):
        raise ValueError(f"sm_scale must be finite, got {value} (None means 1/sqrt(head_dim))")
    return value


def argument_error(q, k, v, tensor_layout: str = "HND", is_causal: bool = False, sm_scale=None,
                   attn_mask=None) -> Optional[Exception]:
    """The error ``sageattn`` raises for these arguments before any launch (a caller's mistake, never a
    kernel fault), or None."""
    try:
        _check_inputs(q, k, v, tensor_layout, attn_mask, is_causal)
        qh, kh, vh = _as_bhld(q, tensor_layout), _as_bhld(k, tensor_layout), _as_bhld(v, tensor_layout)
        _check_shapes(qh, kh, vh)
        _check_scale(sm_scale, q.shape[-1])
        B, H, LQ = qh.shape[:3]
        if H > GRID_Y_LIMIT:
            raise ValueError(f"H = {H} query heads exceed {GRID_Y_LIMIT} (the GPU's grid limit); split the heads")
        if attn_mask is not None:
            _prepare_mask(attn_mask, B, H, LQ, kh.shape[2])
    except (TypeError, ValueError) as e:
        return e
    return None


# Every KernelConfig field: the values the kernels are built for. Checked once per config object.
_BLOCK_SIZES = (16, 32, 64, 128, 256)
_WARPS = (1, 2, 4, 8, 16)
_PV_KERNEL_PRECISIONS = ("fp16", "fp8", "int8")  # fp8+residual is pv_precision="fp8" with v_residual=True
_checked_configs: dict = {}


def check_config(cfg) -> KernelConfig:
    """``cfg`` if it is a KernelConfig the kernels can run, else a TypeError/ValueError naming the field
    and the allowed values (a bad tile size would read uninitialised memory or divide by zero, an
    unknown name would silently run another variant)."""
    # Traced by torch.compile: checked in full, once per graph; dynamo's id() of an object it reached through
    # a dict with dtype keys fails (torch 2.14: "name 'torch' is not defined").
    compiling = torch.compiler.is_compiling()
    if not compiling and _checked_configs.get(id(cfg)) is cfg:
        return cfg
    if not isinstance(cfg, KernelConfig):
        raise TypeError(f"config must be a sagetriton.kernels.KernelConfig (e.g. kernels.resolve_config(...)[0]), "
                        f"got {type(cfg).__name__}")
    for name, allowed in (("qk_quant_gran", QK_QUANT_GRANS), ("pv_precision", _PV_KERNEL_PRECISIONS),
                          ("pv_accum_dtype", PV_ACCUM_DTYPES)):
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"config.{name}={getattr(cfg, name)!r} is not one of {allowed}")
    fp8_formats = tuple(FP8_MAX)
    if cfg.fp8_format is not None and cfg.fp8_format not in fp8_formats:
        raise ValueError(f"config.fp8_format={cfg.fp8_format!r} is not one of {fp8_formats} or None")
    if cfg.pv_precision == "fp8" and cfg.fp8_format is None:
        raise ValueError(f"config.pv_precision='fp8' needs config.fp8_format, one of {fp8_formats}")
    for name, allowed in (("block_m", _BLOCK_SIZES), ("block_n", _BLOCK_SIZES), ("num_warps", _WARPS)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
            raise ValueError(f"config.{name}={value!r} is not one of {allowed}")
    if cfg.pv_precision in ("fp8", "int8") and cfg.block_n < quant.KEY_PERM_CHUNK:
        raise ValueError(f"config.block_n={cfg.block_n} is below {quant.KEY_PERM_CHUNK}, the key chunk of 8-bit P·V")
    for name, low in (("num_stages", 1), ("max_registers", 0), ("shared_kv_min_len", 0), ("min_seq_len", 0)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"config.{name}={value!r} must be an integer >= {low}")
    for name in ("use_tma", "v_residual", "pdl", "qk_rotation", "rotation_tiles"):
        if not isinstance(getattr(cfg, name), bool):
            raise TypeError(f"config.{name} must be True or False, got {getattr(cfg, name)!r}")
    if cfg.v_residual and cfg.pv_precision != "fp8":
        raise ValueError(f"config.v_residual=True needs pv_precision='fp8', got {cfg.pv_precision!r}")
    if compiling:
        return cfg
    if len(_checked_configs) > 256:  # callers that build a config per call: keep the cache small
        _checked_configs.clear()
    _checked_configs[id(cfg)] = cfg
    return cfg


def _as_bhld(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "HND" else t.permute(0, 2, 1, 3)


def _prepare_mask(attn_mask, B, H, LQ, LK):
    if attn_mask is None:
        return None, attn.MASK_NONE
    if attn_mask.dtype == torch.bool:
        kind = attn.MASK_BOOL
    elif attn_mask.is_floating_point():
        kind = attn.MASK_ADD
    else:
        raise TypeError(f"attn_mask must be bool or floating point, got {attn_mask.dtype}")
    try:
        m = attn_mask.expand(B, H, LQ, LK)  # a view: broadcast dims get stride 0
    except RuntimeError as e:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"(B, H, Lq, Lk) = {(B, H, LQ, LK)}") from e
    return m, kind


def _pdl_launch(pdl: bool) -> dict:
    """Launch options for a call's launch after its first (``KernelConfig.pdl``)."""
    return {"launch_pdl": True} if pdl else {}


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
    one per token (the group's scale repeated).

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
    out = torch.empty((B * H, L, d_pad), dtype=torch.int8, device=x.device)
    scale = torch.empty((B * H, _cdiv(L, block) if per_block else L), dtype=torch.float32, device=x.device)
    parts, n_parts, l_kv, k_tokens, final = stats if stats is not None else (scale, 0, 0, 0, scale)
    slots = (parts[0].numel(), final[0].numel()) if stats is not None else (0, 0)
    k_sum, v_stats, v_range, v_pow2 = finalize or (False, quant.V_NONE, 1.0, False)
    tiles = rotation.tiles(method, B * H * _cdiv(L, block), sm_count(x.device)) if rotate else 0
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
    (``quant.convert_v_kernel``'s ``TileBias``, None otherwise).
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
    _launch(quant.convert_v_kernel, (_cdiv(L, block), B * H), (
        v, *v.stride(), scale, mean, out, out.stride(0), stride_l, stride_d,
        tile_bias if int8 else out, H, L, l_pad, D,
    ), dict(BLOCK=block, D_PAD=d_pad, HAS_MEAN=smooth_v, INTERPRETER=interpreter_enabled(), KEY_PERM=fp8 or int8,
            RESIDUAL=fp8 and cfg.v_residual, PDL=pdl), num_warps=8 if block * d_pad > 8192 else 4,
        **_pdl_launch(pdl))
    # Kernel-side strides of the converted V as (B, H, L, D_PAD).
    strides = (H * out.stride(0), out.stride(0), stride_l, stride_d)
    return out, strides, scale, mean if smooth_v else None, mode, p_scale, tile_bias


def _out_shape(B: int, H: int, LQ: int, D: int, out_layout: str) -> tuple:
    return (B, H, LQ, D) if out_layout == "HND" else (B, LQ, H, D)


@dataclass
class _CallPlan:
    """One call's shapes, output buffers and kernel choice, before anything is launched."""

    qh: torch.Tensor  # q, k, v as (B, H, L, D) views
    kh: torch.Tensor
    vh: torch.Tensor
    out: torch.Tensor  # in ``out_layout``; ``oh`` is the same memory seen as (B, H, L, D)
    oh: torch.Tensor
    lse: torch.Tensor
    dims: tuple  # (B, H, H_KV, LQ, LK, D)
    d_pad: int
    sm_scale: float
    k_scalar: bool  # one K scale per key tile
    pdl: bool
    shared_kv: Optional[tuple]  # the Gluon kernel's launch plan (``_shared_kv_plan``), None: the portable kernel
    out_layout: str = "HND"
    dtype: torch.dtype = torch.float16
    mask_view: Optional[torch.Tensor] = None  # the mask as the attention launch got it (``replay`` slot)


@dataclass
class _Quantized:
    """The quantization launches' outputs, the attention kernel's inputs."""

    q8: torch.Tensor
    qs: torch.Tensor
    qbias: Optional[torch.Tensor]
    k8: torch.Tensor
    ks: torch.Tensor
    v_op: torch.Tensor
    v_strides: tuple
    v_scale: Optional[torch.Tensor]
    v_mean: Optional[torch.Tensor]
    pv_mode: int
    p_scale: float
    v_tile_bias: Optional[torch.Tensor]  # INT8 P·V: per key tile (``_prepare_v``)


def attention_forward(q, k, v, layout: str, is_causal: bool, sm_scale: Optional[float], attn_mask,
                      return_lse: bool, cfg: KernelConfig, smooth_k: bool, smooth_v: bool,
                      out_layout: Optional[str] = None):
    """Run the kernels for an already-resolved config. Returns (out in ``out_layout``, default
    ``layout``; lse or empty). A call with the shapes and options of a recent one replays its launches
    (``replay``): no host work but the output's allocation and the launches."""
    check_config(cfg)
    return _run([q, k, v], layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
                release=False)


def attention_forward_taking(inputs: list, layout: str, is_causal: bool, sm_scale: Optional[float], attn_mask,
                             cfg: KernelConfig, smooth_k: bool, smooth_v: bool, out_layout: Optional[str] = None):
    """``attention_forward`` for a caller that hands over its only references to q, k, v in ``inputs``
    (emptied here): each float input is dropped once quantized and the output is allocated after
    that, so the call's peak holds at most one quantized copy beside the floats (ComfyUI's
    single-owner q, k, v containers). Calls small enough to replay (``replay.worth_recording``) keep
    their inputs to the end instead, as a recording needs. Returns the output only."""
    return _run(inputs, layout, is_causal, sm_scale, attn_mask, False, cfg, smooth_k, smooth_v, out_layout,
                release=True)[0]


def _run(inputs: list, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
         release: bool, in_op: bool = False):
    """The call on its inputs' device (``devices``); wrapper subclasses through the custom op, which
    waits on and unwraps them (``in_op``: this is that op's implementation)."""
    if wrapped(*inputs, attn_mask):
        if in_op or _launch_hook is not None:
            kind = type(next(t for t in (*inputs, attn_mask) if wrapped(t))).__name__
            raise TypeError(f"sageattn cannot read a {kind} by pointer and its dispatch did not unwrap it: "
                            "pass plain tensors")
        q, k, v = inputs
        inputs.clear()
        return attention_op(q, k, v, layout, bool(is_causal), float(_check_scale(sm_scale, q.shape[-1])), attn_mask,
                            bool(return_lse), *_op_config(cfg), bool(smooth_k), bool(smooth_v), out_layout or layout)
    with device_scope(inputs[0].device):
        return _run_on_device(inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                              out_layout, release)


def _op_config(cfg: KernelConfig) -> tuple:
    """``cfg``'s fields in the custom op's argument order."""
    return (cfg.qk_quant_gran, cfg.pv_precision, cfg.pv_accum_dtype, cfg.fp8_format or "", cfg.block_m, cfg.block_n,
            cfg.num_warps, cfg.num_stages, cfg.use_tma, cfg.max_registers, cfg.shared_kv_min_len, cfg.v_residual,
            cfg.pdl, cfg.qk_rotation, cfg.rotation_tiles)


def _run_on_device(inputs: list, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                   out_layout, release: bool):
    """Replay a recorded call, or work the call out in full (recording it where it may be replayed)."""
    key = None
    # A negative scale quantizes a negated copy of q (``_plan_call``), which a replay would not make.
    if _launch_hook is None and replay.worth_recording(*inputs) and not (
            isinstance(sm_scale, (int, float)) and sm_scale < 0):
        key = replay.call_key(*inputs, attn_mask, cfg, (layout, out_layout, is_causal, sm_scale, return_lse,
                                                        smooth_k, smooth_v))
    if key is None or replay.refused(key):
        plan = _forward(inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                        out_layout, release=release)
        return plan.out, plan.lse
    rec = replay.lookup(key, cfg)
    if rec is not None:
        q, k, v = inputs
        inputs.clear()
        return _replay_call(rec, q, k, v, layout, out_layout or layout, attn_mask, return_lse)
    gluon_error = (_shared_kv_error, _shared_kv_lse_error)
    replay.start()
    try:
        plan = _forward(inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                        out_layout, release=False)
    finally:
        launches = replay.stop()
    # Not recorded when a Gluon kernel failed and the portable one took over.
    if (_shared_kv_error, _shared_kv_lse_error) == gluon_error:
        turns = plan.shared_kv[3] if plan.shared_kv is not None else None
        replay.record(key, cfg, launches, (plan.qh, plan.kh, plan.vh, plan.oh, plan.lse, plan.mask_view),
                      zero=(turns,) if turns is not None else (), lse=None if return_lse else plan.lse)
    return plan.out, plan.lse


def _replay_call(rec, q, k, v, layout: str, out_layout: str, attn_mask, return_lse: bool):
    """A recorded call's launches on these inputs and a new output (``replay``)."""
    qh, kh, vh = _as_bhld(q, layout), _as_bhld(k, layout), _as_bhld(v, layout)
    B, H, LQ, D = qh.shape
    out = torch.empty(_out_shape(B, H, LQ, D, out_layout), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, LQ), dtype=torch.float32, device=q.device) if return_lse else rec.lse
    mask = attn_mask.expand(B, H, LQ, kh.shape[2]) if attn_mask is not None else None
    rec.replay((qh, kh, vh, _as_bhld(out, out_layout), lse, mask))
    return out, lse


def _forward(inputs: list, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
             release: bool) -> _CallPlan:
    """The call's host work and launches; its plan holds the output. ``release``: ``inputs`` holds the
    only references to q, k, v (``attention_forward_taking``)."""
    plan = _plan_call(*inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, out_layout,
                      defer_out=release)
    inputs.clear()
    if plan.dims[3] == 0:
        _allocate_out(plan)
        return plan
    qz = _quantize(plan, cfg, smooth_k, smooth_v, return_lse, release)
    _allocate_out(plan)
    if plan.shared_kv is not None:
        B, H, H_KV, LQ, LK, D = plan.dims
        if _run_shared_kv(qz.q8, qz.qs, qz.k8, qz.ks, qz.v_op, qz.v_scale, qz.v_mean, qz.v_tile_bias, plan.oh,
                          (H, H_KV, LQ, LK, D),
                          math.log2(qz.p_scale), cfg.v_residual, plan.shared_kv, plan.pdl,
                          lse=plan.lse if return_lse else None, qbias=qz.qbias):
            return plan
    _launch_attention(plan, qz, cfg, is_causal, attn_mask, return_lse)
    return plan


def uses_long_sequence_kernel(cfg: KernelConfig, q_len: int, head_dim: int, masked: bool, is_causal: bool,
                              return_lse: bool) -> bool:
    """Whether ``cfg`` sends a call to Hopper's Gluon kernel (where this Triton can build it): long
    enough, unmasked, not causal, 8-bit P·V through tensor descriptors, one K scale per tile, its fixed
    tiles; with or without the LSE (``return_lse`` is kept for callers)."""
    d_pad = head_dim_padded(head_dim)
    return bool(cfg.shared_kv_min_len and q_len >= cfg.shared_kv_min_len and not masked and not is_causal
                and cfg.group_sizes()[1] == cfg.block_n and cfg.pv_precision in ("fp8", "int8")
                and cfg.use_tma and d_pad == hopper_gluon.HEAD_DIM and head_dim % 8 == 0
                and cfg.block_n == hopper_gluon.BLOCK_N and cfg.block_m == hopper_gluon.ROWS)


def _check_shapes(qh, kh, vh) -> None:
    """q, k, v as (B, H, L, D) views: shapes one call can take."""
    B, H, LQ, D = qh.shape
    Bk, H_KV, LK, Dk = kh.shape
    if Bk != B or vh.shape[0] != B or vh.shape[1] != H_KV or vh.shape[2] != LK:
        raise ValueError(f"shape mismatch (as B, H, L, D): q {tuple(qh.shape)}, k {tuple(kh.shape)}, "
                         f"v {tuple(vh.shape)}")
    if Dk != D or vh.shape[3] != D:
        raise ValueError(f"q, k and v must share head_dim, got {D}, {Dk}, {vh.shape[3]}")
    if not 1 <= D <= 256:
        raise ValueError(f"head_dim must be in 1..256, got {D}")
    if H % H_KV != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({H_KV})")
    if LK == 0:
        raise ValueError("key/value sequence is empty")


def _plan_call(q, k, v, layout, is_causal, sm_scale, attn_mask, return_lse, cfg: KernelConfig,
               out_layout, defer_out: bool = False) -> _CallPlan:
    """Check the inputs, allocate the outputs and choose the attention kernel."""
    _check_inputs(q, k, v, layout, attn_mask, is_causal)
    out_layout = out_layout or layout
    if out_layout not in ("HND", "NHD"):
        raise ValueError(f"out_layout must be 'HND' or 'NHD', got {out_layout!r}")
    qh, kh, vh = _as_bhld(q, layout), _as_bhld(k, layout), _as_bhld(v, layout)
    _check_shapes(qh, kh, vh)
    B, H, LQ, D = qh.shape
    H_KV, LK = kh.shape[1:3]
    sm_scale = _check_scale(sm_scale, D)
    if sm_scale < 0:
        # Q·Kᵀ·s = (-Q)·Kᵀ·|s|: the kernels' scales stay positive, as their integer row max needs.
        qh, sm_scale = -qh, -sm_scale

    out = oh = None
    if not defer_out:
        out = torch.empty(_out_shape(B, H, LQ, D, out_layout), dtype=q.dtype, device=q.device)
        oh = _as_bhld(out, out_layout)  # the kernels write through strides: either layout costs the same
    lse = torch.empty((B, H, LQ) if return_lse else (0,), dtype=torch.float32, device=q.device)
    # The Gluon kernel's workspace is allocated here, before the quantization launches, so that no fill
    # runs between them and the kernel (with ``pdl`` each launch may start as the one before it ends).
    shared_kv = None
    if LQ and uses_long_sequence_kernel(cfg, LQ, D, attn_mask is not None, is_causal, return_lse) and not (
            return_lse and _shared_kv_lse_error is not None):
        shared_kv = _shared_kv_plan(B * H, LQ, LK, q.device)
    return _CallPlan(qh, kh, vh, out, oh, lse, (B, H, H_KV, LQ, LK, D), head_dim_padded(D), sm_scale,
                     cfg.group_sizes()[1] == cfg.block_n, cfg.pdl and not interpreter_enabled(), shared_kv,
                     out_layout, q.dtype)


def _allocate_out(plan: _CallPlan) -> None:
    """The output buffer, where ``_plan_call`` deferred it (no fill: nothing is launched)."""
    if plan.out is None:
        B, H, _, LQ, _, D = plan.dims
        plan.out = torch.empty(_out_shape(B, H, LQ, D, plan.out_layout), dtype=plan.dtype, device=plan.lse.device)
        plan.oh = _as_bhld(plan.out, plan.out_layout)


def _quantize(plan: _CallPlan, cfg: KernelConfig, smooth_k: bool, smooth_v: bool, return_lse: bool,
              release: bool = False) -> _Quantized:
    """K/V statistics, then INT8 Q (which finalizes the statistics), INT8 K and the converted V.
    ``release``: the plan holds the only references to the float inputs; each is dropped once its
    launch is queued (the allocator reuses the block only for work queued after it)."""
    qh, kh, vh, d_pad, pdl = plan.qh, plan.kh, plan.vh, plan.d_pad, plan.pdl
    B, H, H_KV, LQ, LK, D = plan.dims
    q_group, k_group = cfg.group_sizes()
    rotate = min(d_pad, ROTATION_BLOCK) if cfg.qk_rotation else 0
    v_stats = _v_stats_needed(cfg, smooth_v)
    method = rotation.method_for(cfg.rotation_tiles, qh.dtype, kh.dtype, D, d_pad) if rotate else "dot"
    parts, n_parts, k_tokens = _kv_stats(kh, vh, smooth_k, v_stats, d_pad, pdl)
    stats = final = None
    if parts is not None:
        # K mean, V scale, V mean (and the tiled rotation's mean·H, ``quant.ROTATED_MEAN_SLOT``)
        final = torch.empty((4 if method == "tiled" else 3, B * H_KV, D),
                            dtype=torch.float32, device=qh.device)
        stats = (parts, n_parts, LK, k_tokens, final)
    # Q first: its launch finalizes the statistics the K and V launches read. Q scales stay per token
    # (a row vector loaded once per program); K scales are one scalar per tile whenever the
    # granularity allows, which saves a multiply per logit in the inner loop.
    qbias = torch.empty((B * H, LQ), dtype=torch.float32, device=qh.device) if (smooth_k and return_lse) else None
    # Rotating Q: 128 rows per program, the signs' load shared by more rows (scales stay per token).
    q_block = rotation.q_rows(method, cfg.block_m) if rotate else cfg.block_m
    q8, qs = _quantize_qk(qh, q_group, q_block, d_pad, plan.sm_scale * quant.LOG2E,
                          quant.MEAN_DOT if qbias is not None else quant.MEAN_NONE, stats, H // H_KV,
                          bias=qbias, bias_mult=plan.sm_scale,
                          finalize=(smooth_k, v_stats, *_v_range(cfg)) if stats is not None else None,
                          pdl=pdl, after=parts is not None, rotate=rotate, method=method)
    if stats is not None:
        # The Q launch has reduced the partials into ``final``, which every later launch reads. Freed
        # now, they are not part of the call's peak: the allocator hands the block only to work queued
        # after that launch, and with ``pdl`` those launches store nothing before it has ended.
        stats = (final, 0, LK, k_tokens, final)
        del parts
    if release:
        qh = plan.qh = None
    k8, ks = _quantize_qk(kh, k_group, cfg.block_n, d_pad, 1.0, quant.MEAN_SUBTRACT if smooth_k else quant.MEAN_NONE,
                          stats, per_block=plan.k_scalar, pdl=pdl, rotate=rotate, method=method)
    if release:
        kh = plan.kh = None
    v_op, v_strides, v_scale, v_mean, pv_mode, p_scale, tile_bias = _prepare_v(vh, cfg, smooth_v, d_pad, final, pdl)
    if release and v_op is not vh:  # a converted copy: the kernel never reads the float V
        vh = plan.vh = None
    return _Quantized(q8, qs, qbias, k8, ks, v_op, v_strides, v_scale, v_mean, pv_mode, p_scale, tile_bias)


def _launch_attention(plan: _CallPlan, qz: _Quantized, cfg: KernelConfig, is_causal: bool, attn_mask,
                      return_lse: bool) -> None:
    """The portable attention kernel on the quantized operands."""
    B, H, H_KV, LQ, LK, D = plan.dims
    d_pad, oh, vh = plan.d_pad, plan.oh, plan.vh
    k_desc = v_desc = None
    if cfg.use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k3 = qz.k8.view(B * H_KV, LK, d_pad)
        k_desc = TensorDescriptor(k3, list(k3.shape), list(k3.stride()), [1, cfg.block_n, d_pad])
        if qz.v_op is not vh:  # our own converted buffer: contiguous rows, 16-byte aligned
            block = [1, d_pad, cfg.block_n] if qz.pv_mode in (attn.PV_FP8, attn.PV_INT8) else [1, cfg.block_n, d_pad]
            v_desc = TensorDescriptor(qz.v_op, list(qz.v_op.shape), list(qz.v_op.stride()), block)

    mask, mask_kind = _prepare_mask(attn_mask, B, H, LQ, LK)
    plan.mask_view = mask
    dummy = qz.qs
    mask_arg = mask if mask is not None else dummy
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    grid = (_cdiv(LQ, cfg.block_m), B * H)
    _launch(attn.attention_kernel, grid, (
        qz.q8, qz.qs, qz.k8, qz.ks, qz.v_op,
        qz.v_scale if qz.v_scale is not None else dummy, qz.v_mean if qz.v_mean is not None else dummy,
        qz.qbias if qz.qbias is not None else dummy, qz.v_tile_bias if qz.v_tile_bias is not None else qz.k8,
        oh, plan.lse, mask_arg, k_desc if k_desc is not None else qz.k8, v_desc if v_desc is not None else qz.k8,
        *qz.v_strides, *oh.stride(), *mask_strides,
        H, H_KV, LQ, LK, D,
    ), dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_PAD=d_pad,
        IS_CAUSAL=is_causal, MASK_KIND=mask_kind, PV_MODE=qz.pv_mode, P_LOG2=math.log2(qz.p_scale),
        HAS_VSCALE=qz.v_scale is not None, HAS_VMEAN=qz.v_mean is not None, HAS_QBIAS=qz.qbias is not None,
        K_SCALAR=plan.k_scalar, RETURN_LSE=return_lse, EVEN_D=(D == d_pad) or (qz.v_op is not vh),
        INTERPRETER=interpreter_enabled(), K_TMA=k_desc is not None, V_TMA=v_desc is not None,
        V_T=qz.pv_mode in (attn.PV_FP8, attn.PV_INT8), V_RES=qz.pv_mode == attn.PV_FP8 and cfg.v_residual, PDL=plan.pdl,
    ), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_pdl_launch(plan.pdl),
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}))


_shared_kv_error: Optional[str] = None  # why the Gluon kernel could not run here (then never tried again)
_shared_kv_lse_error: Optional[str] = None  # the same for its LSE twins alone (calls without the LSE keep it)


def shared_kv_error() -> Optional[str]:
    """None while Hopper's Gluon kernel works (or was never needed), else why it failed in this process."""
    return _shared_kv_error


def _shared_kv_plan(n_heads: int, LQ: int, LK: int, device):
    """(whole CTAs, shares per tail CTA, split CTAs, hand-over flags, row max/sum workspace) of the Gluon
    kernel's split last wave (``tail_split``) for ``n_heads`` = B·H query heads; None where it cannot run."""
    if _shared_kv_error is not None or not hopper_gluon.AVAILABLE or interpreter_enabled():
        return None
    g = hopper_gluon
    ctas_per_head, key_tiles = g.grid(LQ, LK)
    n_cta = ctas_per_head * n_heads
    n_whole, splits = tail_split.plan_tail(n_cta, sm_count(device), key_tiles)
    n_tail = n_cta - n_whole
    # The split shares' hand-over: a ticket counter and a flag per warpgroup of a tail CTA (zeroed),
    # and the rows' max and sum in two buffers.
    turns = (torch.zeros((footprint.split_flags(n_tail, g.CONSUMERS),), dtype=torch.int32, device=device)
             if n_tail else None)
    ml = (torch.empty((footprint.split_workspace_bytes(n_tail, g.CONSUMERS * g.ROWS) // footprint.FP32,),
                      dtype=torch.float32, device=device) if n_tail else None)
    return n_whole, splits, n_tail * splits, turns, ml


def _run_shared_kv(q8, qs, k8, ks, v_t, v_scale, v_mean, v_tile_bias, oh, dims, p_log2: float, v_residual: bool, plan,
                   pdl: bool = False, lse=None, qbias=None) -> bool:
    """Hopper's Gluon kernel on the quantized tensors, split last wave as ``plan`` (``_shared_kv_plan``);
    False (and the portable kernel from then on, logged once) if this Triton cannot build or launch it.
    With ``pdl`` the whole CTAs may start while the V conversion ends (they wait for its output). ``lse``:
    the (B, H, LQ) LSE to write (its kernels' twins), plus ``qbias`` where K was smoothed."""
    global _shared_kv_error, _shared_kv_lse_error
    H, H_KV, LQ, LK, D = dims
    # The kernel tells the compiler its output rows are 16-byte aligned with contiguous channels.
    assert oh.stride(3) == 1 and D % 8 == 0, "the Gluon kernel writes only our own (.., D % 8 == 0) outputs"
    g = hopper_gluon
    n_whole, splits, n_units, turns, ml = plan
    flags = dict(HAS_VSCALE=v_scale is not None, HAS_VMEAN=v_mean is not None)
    v_scale = v_scale if v_scale is not None else qs
    v_mean = v_mean if v_mean is not None else qs
    v_tile_bias = v_tile_bias if v_tile_bias is not None else qs
    args = (*g.descriptors(q8, k8, v_t), qs, ks, v_scale, v_mean, v_tile_bias, oh, *oh.stride()[:3], H, H_KV, LQ, LK, D)
    consts = dict(P_LOG2=p_log2, STAGES=g.STAGES, **flags, REGISTERS=g.REGISTERS, V_RES=v_residual)
    whole, split, lse_args = g.shared_kv_attention_kernel, g.shared_kv_split_kernel, ()
    if lse is not None:
        whole, split, lse_args = hopper_lse.shared_kv_attention_lse_kernel, hopper_lse.shared_kv_split_lse_kernel, (
            lse, qbias if qbias is not None else qs)
        consts["HAS_QBIAS"] = qbias is not None
    try:
        with sm90_ptxas_scope():  # Triton 3.9: built by a CUDA 12 ptxas, as on 3.6-3.8 (triton_compat)
            if n_whole:
                _launch(whole, (n_whole,), (*args, *lse_args), consts, num_warps=4, **_pdl_launch(pdl))
            if n_units:  # launch_pdl: may start while the whole CTAs finish (it reads none of their output)
                split_consts = dict(consts, STAGES=g.SPLIT_RESIDUAL_STAGES) if v_residual else consts
                _launch(split, (n_units,), (*args, n_whole, splits, turns, ml, *lse_args), split_consts,
                        num_warps=4, launch_pdl=bool(n_whole))
    except Exception as e:  # noqa: BLE001 - a compiler error must not break the user's run
        if _launch_hook is not None:  # the cross-compile check must see the error
            raise
        if lse is not None:
            _shared_kv_lse_error = root_cause(e)
            logger.warning("Hopper Gluon kernel with the LSE unavailable with this Triton (%s); the portable kernel "
                           "runs calls that ask for the LSE instead", _shared_kv_lse_error)
            return False
        _shared_kv_error = root_cause(e)
        logger.warning("Hopper Gluon kernel unavailable with this Triton (%s); the portable kernel runs "
                       "every call instead (a few %% slower from 4.6K tokens)", _shared_kv_error)
        return False
    return True


_sm_counts: dict = {}


def sm_count(device) -> int:
    """SMs of ``device`` (the Gluon kernel runs one CTA per SM); 132, an H100/H200's, where there is
    none (cross-compiling on meta tensors). Asked once per device."""
    if device.type != "cuda":
        return 132
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _sm_counts:
        _sm_counts[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _sm_counts[key]


def _attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, is_causal: bool,
                    sm_scale: float, attn_mask: Optional[torch.Tensor], return_lse: bool,
                    qk_quant_gran: str, pv_precision: str, pv_accum_dtype: str, fp8_format: str,
                    block_m: int, block_n: int, num_warps: int, num_stages: int, use_tma: bool,
                    max_registers: int, shared_kv_min_len: int, v_residual: bool, pdl: bool, qk_rotation: bool,
                    rotation_tiles: bool, smooth_k: bool, smooth_v: bool,
                    out_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = KernelConfig(qk_quant_gran, pv_precision, pv_accum_dtype, fp8_format or None,
                       block_m, block_n, num_warps, num_stages, use_tma=use_tma, max_registers=max_registers,
                       shared_kv_min_len=shared_kv_min_len, v_residual=v_residual, pdl=pdl, qk_rotation=qk_rotation,
                       rotation_tiles=rotation_tiles)
    check_config(cfg)
    return _run([q, k, v], layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
                release=False, in_op=True)


def _attention_fake(q, k, v, layout, is_causal, sm_scale, attn_mask, return_lse, qk_quant_gran, pv_precision,
                    pv_accum_dtype, fp8_format, block_m, block_n, num_warps, num_stages, use_tma, max_registers,
                    shared_kv_min_len, v_residual, pdl, qk_rotation, rotation_tiles, smooth_k, smooth_v, out_layout):
    B, D = q.shape[0], q.shape[3]
    H, LQ = (q.shape[1], q.shape[2]) if layout == "HND" else (q.shape[2], q.shape[1])
    lse_shape = (B, H, LQ) if return_lse else (0,)
    return q.new_empty(_out_shape(B, H, LQ, D, out_layout)), q.new_empty(lse_shape, dtype=torch.float32)


def _register_op():
    # The pack can be imported twice under different module names (ComfyUI names it after its
    # folder); the op is defined once per process and the same code serves both.
    if not hasattr(torch.ops.sagetriton, "attention"):
        op = torch.library.custom_op("sagetriton::attention", _attention_impl, mutates_args=())
        op.register_fake(_attention_fake)
    return torch.ops.sagetriton.attention


attention_op = _register_op()


@functools.lru_cache(maxsize=256)
def _resolved_config(arch, head_dim: int, qk_quant_gran, pv_precision, pv_accum_dtype,
                     qk_rotation=None) -> KernelConfig:
    """The config for one (GPU, head size, options): resolved once, its downgrade notes logged once."""
    cfg, notes = resolve_config(arch, head_dim, qk_quant_gran, pv_precision, pv_accum_dtype, qk_rotation)
    for note in notes:
        _warn_once(note)
    return cfg


def sageattn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_layout: str = "HND",
             is_causal: bool = False, sm_scale: Optional[float] = None,
             attn_mask: Optional[torch.Tensor] = None, return_lse: bool = False, *,
             qk_quant_gran: Optional[str] = None, pv_precision: Optional[str] = None,
             pv_accum_dtype: Optional[str] = None, smooth_k: bool = True, smooth_v: bool = False,
             out_layout: Optional[str] = None, config: Optional[KernelConfig] = None,
             qk_rotation: Optional[bool] = None):
    """Quantized scaled-dot-product attention.

    q: (B, Hq, Lq, D) for ``tensor_layout="HND"`` or (B, Lq, Hq, D) for ``"NHD"``; k, v likewise
    with Hkv heads (Hq a multiple of Hkv) and Lk tokens. fp16/bf16 in, same dtype out; fp32 inputs
    are quantized straight from fp32, P·V runs in bf16, and the output is fp32. ``attn_mask`` is a
    boolean (True = attend) or additive float mask broadcastable to (B, Hq, Lq, Lk), with torch SDPA
    semantics. Options left as ``None`` take this GPU's defaults (``kernels.arch``). ``out_layout``
    ("HND" or "NHD", default ``tensor_layout``): the output is written in that layout directly, so a
    caller that wants the other one (ComfyUI's (B, L, H·D) from (B, H, L, D) inputs) needs no
    transposing copy. ``config``: a config the caller already resolved (the nodes' dispatcher, with
    its downgrades, install self-test results and arch override); it is run as given, and the option
    names must then be left as ``None``. ``qk_rotation``: multiply Q and K by a block Hadamard matrix
    before INT8 rounding (exact for Q·Kᵀ; spreads outlier channels); ``None``: this GPU's default (on).

    Returns ``out`` or, with ``return_lse``, ``(out, lse)`` where lse is the natural-log
    log-sum-exp per (B, Hq, Lq) in fp32.
    """
    _check_inputs(q, k, v, tensor_layout, attn_mask, is_causal)
    for name, opt in (("qk_quant_gran", qk_quant_gran), ("pv_precision", pv_precision),
                      ("pv_accum_dtype", pv_accum_dtype)):
        if opt is not None and not isinstance(opt, str):
            raise TypeError(f"{name} must be a string or None, got {type(opt).__name__} {opt!r}")
    if qk_rotation is not None and not isinstance(qk_rotation, bool):
        raise TypeError(f"qk_rotation must be True, False or None, got {type(qk_rotation).__name__} {qk_rotation!r}")
    B, H = q.shape[0], q.shape[1 if tensor_layout == "HND" else 2]
    if B * H > GRID_Y_LIMIT:  # every launch has B·H programs on grid y (65,535 at most on CUDA): split the batch
        if H > GRID_Y_LIMIT:
            raise ValueError(f"H = {H} query heads exceed {GRID_Y_LIMIT} (the GPU's grid limit); split the heads")
        step = GRID_Y_LIMIT // H
        parts = [sageattn(q[i:i + step], k[i:i + step], v[i:i + step], tensor_layout, is_causal, sm_scale,
                          attn_mask[i:i + step] if attn_mask is not None and attn_mask.dim() == 4
                          and attn_mask.shape[0] == B else attn_mask, return_lse, qk_quant_gran=qk_quant_gran,
                          pv_precision=pv_precision, pv_accum_dtype=pv_accum_dtype, smooth_k=smooth_k,
                          smooth_v=smooth_v, out_layout=out_layout, config=config, qk_rotation=qk_rotation)
                 for i in range(0, B, step)]
        if not return_lse:
            return torch.cat(parts)
        return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])
    if config is None:
        cfg = _resolved_config(arch_for_device(q.device), q.shape[-1], qk_quant_gran, pv_precision, pv_accum_dtype,
                               qk_rotation)
    elif qk_quant_gran is None and pv_precision is None and pv_accum_dtype is None and qk_rotation is None:
        cfg = check_config(config)
    else:
        raise ValueError("pass either config or qk_quant_gran / pv_precision / pv_accum_dtype / qk_rotation, "
                         "not both")
    sm_scale = _check_scale(sm_scale, q.shape[-1])
    # The custom op is what torch.compile traces (and what refuses autograd); plain eager calls skip
    # its dispatcher layers, host time that short sequences pay on every call.
    # Wrapper subclasses (AsyncCollectiveTensor) too: the op's dispatch waits on and unwraps them.
    if torch.compiler.is_compiling() or q.requires_grad or k.requires_grad or v.requires_grad or \
            wrapped(q, k, v, attn_mask):
        out, lse = attention_op(q, k, v, tensor_layout, bool(is_causal), float(sm_scale), attn_mask,
                                bool(return_lse), *_op_config(cfg), bool(smooth_k), bool(smooth_v),
                                out_layout or tensor_layout)
    else:
        out, lse = attention_forward(q, k, v, tensor_layout, bool(is_causal), sm_scale, attn_mask,
                                     bool(return_lse), cfg, bool(smooth_k), bool(smooth_v), out_layout)
    return (out, lse) if return_lse else out
