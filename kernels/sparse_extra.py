"""``sparse_attn``'s ``extra_tokens``: single tokens outside a query block's exact blocks (the method:
``sparse_reference``'s module docstring and ``_extra_select``).

Around the unchanged attention kernel, in two steps:

* ``retail`` (after the router, before the attention kernel): ``sparse_extra_route.extra_tail_kernel``
  scores every token outside a query block's exact blocks by the block's centroid, picks the extra
  tokens by the histogram, and replaces the router's pooled tail with the other tokens' own terms (max,
  sum, P·V in the same base-2 frame), which the attention kernel then starts from.
* ``merge`` (after the kernel, which ran with its LSE in the centred frame ``q·(k - mu)·scale``):
  ``extra_merge_kernel`` attends each row's block's extra tokens exactly (at most 256 gathered keys,
  fp32-accurate products) and merges them with the kernel's row and LSE by log-sum-exp, in place. The
  two parts are disjoint, so the merge is the softmax over their union; rows of a block without extra
  tokens are left as the kernel wrote them.

The extra router runs the centroid rows of 64 query blocks a program (Hopper, Triton 3.8 on; else 16) over
K twice and over V once: 16-bit K multiplies as it is on the tensor cores (the centroid in two or three
16-bit parts, fp32-accurate scores; wgmma on Hopper), fp32 K in TF32 (fp32 on AMD). The merge is 2·64·E·D
products per query block. Memory beyond the kernel's: the (nb, E) int32 indices per head and the
centroids' 16-bit parts (2-3 × nb × d_pad per head).
"""
from __future__ import annotations

import torch

from . import api
from .arch import interpreter_enabled
from .sparse_extra_route import extra_merge_kernel, extra_tail_kernel
from .sparse_reference import EXTRA_BIN, EXTRA_BINS, LOG2E
from .triton_compat import TRITON_VERSION

# Query blocks per extra-router program: 64 on Hopper (K read once per 64 query blocks, 64-row products:
# wgmma; see retail for when), 16 elsewhere (mma.sync and AMD's: 32 and 64 spilled; bench/NOTES.md).
QB_WIDE, QB = 64, 16
# the centroid's 16-bit parts per K dtype: fp16 holds fp32's 24 bits in two, bf16 in three; fp32 K: none
PARTS = {torch.float16: 2, torch.bfloat16: 3, torch.float32: 0}
MERGE_TOKENS, MERGE_WARPS = 32, 4  # the merge's extra tokens per step and warps (twice that past head_dim 128)

__all__ = ["retail", "merge"]


def score_precision(parts: int, precision: str) -> str:
    """The extra router's score products: fp32 K's (``parts`` 0) weigh its per-token tail, and TF32's 2^-10 could
    put them thousands of log2 units off at huge logits (bench/NOTES.md, "Huge logits in the router"): three TF32
    products, fp32-accurate, where one would be TF32. 16-bit K's are exact in parts already."""
    return "tf32x3" if not parts and precision == "tf32" else precision


def retail(qh, kh, vh, cen, mu, lists, count, tail_m, tail_l, tail_acc, log2s: float, extra_tokens: int,
           precisions=("ieee", "ieee"), wide: bool = False, qb=None, pipelined: bool = False):
    """Choose each query block's extra tokens and rewrite its tail (in place) as the per-token centroid
    terms of the other tokens outside its exact blocks (``sparse_extra_route.extra_tail_kernel``).
    ``qh, kh, vh``: (B, H|H_KV, L, D) views; ``cen`` (B*H, nb, d_pad), ``mu`` (B*H_KV, d_pad) and the
    router's outputs as ``sparse_launch.route``; ``precisions``: its (scores, P·V) products'; ``wide``: 64
    query blocks a program (Hopper), else 16; ``qb``: that number, set (a benchmark's A/B); ``pipelined``:
    K's and V's tiles prefetched (NVIDIA; at 64 the first pass only: both took 116 KB of shared memory, one
    program an SM). Returns the extra tokens' indices (B*H, nb, extra_tokens) int32 (the first ``n_extra``
    of each row are live, the rest 0) and ``n_extra`` (B*H, nb) int32."""
    B, H, L, D = qh.shape
    H_KV = kh.shape[1]
    nb, d_pad = cen.shape[1], cen.shape[2]
    dev = qh.device
    idx = torch.zeros((B * H, nb, int(extra_tokens)), dtype=torch.int32, device=dev)
    n_extra = torch.empty((B * H, nb), dtype=torch.int32, device=dev)
    parts = PARTS[kh.dtype]
    cen_parts = cen[None]  # fp32 K: unused
    if parts:  # the centroids in 16-bit parts whose sum is them to fp32's precision (their products exact)
        cen_parts = torch.empty((parts,) + tuple(cen.shape), dtype=kh.dtype, device=dev)
        rest = cen
        for p in range(parts):
            cen_parts[p] = rest
            rest = rest - cen_parts[p].float()
    # 64 only up to head_dim 128 (256: 371 spills on sm90) and from Triton 3.8, whose tl.histogram is one
    # shared atomic per input; 3.6's ballot lowering costs bins/32 per input: 18,000 instructions a tile at 64
    qb = int(qb or (QB_WIDE if wide and d_pad <= 128 and TRITON_VERSION >= (3, 8) else QB))
    score_prec = score_precision(parts, precisions[0])
    api._launch(extra_tail_kernel, (-(-nb // qb), B * H), (
        cen, cen_parts, kh, *kh.stride(), vh, *vh.stride(), mu, lists, count, tail_m, tail_l, tail_acc, idx, n_extra,
        H, H_KV, L, D, nb, int(extra_tokens), float(log2s),
    ), dict(QB=qb, D_PAD=d_pad, BIN=EXTRA_BIN, NBINS=EXTRA_BINS, PARTS=parts, SCORE_PREC=score_prec,
            TAIL_PREC=precisions[1], INTERPRETER=interpreter_enabled(),
            SCAN_STAGES=2 if pipelined else 1, TAIL_STAGES=2 if pipelined and qb < QB_WIDE else 1),
        num_warps=8 if d_pad > 128 and torch.version.hip is None else 4)
    return idx, n_extra


def merge(qh, kh, vh, mu, idx, n_extra, scale: float, oh, lse, precision: str = "ieee"):
    """Add the extra tokens' exact attention to the kernel's rows in place (``extra_merge_kernel``): ``oh``
    (B, H, L, D) view of the output, ``lse`` (B, H, L) fp32, the kernel's natural-log LSE in the centred
    frame ``q·(k - mu)·scale`` (left in that frame, merged). ``qh`` is the (sign-folded) Q the kernel ran;
    ``precision``: fp32 inputs' products (16-bit inputs multiply exactly; these are the rows' largest logits)."""
    B, H, L, D = qh.shape
    nb, E = idx.shape[1], idx.shape[2]
    api._launch(extra_merge_kernel, (nb, B * H), (
        qh, *qh.stride(), kh, *kh.stride(), vh, *vh.stride(), mu, idx, n_extra, oh, *oh.stride(), lse,
        H, kh.shape[1], L, D, nb, E, float(scale) * LOG2E,
    ), dict(D_PAD=mu.shape[1], PREC=precision, ET=MERGE_TOKENS, F32=qh.dtype == torch.float32,
            INTERPRETER=interpreter_enabled()),
        num_warps=MERGE_WARPS if mu.shape[1] <= 128 else 2 * MERGE_WARPS)
