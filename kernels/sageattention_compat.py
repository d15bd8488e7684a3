"""The ``sageattention`` package's six functions, served by this library's kernels.

What the drop-in distribution (``installer/dropin.py``, ``install.py --provide-sageattention``) exports,
for code that imports SageAttention by name: ComfyUI core's ``--use-sage-attention``, other node packs,
diffusers' attention dispatcher, xDiT/xFuser and yunchang's Ulysses/ring attention (docs/SAGEATTENTION.md).

Each function takes SageAttention 2.x's parameters in its order with its defaults, and returns what it
returns: the output in the input's layout, and with ``return_lse`` the natural-log log-sum-exp of the
unsmoothed, scaled logits as (B, H_q, L_q) fp32 (ring attention merges partial results with it).
Where SageAttention quietly ignores an argument, these do not:

- ``attn_mask`` (ComfyUI passes it to ``sageattn``) is applied, by every name;
- flash-attn's keywords, which sequence-parallel engines pass along, are mapped (``softmax_scale`` →
  ``sm_scale``, ``causal`` → ``is_causal``) or, where they would change the result and the kernel
  cannot honour them (dropout, a sliding window, softcap, ALiBi, returned probabilities), refused
  with a ValueError naming the keyword;
- other unknown keywords are accepted and ignored, as SageAttention does.

The named variants choose the P·V precision and accumulator as their names say; the GPU's own
limits then apply (``arch.resolve_config``: fp8 on a GPU without fp8 runs fp16, logged once), so
every name runs on every GPU the kernels do, AMD included.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import api
from .log import logger

__version__ = "2.2.0"  # the SageAttention API these functions follow (diffusers wants >= 2.1.1)

# flash-attn's keywords that change the result unless left at their defaults, and what they ask for.
_REFUSED = {"dropout_p": "dropout (inference kernels: pass dropout_p=0)",
            "window_size": "a sliding window (pass window_size=(-1, -1))",
            "softcap": "logit softcapping (pass softcap=0)",
            "alibi_slopes": "ALiBi biases (pass alibi_slopes=None, or add them as attn_mask)",
            "return_softmax": "returning the attention probabilities",
            "return_attn_probs": "returning the attention probabilities"}
# Upstream's pv_accum_dtype spellings per variant -> this library's accumulator for that P·V.
_FP16_ACCUM = {"fp32": "fp32", "fp16": "fp16", "fp16+fp32": "fp16+fp32"}
_FP8_ACCUM = {"fp32": "fp32", "fp32+fp32": "fp32", "fp32+fp16": "fp32"}  # fp8 P·V always sums in fp32 here
_GRANS = ("per_warp", "per_thread")
_ignored_seen: set = set()


def _neutral(name: str, value) -> bool:
    """Whether flash-attn keyword ``name`` is at its default (asks for nothing the kernel lacks)."""
    if value is None:
        return True
    if name in ("dropout_p", "softcap"):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
    if name == "window_size":
        return isinstance(value, (list, tuple)) and tuple(value) == (-1, -1)
    if name in ("return_softmax", "return_attn_probs"):
        return value is False
    return False  # alibi_slopes: any tensor


def _options(fn: str, sm_scale, is_causal, kwargs: dict):
    """(sm_scale, is_causal, attn_mask) after flash-attn's keywords; refuses what the kernel cannot do."""
    for name, what in _REFUSED.items():
        if name in kwargs and not _neutral(name, kwargs[name]):
            raise ValueError(f"{fn}: {name}={kwargs[name]!r} is not supported by SageTriton's sageattention: "
                             f"the kernels do not implement {what}")
    if kwargs.get("softmax_scale") is not None:
        scale = kwargs["softmax_scale"]
        if sm_scale is not None and float(sm_scale) != float(scale):
            raise ValueError(f"{fn}: sm_scale={sm_scale!r} and softmax_scale={scale!r} disagree: pass one")
        sm_scale = scale
    if "causal" in kwargs and kwargs["causal"] is not None:
        causal = kwargs["causal"]
        if not isinstance(causal, bool):
            raise TypeError(f"{fn}: causal must be True or False, got {causal!r}")
        if is_causal and not causal:
            raise ValueError(f"{fn}: is_causal=True and causal=False disagree: pass one")
        is_causal = causal
    unknown = sorted(set(kwargs) - set(_REFUSED) - {"softmax_scale", "causal", "attn_mask", "deterministic"})
    if unknown and (fn, tuple(unknown)) not in _ignored_seen:
        _ignored_seen.add((fn, tuple(unknown)))
        logger.debug("[SageTriton] sageattention.%s ignores %s (as SageAttention does)", fn, ", ".join(unknown))
    return sm_scale, is_causal, kwargs.get("attn_mask")


