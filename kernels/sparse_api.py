"""``sparse_attn``: training-free block-sparse self-attention for long sequences (long video).

Host side only: the contract (validation, with errors that name the argument), then the launches.
The method, defined once, is ``sparse_reference``'s module docstring.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from . import custom_op
from .arch import KernelConfig, interpreter_enabled
from .devices import device_scope, wrapped
from .sparse_reference import BLOCK, EXTRA_MAX

__all__ = ["sparse_attn", "check_sparse_args"]


def _check_pair(name: str, value) -> Optional[tuple[int, int]]:
    if value is None:
        return None
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name} must be None or a [start, end) pair of block indices, got {value!r}") from None
    if len(items) != 2 or any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in items):
        raise ValueError(f"{name} must be a [start, end) pair of integer block indices, got {value!r}")
    start, end = int(items[0]), int(items[1])
    if start < 0 or end < start:
        raise ValueError(f"{name} must be [start, end) with 0 <= start <= end (64-token blocks), got {value!r}")
    return start, end


def check_sparse_args(q, k, v, tau, tensor_layout, scale, sink_blocks, sink_q, topk_ratio, extra_tokens,
                      out_layout) -> tuple:
    """Validate a ``sparse_attn`` call; returns ``(scale, sink_blocks, sink_q, topk_ratio, out_layout)``
    normalised (scale a float, sinks ``(start, end)`` or None, topk_ratio a float or None)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"tensor_layout must be 'NHD' (B, L, H, D) or 'HND' (B, H, L, D), got {tensor_layout!r}")
    out_layout = tensor_layout if out_layout is None else out_layout
    if out_layout not in ("HND", "NHD"):
        raise ValueError(f"out_layout must be 'NHD' or 'HND', got {out_layout!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k and v must be 4-D tensors")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"sparse_attn takes float16, bfloat16 or float32 inputs, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on one device")
    hd, ld = (1, 2) if tensor_layout == "HND" else (2, 1)
    B, H, L, D = q.shape[0], q.shape[hd], q.shape[ld], q.shape[3]
    H_KV = k.shape[hd]
    if k.shape[0] != B or v.shape[0] != B or v.shape[hd] != H_KV:
        raise ValueError(f"batch or key/value heads differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[ld] != L or v.shape[ld] != L:
        raise ValueError(f"sparse_attn is self-attention: q, k and v need one length, got {L}, {k.shape[ld]}, "
                         f"{v.shape[ld]} (run the dense kernel for cross-attention)")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"q, k and v must share head_dim, got {D}, {k.shape[3]}, {v.shape[3]}")
    if not 1 <= D <= 256:
        raise ValueError(f"head_dim must be in 1..256, got {D}")
    if H == 0 or H_KV == 0 or H % H_KV:
        raise ValueError(f"query heads ({H}) must be a positive multiple of key/value heads ({H_KV})")
    if L == 0:
        raise ValueError("the sequence is empty (length 0)")
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(float(tau)):
        raise ValueError(f"tau must be a finite number (standard deviations above the proxy row's mean), got {tau!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite number or None (1/sqrt(head_dim)), got {scale!r}")
    if topk_ratio is not None:
        if isinstance(topk_ratio, bool) or not isinstance(topk_ratio, numbers.Real):
            raise ValueError(f"topk_ratio must be None, 0 or a number in (0, 1), got {topk_ratio!r}")
        if float(topk_ratio) == 0.0:
            topk_ratio = None  # 0 means the tau threshold, as comfy-kitchen's
        elif not 0.0 < float(topk_ratio) < 1.0:
            raise ValueError(f"topk_ratio must be None, 0 or a number in (0, 1), got {topk_ratio!r}")
        else:
            topk_ratio = float(topk_ratio)
    if (isinstance(extra_tokens, bool) or not isinstance(extra_tokens, numbers.Integral)
            or not 0 <= extra_tokens <= EXTRA_MAX or extra_tokens % BLOCK):
        raise ValueError(f"extra_tokens must be 0 or a multiple of {BLOCK} up to {EXTRA_MAX}, got {extra_tokens!r}")
    sinks = _check_pair("sink_blocks", sink_blocks)
    sinks_q = _check_pair("sink_q", sink_q)
    if q.device.type == "cpu" and not interpreter_enabled():
        raise RuntimeError("sparse_attn runs on CUDA/ROCm GPUs; CPU tensors need TRITON_INTERPRET=1 (tests only)")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise RuntimeError("sparse_attn has no backward pass (inference only): call it under torch.no_grad()")
    return float(scale), sinks, sinks_q, topk_ratio, out_layout


