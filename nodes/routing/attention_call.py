"""One attention call as ComfyUI's backends get it: bound to names, its shapes worked out, checked for
what the kernel cannot take whatever the GPU and settings (``call_fallback_reason``), and turned into the
kernel's strided views and back into ComfyUI's output layout. Plain functions, no state."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ...kernels.arch import interpreter_enabled
from ..reporting.reasons import Reason
from . import call_cache

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
# kwargs ComfyUI adds that do not change what attention computes.
PASSIVE_KWARGS = call_cache.PASSIVE_KWARGS
# kwargs we understand: scale -> sm_scale, enable_gqa (kernel does GQA), low_precision_attention.
HANDLED_KWARGS = frozenset({"scale", "enable_gqa", "low_precision_attention"})
# A caller's arguments: the call goes where ComfyUI's attention takes it, nothing is turned off.
BAD_SCALE = Reason.BAD_SCALE
EMPTY_CALL = Reason.EMPTY_CALL
# Autograd through the kernel: it has no backward, ComfyUI's attention has (LoRA training, gradient guidance).
NEEDS_GRAD = Reason.NEEDS_GRAD


def _bind_backend_arguments(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                            skip_output_reshape=False, **kwargs):
    """ComfyUI's attention backend signature (comfy/ldm/modules/attention.py): Python binds for us."""
    return q, k, v, heads, mask, attn_precision, skip_reshape, skip_output_reshape, kwargs


