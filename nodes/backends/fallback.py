"""Where attention goes when our kernel does not take a call.

Three kinds:
- "comfy": ComfyUI's own backend (the ``func`` the override receives), or the override another
  pack had installed before us, which we compose with.
- "sdpa": torch SDPA with its default backend choice.
- "math": torch SDPA with only the MATH backend, split into query chunks so the Lq x Lk score
  matrix stays under a memory budget. This is the only safe choice on RDNA4, where SDPA's flash
  path can end in a Composable Kernel assertion that kills the process.

Tensors here are in (B, H, L, D) layout; ``dispatch`` converts ComfyUI's layouts.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ...kernels.arch import ArchInfo

# Bytes the score matrix of one chunk may take (fp32 scores plus their softmax).
DEFAULT_SCORE_BUDGET = 512 * 1024 * 1024


def is_rdna4(arch: Optional[ArchInfo]) -> bool:
    return arch is not None and arch.family == "rdna4"


def resolve_fallback_kind(choice: str, arch: Optional[ArchInfo], sdpa_default_safe: Optional[bool] = None) -> str:
    """"comfy" | "sdpa" | "math" for the user's choice on this GPU.

    On RDNA4 everything is "math" (SDPA's flash path can abort the process), except an explicit
    "sdpa" where install.py's child-process probe found the default SDPA path safe on this GPU.
    """
    if is_rdna4(arch):
        return "sdpa" if choice == "sdpa" and sdpa_default_safe is True else "math"
    return "comfy" if choice == "auto" else choice


@contextlib.contextmanager
def math_only_sdpa():
    """Only the MATH backend of torch SDPA inside this block (flash / efficient / cuDNN off)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


def query_chunk_rows(batch: int, heads: int, q_len: int, k_len: int, budget_bytes: int) -> int:
    """Query rows per chunk so that fp32 scores and probabilities of a chunk fit ``budget_bytes``."""
    per_row = max(1, batch * heads * k_len * 4 * 2)
    return max(1, min(q_len, budget_bytes // per_row))


def _slice_mask_rows(mask: Optional[torch.Tensor], start: int, stop: int) -> Optional[torch.Tensor]:
    if mask is None or mask.shape[-2] == 1:
        return mask
    return mask[..., start:stop, :]


def _sdpa(q, k, v, mask, scale, upcast: bool):
    kw = {}
    if k.shape[1] != q.shape[1]:
        kw["enable_gqa"] = True
    if upcast and q.dtype != torch.float32:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=_mask_for(mask, torch.float32), scale=scale, **kw)
        return out.to(q.dtype)
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=_mask_for(mask, q.dtype), scale=scale, **kw)


def _mask_for(mask, dtype):
    if mask is None or mask.dtype == torch.bool or mask.dtype == dtype:
        return mask
    return mask.to(dtype)  # SDPA wants a float mask in the query's dtype


def sdpa_attention(q, k, v, mask=None, scale=None, upcast: bool = False) -> torch.Tensor:
    """Plain torch SDPA, default backend selection."""
    return _sdpa(q, k, v, mask, scale, upcast)


def math_sdpa_chunked(q, k, v, mask=None, scale=None, upcast: bool = False,
                      budget_bytes: int = DEFAULT_SCORE_BUDGET) -> torch.Tensor:
    """MATH-only SDPA over query chunks; returns (B, H, Lq, D) like SDPA."""
    b, h, lq, _ = q.shape
    rows = query_chunk_rows(b, h, lq, k.shape[2], budget_bytes)
    with math_only_sdpa():
        if rows >= lq:
            return _sdpa(q, k, v, mask, scale, upcast)
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        for start in range(0, lq, rows):
            stop = min(lq, start + rows)
            out[:, :, start:stop] = _sdpa(q[:, :, start:stop], k, v, _slice_mask_rows(mask, start, stop), scale, upcast)
        return out