def sparse_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: float = 1.3, *, tensor_layout: str = "NHD",
                scale: Optional[float] = None, sink_blocks=None, sink_q=None, topk_ratio: Optional[float] = None,
                extra_tokens: int = 0, return_lse: bool = False, return_density: bool = False,
                out_layout: Optional[str] = None, config: Optional[KernelConfig] = None):
    """Block-sparse self-attention (Sol-Attn's method, training-free): each 64-token query block attends
    the key blocks its pooled proxy scores route to it exactly, on the pack's quantized path (INT8 Q·Kᵀ
    with K smoothing and the rotation, FP8/INT8 P·V); every other key block adds one pooled term
    (its mean key, summed V, weight = its length) to the same softmax. The method in full:
    ``kernels.sparse_reference``.

    q, k, v: (B, L, H, D) for ``tensor_layout="NHD"`` (default, ComfyUI's) or (B, H, L, D) for "HND";
    k and v with H_KV heads (H a multiple of H_KV: GQA), the same length L as q (self-attention),
    head_dim D in 1..256 (the kernels pad to a power of two; 64-256 is where sparse pays). float16,
    bfloat16 or float32 (quantized straight from fp32; the output is then fp32). Any strides with a
    contiguous last dim work without copies (fused-QKV views); any L >= 1 (no multiple of 64
    needed; one block and shorter is just dense attention).
    tau: routing threshold in standard deviations of the proxy row; higher is sparser (1.0: ~16 %
    of the key blocks exact on video models, 1.5: ~7 %).
    scale: logit scale, None: 1/sqrt(D). Finite, either sign.
    sink_blocks: ``[start, end)`` key blocks every query attends exactly (conditioning tokens).
    sink_q: ``[start, end)`` query blocks that attend every key exactly. Both in 64-token blocks,
    clipped to the sequence (a range past its end is empty).
    topk_ratio: None (or 0): the tau threshold. In (0, 1): each query block keeps that fraction of the
    non-sink key blocks (ties at the boundary kept), plus the always-exact ones; tau is ignored.
    extra_tokens: 0, 64, 128, 192 or 256: per query block, up to that many single tokens outside its
    exact blocks, the ones its centroid scores highest, are attended exactly too, and the rest of the
    tail is scored per token by the centroid instead of pooled per block (comfy-kitchen's
    ``token_aug``). Defined in ``sparse_reference``; run by ``sparse_extra`` around the attention kernel.
    return_lse: also return the natural-log log-sum-exp (B, H, L) fp32 of each row's softmax
    denominator (pooled terms included), in the frame of the logits ``q·k·scale``.
    return_density: also return the fraction of (query block, key block) pairs attended exactly, over
    batch and heads, as a 0-dim float32 tensor on q's device (no host sync; ``.item()`` it).
    out_layout: "NHD" or "HND" for the output (default ``tensor_layout``), written directly.
    config: a ``KernelConfig`` the caller resolved (its P·V precision, rotation and arch choice);
    None: this GPU's defaults, with INT8 P·V on Hopper (where it matches comfy-kitchen's error; FP8 is
    about 25 % faster and less accurate on concentrated attention).

    Returns ``out`` (B, L, H, D) or (B, H, L, D) per ``out_layout``, q's dtype; then ``lse`` and
    ``density`` when asked for, in that order, as a tuple. Under ``torch.compile`` the call is the custom op
    ``sagetriton::sparse_attention`` (no graph break).

    Refuses, before any GPU work: non-tensors (TypeError), dtypes other than fp16/bf16/fp32 or mixed
    (TypeError), other than 4-D, different lengths (cross-attention), batches, head dims or a head
    count that is not a multiple of the key heads, head_dim outside 1..256, an empty sequence, a
    non-finite or non-numeric ``tau`` or ``scale``, ``topk_ratio`` outside {None, 0} ∪ (0, 1),
    ``extra_tokens`` not in {0, 64, ..., 256}, sinks that are not ``[start, end)`` pairs with
    0 <= start <= end, a bad layout name (all ValueError); CPU tensors without TRITON_INTERPRET=1,
    inputs that require grad with grad enabled (RuntimeError).
    """
    scale, sinks, sinks_q, topk_ratio, out_layout = check_sparse_args(
        q, k, v, tau, tensor_layout, scale, sink_blocks, sink_q, topk_ratio, extra_tokens, out_layout)
    if torch.compiler.is_compiling() or wrapped(q, k, v):
        # torch.compile traces the custom op (fake shapes below), as ``api.sageattn``'s dense one; wrapper
        # subclasses (AsyncCollectiveTensor) too: the op's dispatch waits on and unwraps them.
        from .sparse_launch import default_config

        cfg = config if config is not None else default_config(q.device, q.shape[-1])
        out, lse, density = sparse_op(q, k, v, float(tau), tensor_layout, scale, list(sinks or ()),
                                         list(sinks_q or ()), float(topk_ratio or 0.0), int(extra_tokens),
                                         bool(return_lse), out_layout, *_cfg_fields(cfg))  # checked in the op
        res = (out,) + ((lse,) if return_lse else ()) + ((density,) if return_density else ())
        return res[0] if len(res) == 1 else res
    from . import sparse_launch

    with device_scope(q.device):  # every launch and allocation on the inputs' device (``devices``)
        return sparse_launch.run(q, k, v, float(tau), tensor_layout, scale, sinks, sinks_q, topk_ratio,
                                 int(extra_tokens), bool(return_lse), bool(return_density), out_layout, config)