@dataclass
class AttentionCall:
    """One attention call, bound to names, with head counts and lengths worked out."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    heads: int
    mask: Optional[torch.Tensor]
    attn_precision: Any
    skip_reshape: bool
    skip_output_reshape: bool
    extra: dict = field(default_factory=dict)  # every other keyword
    batch: int = 0
    head_dim: int = 0
    kv_heads: int = 0
    q_len: int = 0
    k_len: int = 0
    v_head_dim: int = 0

    @property
    def transformer_options(self) -> dict:
        return self.extra.get("transformer_options") or {}

    @property
    def semantic_kwargs(self) -> dict:
        return {k: v for k, v in self.extra.items() if k not in PASSIVE_KWARGS}


def bind_call(args: tuple, kwargs: dict) -> AttentionCall:
    """Bind positional/keyword arguments the way ComfyUI's backends do; raise TypeError if they don't fit."""
    q, k, v, heads, mask, attn_precision, skip_reshape, skip_output_reshape, extra = \
        _bind_backend_arguments(*args, **kwargs)
    call = AttentionCall(q, k, v, int(heads), mask, attn_precision, bool(skip_reshape), bool(skip_output_reshape),
                         extra)
    if call.heads < 1:
        raise ValueError(f"heads is {call.heads}, not >= 1")
    q, k, v = call.q, call.k, call.v
    if call.skip_reshape:  # (B, H, L, D)
        call.batch, _, call.q_len, call.head_dim = q.shape
        call.kv_heads, call.k_len = k.shape[1], k.shape[2]
        call.v_head_dim = v.shape[-1]
    else:  # q (B, L, H*D); k and v (B, L, H*D) or already (B, L, H, D) (SD3 passes v that way)
        call.batch, call.q_len, width = q.shape
        call.head_dim = width // call.heads
        call.k_len = k.shape[1]
        call.kv_heads = k.shape[2] if k.ndim == 4 else k.shape[-1] // max(1, call.head_dim)
        call.v_head_dim = v.shape[-1] if v.ndim == 4 else v.shape[-1] // max(1, call.kv_heads)
    return call


def kernel_inputs(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """q, k, v as strided views for the kernel, and their layout ("HND" or "NHD"); no copies."""
    if call.skip_reshape:
        return call.q, call.k, call.v, "HND"
    return (_split_heads(call.q, call.heads), _split_heads(call.k, call.kv_heads), _split_heads(call.v, call.kv_heads),
            "NHD")


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, H*D) -> (B, L, H, D) as a view; 4-D tensors are already split."""
    # view(), not unflatten(): the same view without unflatten's Python wrapper, on every kernel call
    return t if t.ndim == 4 else t.view(t.shape[0], t.shape[1], heads, t.shape[2] // heads)


def hnd_inputs(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (B, H, L, D) views (what torch SDPA takes)."""
    q, k, v, layout = kernel_inputs(call)
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return q, k, v


def comfy_output(out: torch.Tensor, layout: str, call: AttentionCall) -> torch.Tensor:
    """Kernel/SDPA output in ``layout`` -> what ComfyUI's backend would have returned."""
    if layout == "NHD":  # (B, Lq, H, D)
        if call.skip_output_reshape:
            return out.transpose(1, 2)
        return out.reshape(call.batch, call.q_len, -1)
    if call.skip_output_reshape:  # (B, H, Lq, D)
        return out
    return out.transpose(1, 2).reshape(call.batch, call.q_len, -1)


def normalize_mask(call: AttentionCall) -> tuple[Optional[torch.Tensor], Optional[str]]:
    """ComfyUI's mask as a 4-D tensor broadcastable to (B, H, Lq, Lk), or a fallback reason.

    Backends add a batch dimension to 2-D masks and a heads dimension to 3-D masks.
    """
    mask = call.mask
    if mask is None:
        return None, None
    if not isinstance(mask, torch.Tensor):
        return None, Reason.MASK_NOT_TENSOR
    if mask.dtype.is_complex:
        return None, Reason.MASK_DTYPE.of(str(mask.dtype).replace('torch.', ''))
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        # An integer mask (Lumina 2's raw caption mask on ComfyUI 0.3.75) is a bias added to the scores,
        # as ComfyUI's own backends add it and as SDPA treats a float mask: the same values as q's dtype.
        mask = mask.to(call.q.dtype)
    if mask.ndim == 2:
        mask = mask.unsqueeze(0)
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    if mask.ndim != 4:
        return None, Reason.MASK_RANK.of(call.mask.ndim)
    for have, want in zip(mask.shape, (call.batch, call.heads, call.q_len, call.k_len), strict=True):
        if have not in (1, want):
            return None, Reason.MASK_SHAPE
    if mask.device != call.q.device:
        return None, Reason.MASK_DEVICE
    return mask, None


def device_supported(device: torch.device) -> bool:
    """CUDA and ROCm GPUs; CPU only in the Triton-interpreter test mode."""
    return device.type == "cuda" or (device.type == "cpu" and interpreter_enabled())


def call_fallback_reason(call: AttentionCall) -> Optional[str]:
    """Why the kernel cannot take this call whatever the GPU and settings; None when it can."""
    extra = call.semantic_kwargs
    if extra.get("low_precision_attention", True) is False:
        return Reason.LOW_PRECISION_OFF
    unknown = sorted(set(extra) - HANDLED_KWARGS)
    if unknown:
        return Reason.UNSUPPORTED_ARGUMENT.of(unknown[0])
    q, k, v = call.q, call.k, call.v
    if not device_supported(q.device):
        return Reason.NOT_A_GPU.of(q.device.type)
    if q.dtype not in KERNEL_DTYPES:
        return Reason.DTYPE.of(str(q.dtype).replace('torch.', ''))
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return Reason.DTYPES_DIFFER
    if call.attn_precision == torch.float32:
        return Reason.FP32_PRECISION
    if not (1 <= call.head_dim <= MAX_HEAD_DIM):
        return Reason.HEAD_DIM.of(call.head_dim, MAX_HEAD_DIM)
    if call.batch == 0 or call.q_len == 0 or call.k_len == 0:
        return EMPTY_CALL
    if not _finite_scale(extra.get("scale")):
        return BAD_SCALE
    problem = _shape_problem(call)
    if problem is not None:
        return problem
    if call.kv_heads < 1 or call.heads % call.kv_heads:
        return Reason.HEADS_NOT_MULTIPLE
    if call.v_head_dim != call.head_dim:
        return Reason.V_HEAD_SIZE
    return normalize_mask(call)[1]


def _finite_scale(scale) -> bool:
    """Whether the kernel takes ``scale`` (``kernels.checks._check_scale``'s rule): None or a finite real number."""
    if scale is None:
        return True
    return not isinstance(scale, bool) and isinstance(scale, numbers.Real) and math.isfinite(scale)


def _shape_problem(call: AttentionCall) -> Optional[str]:
    """A caller's malformed shapes (the kernel would fail on them, which is not a kernel fault), or None."""
    q, k, v = call.q, call.k, call.v
    if call.skip_reshape:
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            return Reason.NOT_BHLD
        k_len_v = v.shape[2]
    else:
        if q.shape[-1] != call.heads * call.head_dim:
            return Reason.Q_WIDTH
        if (k.ndim == 3 and k.shape[-1] != call.kv_heads * call.head_dim) or (
                v.ndim == 3 and v.shape[-1] != call.kv_heads * call.v_head_dim):
            return Reason.KV_WIDTH
        if k.ndim not in (3, 4) or v.ndim not in (3, 4):
            return Reason.KV_RANK
        k_len_v = v.shape[1]
    if k.shape[0] != call.batch or v.shape[0] != call.batch:
        return Reason.BATCHES_DIFFER
    if k.device != q.device or v.device != q.device:
        return Reason.DEVICES_DIFFER
    if k_len_v != call.k_len:
        return Reason.KV_LENGTHS_DIFFER
    return None



def needs_grad(args: tuple) -> bool:
    """Whether q, k or v (tensors or containers) takes part in autograd: the kernel has no backward."""
    for t in args[:3]:
        if not isinstance(t, torch.Tensor):
            peek = getattr(t, "peek", None)
            t = peek() if callable(peek) else None
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def caller_error(call: AttentionCall, mask) -> Optional[str]:
    """What ``sageattn`` refuses in this call's arguments before any launch (the caller's mistake), or None."""
    from ...kernels.api import argument_error

    q, k, v, layout = kernel_inputs(call)
    error = argument_error(q, k, v, layout, sm_scale=call.extra.get("scale"), attn_mask=mask)
    return None if error is None else f"{type(error).__name__}: {error}"