def _accum(fn: str, value: str, table: dict) -> str:
    if value not in table:
        raise ValueError(f"{fn}: pv_accum_dtype={value!r} is not one of {tuple(table)}")
    return table[value]


def _gran(fn: str, value: str) -> str:
    if value not in _GRANS:
        raise ValueError(f"{fn}: qk_quant_gran must be 'per_warp' or 'per_thread', got {value!r}")
    return value


def _run(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, return_lse, **options):
    return api.sageattn(q, k, v, tensor_layout, bool(is_causal), sm_scale, attn_mask, bool(return_lse), **options)


def sageattn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_layout: str = "HND",
             is_causal: bool = False, sm_scale: Optional[float] = None, return_lse: bool = False,
             attn_mask: Optional[torch.Tensor] = None, **kwargs: Any):
    """Quantized attention with this GPU's fastest settings (as SageAttention's ``sageattn`` picks per GPU).
    q, k, v: (B, H, L, D) for ``tensor_layout="HND"``, (B, L, H, D) for ``"NHD"``; H_q a multiple of
    H_kv. ``attn_mask``: bool (True = attend) or additive, broadcastable to (B, H_q, L_q, L_k).
    Returns the output, or ``(output, lse)`` with ``return_lse``."""
    sm_scale, is_causal, _ = _options("sageattn", sm_scale, is_causal, kwargs)
    return _run(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, return_lse)


def sageattn_qk_int8_pv_fp16_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_layout: str = "HND",
                                    quantization_backend: str = "triton", is_causal: bool = False,
                                    attn_mask: Optional[torch.Tensor] = None, sm_scale: Optional[float] = None,
                                    smooth_k: bool = True, return_lse: bool = False, **kwargs: Any):
    """INT8 Q·Kᵀ with one scale per block of tokens, fp16 P·V with an fp32 accumulator."""
    if quantization_backend not in ("triton", "cuda"):
        raise ValueError(f"sageattn_qk_int8_pv_fp16_triton: quantization_backend must be 'triton' or 'cuda', "
                         f"got {quantization_backend!r}")
    sm_scale, is_causal, _ = _options("sageattn_qk_int8_pv_fp16_triton", sm_scale, is_causal, kwargs)
    return _run(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask, return_lse, qk_quant_gran="per_block",
                pv_precision="fp16", pv_accum_dtype="fp32", smooth_k=bool(smooth_k))


def sageattn_qk_int8_pv_fp16_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_layout: str = "HND",
                                  is_causal: bool = False, qk_quant_gran: str = "per_thread",
                                  sm_scale: Optional[float] = None, pv_accum_dtype: str = "fp32",
                                  smooth_k: bool = True, smooth_v: bool = False, return_lse: bool = False,
                                  **kwargs: Any):
    """INT8 Q·Kᵀ (``per_warp`` or ``per_thread`` scales), fp16 P·V summed in ``pv_accum_dtype``
    ("fp32", "fp16+fp32" or "fp16")."""
    fn = "sageattn_qk_int8_pv_fp16_cuda"
    sm_scale, is_causal, mask = _options(fn, sm_scale, is_causal, kwargs)
    return _run(q, k, v, tensor_layout, is_causal, sm_scale, mask, return_lse, qk_quant_gran=_gran(fn, qk_quant_gran),
                pv_precision="fp16", pv_accum_dtype=_accum(fn, pv_accum_dtype, _FP16_ACCUM), smooth_k=bool(smooth_k),
                smooth_v=bool(smooth_v))


