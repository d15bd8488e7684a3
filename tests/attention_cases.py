"""Helpers for dispatcher tests: attention inputs in ComfyUI's two layouts and a float64 reference.

``reference_backend`` has the signature of ComfyUI's attention backends and computes exact attention
in float64; it stands in for the ``func`` ComfyUI hands the override in tests that run without ComfyUI.
"""
from __future__ import annotations

import torch


def normalized_mask(mask):
    """ComfyUI's convention: a 2-D mask gets a batch dim, a 3-D mask a heads dim."""
    if mask is None:
        return None
    if mask.ndim == 2:
        mask = mask.unsqueeze(0)
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    return mask


def reference_backend(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                      **kwargs):
    """Exact attention (float64) with ComfyUI's backend contract; records that it ran."""
    reference_backend.calls += 1
    if not skip_reshape:
        b, lq, width = q.shape
        d = width // heads
        q = q.view(b, lq, heads, d).transpose(1, 2)
        k = (k if k.ndim == 4 else k.view(b, k.shape[1], -1, d)).transpose(1, 2)
        v = (v if v.ndim == 4 else v.view(b, v.shape[1], -1, d)).transpose(1, 2)
    b, h, lq, _ = q.shape
    if mask is not None and mask.ndim == 3 and mask.shape[0] == b * h != b:
        mask = mask.view(b, h, lq, -1)  # (B*H, Lq, Lk): what ComfyUI's sub-quadratic backend takes
    out = exact_attention(q, k, v, normalized_mask(mask), kwargs.get("scale")).to(q.dtype)
    if skip_output_reshape:
        return out
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


reference_backend.calls = 0


def exact_attention(q, k, v, mask=None, scale=None):
    """(B, H, Lq, D) attention in float64; GQA by repeating key/value heads."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.double()
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask,
                                                            scale=scale)


def random_qkv(b=2, h=2, lq=24, lk=24, d=64, dtype=torch.float16, kv_heads=None):
    kv_heads = kv_heads or h
    q = torch.randn(b, h, lq, d).to(dtype)
    k = torch.randn(b, kv_heads, lk, d).to(dtype)
    v = torch.randn(b, kv_heads, lk, d).to(dtype)
    return q, k, v


def comfy_args(q, k, v, skip_reshape: bool):
    """(B, H, L, D) tensors as ComfyUI passes them: as-is, or (B, L, H*D) from a fused projection (strided)."""
    if skip_reshape:
        return q, k, v
    # Views into one fused qkv-like buffer, as a real model's projection gives (non-contiguous rows).
    flat = [t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1) for t in (q, k, v)]
    if flat[0].shape[1] == flat[1].shape[1] and flat[0].shape[2] == flat[1].shape[2]:
        fused = torch.cat(flat, dim=-1)
        w = flat[0].shape[2]
        return fused[..., :w], fused[..., w:2 * w], fused[..., 2 * w:]
    return tuple(flat)


