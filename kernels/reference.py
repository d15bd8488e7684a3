"""Pure-torch references: the same quantized math as the kernel, and exact fp64 attention.

``quantized_reference`` mirrors the kernel's arithmetic (group scales, INT8 products, exp2 softmax,
fp8/16-bit P·V, INT8 P·V per key tile, the Q/K rotation), so differences to the kernel are only the
online-softmax order.
``exact_attention`` is torch SDPA's math in float64: the ground truth for accuracy.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from . import quant, rotation
from .arch import FP8_MAX, KernelConfig
from .footprint import head_dim_padded
from .rotation import ROTATION_BLOCK, hadamard_block

__all__ = ["cosine", "rel_l1", "exact_attention", "quantized_reference", "hadamard_block", "k_mean", "rope",
           "rope_matrices"]

_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
INT8_SHIFT_FLOOR = 20.0  # attention.INT8_SHIFT_FLOOR


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine similarity of two tensors, computed in fp64."""
    a, b = out.double().flatten(), ref.double().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-30))


def rel_l1(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L1 error of ``out`` against ``ref``, computed in fp64."""
    a, b = out.double(), ref.double()
    return float((a - b).abs().sum() / b.abs().sum().clamp_min(1e-30))


def to_bhld(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "HND" else t.permute(0, 2, 1, 3)


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _sm90_k_groups(row_max: torch.Tensor) -> tuple:
    """(group max, bad) per token of (B, H, L) row maxima, L a multiple of 128, in SageAttention's sm90 K groups
    (``quant.K_SM90_GROUPS``: per 128-key tile, the keys 8j + 2t + e alike in t); a NaN/Inf token makes its whole
    group bad."""
    B, H, L = row_max.shape
    bad = ~torch.isfinite(row_max)
    g = torch.where(bad, float("inf"), row_max).reshape(B, H, L // 128, 16, 4, 2).amax(dim=(3, 5), keepdim=True)
    g = g.expand(B, H, L // 128, 16, 4, 2).reshape(B, H, L)
    return torch.where(torch.isfinite(g), g, 0.0), ~torch.isfinite(g)


def _quantize_groups(x: torch.Tensor, group: int):
    """INT8 values and per-token scales with one scale per ``group`` consecutive tokens (or SageAttention's sm90
    K groups, ``quant.K_SM90_GROUPS``)."""
    B, H, L, D = x.shape
    tokens = 128 if group == quant.K_SM90_GROUPS else group
    pad = (-L) % tokens
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad))
    # As the kernels: a token holding NaN/Inf gets a NaN scale and is left out of its group's max.
    row_max = xp.abs().amax(dim=-1)
    if group == quant.K_SM90_GROUPS:
        amax, bad = _sm90_k_groups(row_max)
    else:
        bad = ~torch.isfinite(row_max)
        amax = torch.where(bad, 0.0, row_max).reshape(B, H, -1, group).amax(dim=-1)
        amax = amax.repeat_interleave(group, dim=-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    scale = torch.where(bad, float("nan"), scale)[..., :L]
    # Multiplied by 1/scale as the kernel does: dividing rounds near-ties differently (a whole INT8
    # step, which can move a row's LSE by a few 1e-2 nats when it hits the row's largest logit).
    xi = torch.clamp(torch.round(x * (1.0 / scale[..., None])), -127, 127)
    return xi, scale


def _rotated(x: torch.Tensor, block: int) -> torch.Tensor:
    """``quant._rotate``: rows divided by their max |x|, rounded to fp16, times the ±1 Hadamard signs."""
    r = x.abs().amax(dim=-1, keepdim=True)
    r = torch.where(r > 0, r, 1.0)
    signs = hadamard_block(x.shape[-1], block, torch.float64).to(x.device) * math.sqrt(block)
    return ((x / r).half().double() @ signs).float() * (r / math.sqrt(block))


def _rotated_exactly(x: torch.Tensor, block: int) -> torch.Tensor:
    """``quant._quantize_rotated_tiles``: the rows times the Hadamard block, no rounding before the sums."""
    return (x.double() @ hadamard_block(x.shape[-1], block, torch.float64).to(x.device)).float()


def mask_to_additive(attn_mask: Optional[torch.Tensor], dtype=torch.float64) -> Optional[torch.Tensor]:
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        return torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill(~attn_mask, float("-inf"))
    return attn_mask.to(dtype)


def exact_attention(q, k, v, layout="HND", is_causal=False, sm_scale=None, attn_mask=None):
    """fp64 SDPA math (``torch.nn.functional.scaled_dot_product_attention`` in float64 gives the same
    numbers). Returns (out in the input layout, lse (B, H, Lq)).

    Softmax as SDPA takes it: the row max subtracted, then normalized by the sum, so a row masked
    everywhere with -finfo.max (the mask swallows the logits even in float64) averages V. A row with
    no live key at all (-inf everywhere, or a boolean mask all False) is 0, the pack's convention
    (torch's math SDPA gives 0 there too; some fused SDPA kernels give NaN)."""
    qh, kh, vh = (to_bhld(t, layout).double() for t in (q, k, v))
    H = qh.shape[1]
    kh, vh = _expand_kv(kh, H), _expand_kv(vh, H)
    scale = 1.0 / math.sqrt(qh.shape[-1]) if sm_scale is None else sm_scale
    s = qh @ kh.transpose(-1, -2) * scale
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    add = mask_to_additive(attn_mask)
    if add is not None:
        s = s + add
    m = s.amax(dim=-1, keepdim=True)
    dead = torch.isneginf(m)
    p = torch.exp(s - torch.where(dead, 0.0, m))
    total = p.sum(dim=-1, keepdim=True)
    out = torch.where(dead, 0.0, (p @ vh) / torch.where(dead, 1.0, total))
    lse = torch.where(dead[..., 0], float("-inf"), m[..., 0] + torch.log(torch.where(dead, 1.0, total))[..., 0])
    return to_bhld(out, layout), lse


def kernel_mask(add: torch.Tensor) -> torch.Tensor:
    """An additive mask as the kernel applies it in base 2: finite values clamped to -2e38 first, so
    -finfo.max times log2(e) stays finite (a row masked so everywhere averages V, as in SDPA); -inf stays."""
    return torch.where(torch.isneginf(add), add, add.clamp_min(-2.0e38)) * math.log2(math.e)


def _k_sample(kh: torch.Tensor) -> torch.Tensor:
    """Which keys the statistics pass samples for K's mean (``quant.k_mean_sample``), as a bool mask."""
    L, d_pad = kh.shape[2], head_dim_padded(kh.shape[3])
    stride, tokens = quant.k_mean_sample(L, d_pad)
    keep = (torch.arange(L, device=kh.device) // quant.stats_block(d_pad)) % stride == 0
    assert int(keep.sum()) == tokens
    return keep


def k_mean(kh: torch.Tensor) -> torch.Tensor:
    """The vector K smoothing subtracts, (B, H, 1, D): the mean of the keys the statistics pass
    samples (``quant.k_mean_sample``: every key on short sequences)."""
    return kh[:, :, _k_sample(kh)].mean(dim=2, keepdim=True)


def _int8_pv(s2: torch.Tensor, m: torch.Tensor, vc: torch.Tensor, tile: int, heads: int):
    """INT8 P·V as the kernels do it: per row and tile of ``tile`` keys, P shifted by the tile's own max
    and rounded to 0..255, V rounded to ±127 per channel; the exact integer products and the rounded
    P's row sums are brought back to the row max ``m``. Returns (P·V, row sums)."""
    B, H, LQ, LK = s2.shape
    pad = (-LK) % tile
    st = torch.nn.functional.pad(s2, (0, pad), value=float("-inf")).reshape(B, H, LQ, -1, tile)
    t_max = st.amax(dim=-1, keepdim=True)
    # Not below the running max by more than INT8_SHIFT_FLOOR (a masked tile: -inf), as the kernels.
    running = torch.cummax(t_max, dim=3).values
    running = torch.where(torch.isneginf(running), 0.0, running)
    shift = torch.maximum(t_max, running - INT8_SHIFT_FLOOR)
    p_int = torch.round(torch.exp2(st - shift) * 255.0)
    # The tile's rescale to the row max; a tile with no live key weighs 0 (its shift may sit far above m).
    weight = torch.where(torch.isneginf(t_max), 0.0, torch.exp2(shift - m[..., None])) / 255.0
    amax = vc.abs().amax(dim=2, keepdim=True)
    vs = torch.where(amax > 0, amax / 127.0, 1.0)
    v_int = torch.nn.functional.pad(torch.clamp(torch.round(vc / vs), -127, 127), (0, 0, 0, pad))
    v_int = _expand_kv(v_int, heads).reshape(B, H, -1, tile, vc.shape[-1])
    pv = torch.einsum("bhqtk,bhtkd->bhqtd", p_int.double(), v_int.double())  # exact integers
    pv = (pv * weight.double()).sum(dim=3).float() * _expand_kv(vs, heads)
    row_sum = (p_int * weight).sum(dim=(-1, -2))[..., None]
    return pv, row_sum


def quantized_reference(q, k, v, cfg: KernelConfig, layout="HND", is_causal=False, sm_scale=None,
                        attn_mask=None, smooth_k=True, smooth_v=False, k_group: Optional[int] = None):
    """The kernel's quantized arithmetic in plain torch (fp32 softmax). Returns (out, lse). ``k_group``: K's
    group instead of ``cfg``'s (``quant.K_SM90_GROUPS``: what per_thread calls on Hopper's Gluon kernel take)."""
    qh, kh, vh = (to_bhld(t, layout).float() for t in (q, k, v))
    B, H, LQ, D = qh.shape
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    qg, kg = cfg.group_sizes()
    km = k_mean(kh) if smooth_k else torch.zeros_like(kh[:, :, :1])
    qr, kr = qh, kh - km
    if cfg.qk_rotation:
        d_pad = head_dim_padded(D)
        tiled = rotation.method_for(cfg.rotation_tiles, q.dtype, k.dtype, D, d_pad) == "tiled"  # as ``host._quantize``
        rotate = _rotated_exactly if tiled else _rotated
        qr, kr = (rotate(torch.nn.functional.pad(t, (0, d_pad - D)), min(d_pad, ROTATION_BLOCK)) for t in (qr, kr))
    qi, qs = _quantize_groups(qr, qg)
    ki, ks = _quantize_groups(kr, kg if k_group is None else k_group)
    qs = qs * scale * math.log2(math.e)
    s2 = (qi.double() @ _expand_kv(ki, H).double().transpose(-1, -2)).float()
    s2 = s2 * qs[..., None] * _expand_kv(ks, H)[..., None, :]
    if is_causal:
        keep = torch.ones(s2.shape[-2:], dtype=torch.bool, device=s2.device).tril()
        s2 = s2.masked_fill(~keep, float("-inf"))
    add = mask_to_additive(attn_mask, torch.float32)
    if add is not None:
        s2 = s2 + kernel_mask(add)
    m = s2.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), 0.0, m)
    p = torch.exp2(s2 - m)
    row_sum = p.sum(dim=-1, keepdim=True)

    vmean = vh.mean(dim=2, keepdim=True) if smooth_v else torch.zeros_like(vh[:, :, :1])
    vc = vh - vmean
    if cfg.pv_precision == "int8":
        pv, row_sum = _int8_pv(s2, m, vc, cfg.block_n, H)
    elif cfg.pv_precision == "fp8":
        fmax = FP8_MAX[cfg.fp8_format]
        vs = torch.where(vc.abs().amax(dim=2, keepdim=True) > 0, vc.abs().amax(dim=2, keepdim=True) / fmax, 1.0)
        v8 = (vc / vs).to(_FP8[cfg.fp8_format]).float()
        if cfg.v_residual:  # the rounding error, itself rounded to fp8, joins V
            v8 = v8 + (vc / vs - v8).to(_FP8[cfg.fp8_format]).float()
        pv = ((p * fmax).to(_FP8[cfg.fp8_format]).float() @ _expand_kv(v8, H)) * _expand_kv(vs, H) / fmax
    else:
        pv_dtype = torch.float16 if q.dtype == torch.float16 or cfg.pv_accum_dtype != "fp32" else torch.bfloat16
        pv = p.to(pv_dtype).float() @ _expand_kv(vc.to(pv_dtype).float(), H)
    live = row_sum != 0  # 0: no live key (out 0, as SDPA); NaN stays NaN
    out = torch.where(live, pv / torch.where(live, row_sum, 1.0) + _expand_kv(vmean, H), 0.0)
    lse = torch.where(live[..., 0], (m[..., 0] + torch.log2(row_sum[..., 0])) * math.log(2), float("-inf"))
    if smooth_k:
        lse = lse + (qh * _expand_kv(km, H)).sum(-1) * scale
    return to_bhld(out.to(q.dtype), layout), lse


def rope_matrices(length: int, half: int, batch: int = 1, device="cpu", seed: int = 0) -> torch.Tensor:
    """(batch, 1, length, half, 2, 2) fp32 rotation matrices [[cos, -sin], [sin, cos]] as ComfyUI's
    ``rope`` builds them, for seeded random integer positions."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    pos = torch.randint(0, 128, (batch, length, 1), generator=g).double()
    angle = (pos * (1.0 / 10000 ** (torch.arange(half, dtype=torch.float64) / half))).float()
    m = torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], dim=-1)
    return m.reshape(batch, 1, length, half, 2, 2).to(device)


def rope(x: torch.Tensor, freqs: torch.Tensor, fma: bool = False) -> torch.Tensor:
    """ComfyUI's RoPE in torch (``kernels.rope`` computes the same bits): each pair (x[2i], x[2i+1]) times
    its 2x2 matrix in fp32, rounded to x's dtype. ``fma``: the second product added as ``addcmul_`` adds it
    (``apply_rope1``, ComfyUI 0.3.75 on), else ``a * b + c * d`` (the RoPE 0.3.64's ``attention`` inlines)."""
    x_ = x.to(freqs.dtype).reshape(*x.shape[:-1], -1, 1, 2)
    first = freqs[..., 0] * x_[..., 0]
    out = first.addcmul_(freqs[..., 1], x_[..., 1]) if fma else first + freqs[..., 1] * x_[..., 1]
    return out.reshape(*x.shape).type_as(x)