_CFG_FIELDS = ("qk_quant_gran", "pv_precision", "pv_accum_dtype", "fp8_format", "block_m", "block_n", "num_warps",
               "num_stages", "use_tma", "max_registers", "shared_kv_min_len", "v_residual", "pdl", "qk_rotation",
               "rotation_tiles")


def _cfg_fields(cfg: KernelConfig) -> list:
    return [getattr(cfg, f) if f != "fp8_format" else (cfg.fp8_format or "") for f in _CFG_FIELDS]


def _sparse_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: float, layout: str, scale: float,
                 sinks: list[int], sinks_q: list[int], topk_ratio: float, extra_tokens: int, return_lse: bool,
                 out_layout: str, qk_quant_gran: str, pv_precision: str, pv_accum_dtype: str, fp8_format: str,
                 block_m: int, block_n: int, num_warps: int, num_stages: int, use_tma: bool, max_registers: int,
                 shared_kv_min_len: int, v_residual: bool, pdl: bool, qk_rotation: bool,
                 rotation_tiles: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from . import sparse_launch

    if wrapped(q, k, v):
        kind = type(next(t for t in (q, k, v) if wrapped(t))).__name__
        raise TypeError(f"sparse_attn cannot read a {kind} by pointer and its dispatch did not unwrap it: "
                        "pass plain tensors")
    cfg = KernelConfig(qk_quant_gran, pv_precision, pv_accum_dtype, fp8_format or None, block_m, block_n, num_warps,
                       num_stages, use_tma=use_tma, max_registers=max_registers, shared_kv_min_len=shared_kv_min_len,
                       v_residual=v_residual, pdl=pdl, qk_rotation=qk_rotation, rotation_tiles=rotation_tiles)
    with device_scope(q.device):
        out, lse, density = sparse_launch.run(q, k, v, tau, layout, scale, tuple(sinks) or None,
                                              tuple(sinks_q) or None, topk_ratio or None, extra_tokens, True, True,
                                              out_layout, cfg)
    return out, lse if return_lse else lse.new_empty((0,)), density


def _sparse_fake(q, k, v, tau, layout, scale, sinks, sinks_q, topk_ratio, extra_tokens, return_lse, out_layout,
                 *cfg_fields):
    hd, ld = (1, 2) if layout == "HND" else (2, 1)
    B, H, L, D = q.shape[0], q.shape[hd], q.shape[ld], q.shape[3]
    shape = (B, H, L, D) if out_layout == "HND" else (B, L, H, D)
    lse = q.new_empty((B, H, L) if return_lse else (0,), dtype=torch.float32)
    return q.new_empty(shape), lse, q.new_empty((), dtype=torch.float32)


sparse_op = custom_op.register_once("sparse_attention", _sparse_impl, _sparse_fake)