def sageattn_qk_int8_pv_fp8_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_layout: str = "HND",
                                 is_causal: bool = False, qk_quant_gran: str = "per_thread",
                                 sm_scale: Optional[float] = None, pv_accum_dtype: str = "fp32+fp16",
                                 smooth_k: bool = True, smooth_v: bool = False, return_lse: bool = False,
                                 **kwargs: Any):
    """INT8 Q·Kᵀ, fp8 P·V (fp16 on GPUs without fp8). Every ``pv_accum_dtype`` SageAttention takes
    here ("fp32", "fp32+fp32", "fp32+fp16") sums in fp32."""
    fn = "sageattn_qk_int8_pv_fp8_cuda"
    sm_scale, is_causal, mask = _options(fn, sm_scale, is_causal, kwargs)
    _accum(fn, pv_accum_dtype, _FP8_ACCUM)
    return _run(q, k, v, tensor_layout, is_causal, sm_scale, mask, return_lse, qk_quant_gran=_gran(fn, qk_quant_gran),
                pv_precision="fp8", smooth_k=bool(smooth_k), smooth_v=bool(smooth_v))


def sageattn_qk_int8_pv_fp8_cuda_sm90(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_layout: str = "HND",
                                      is_causal: bool = False, qk_quant_gran: str = "per_thread",
                                      sm_scale: Optional[float] = None, pv_accum_dtype: str = "fp32+fp32",
                                      smooth_k: bool = True, return_lse: bool = False, **kwargs: Any):
    """``sageattn_qk_int8_pv_fp8_cuda`` as SageAttention's Hopper build names it (any GPU here)."""
    fn = "sageattn_qk_int8_pv_fp8_cuda_sm90"
    sm_scale, is_causal, mask = _options(fn, sm_scale, is_causal, kwargs)
    _accum(fn, pv_accum_dtype, _FP8_ACCUM)
    return _run(q, k, v, tensor_layout, is_causal, sm_scale, mask, return_lse, qk_quant_gran=_gran(fn, qk_quant_gran),
                pv_precision="fp8", smooth_k=bool(smooth_k))


def _pairs(offsets: list) -> list:
    return list(zip(offsets[:-1], offsets[1:], strict=True))


def _cu_lengths(name: str, cu: torch.Tensor, total: int) -> list:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2 or \
            cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"sageattn_varlen: {name} must be a 1-D int32/int64 tensor of batch + 1 offsets")
    offsets = cu.tolist()
    if offsets[0] != 0 or offsets[-1] != total or any(b < a for a, b in _pairs(offsets)):
        raise ValueError(f"sageattn_varlen: {name} must rise from 0 to the tensor's {total} tokens, got {offsets}")
    return offsets


def sageattn_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, is_causal: bool = False,
                    sm_scale: Optional[float] = None, smooth_k: bool = True, **kwargs: Any) -> torch.Tensor:
    """Attention over packed sequences: q (total_q, H_q, D), k and v (total_k, H_kv, D); sequence i is
    rows ``cu_seqlens[i]:cu_seqlens[i + 1]``. Sequences of equal lengths run as one batch, on the kernel."""
    sm_scale, is_causal, _ = _options("sageattn_varlen", sm_scale, is_causal, kwargs)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"sageattn_varlen: {name} must be a (tokens, heads, head_dim) tensor")
    qo = _cu_lengths("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    ko = _cu_lengths("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    if len(qo) != len(ko):
        raise ValueError(f"sageattn_varlen: cu_seqlens_q has {len(qo) - 1} sequences, cu_seqlens_k {len(ko) - 1}")
    lq = [b - a for a, b in _pairs(qo)]
    lk = [b - a for a, b in _pairs(ko)]
    options = dict(smooth_k=bool(smooth_k))
    if len(set(lq)) == 1 and len(set(lk)) == 1:  # packed rows of equal sequences are a batch, as views
        n = len(lq)
        return _run(q.unflatten(0, (n, lq[0])), k.unflatten(0, (n, lk[0])), v.unflatten(0, (n, lk[0])), "NHD",
                    is_causal, sm_scale, None, False, **options).flatten(0, 1)
    out = torch.empty_like(q)
    for (a, b), (c, d) in zip(_pairs(qo), _pairs(ko), strict=True):
        if b > a:
            out[a:b] = _run(q[None, a:b], k[None, c:d], v[None, c:d], "NHD", is_causal, sm_scale, None, False,
                            **options)[0]
    return out


__all__ = ["sageattn", "sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp16_cuda",
           "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_varlen"]
