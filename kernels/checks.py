"""``sageattn``'s argument checks: named errors for a caller's mistakes before any arithmetic or launch,
and the layout views they share with the host pipeline (``host``)."""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from . import attention as attn
from . import launch, quant
from .arch import FP8_MAX, PV_ACCUM_DTYPES, QK_QUANT_GRANS, KernelConfig, interpreter_enabled

GRID_Y_LIMIT = 65535  # CUDA's largest grid y (and z); B·H programs go there


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
    if q.device.type == "cpu" and not interpreter_enabled() and launch.hook is None:
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



def _out_shape(B: int, H: int, LQ: int, D: int, out_layout: str) -> tuple:
    return (B, H, LQ, D) if out_layout == "HND" else (B, LQ, H, D)

