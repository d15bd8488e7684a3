"""``sparse_attn``'s ``extra_tokens``: single tokens outside a query block's exact blocks (the method:
``sparse_reference``'s module docstring and ``_extra_select``).

Around the unchanged attention kernel, in two steps:

* ``retail`` (after the router, before the attention kernel): ``sparse_extra_route.extra_tail_kernel``
  scores every token outside a query block's exact blocks by the block's centroid, picks the extra
  tokens by the histogram, and replaces the router's pooled tail with the other tokens' own terms (max,
  sum, P·V in the same base-2 frame), which the attention kernel then starts from.
* ``merge`` (after the kernel, which ran with its LSE in the centred frame ``q·(k - mu)·scale``): the
  extra tokens' exact attention per row (at most 256 gathered keys per query block, fp32 torch), merged
  with the kernel's rows by log-sum-exp. The two parts are disjoint, so the merge is the softmax over
  their union.

The extra router runs one centroid row per query block over K three times and over V once: about 1/32
of dense attention's products, but in TF32 (fp32 on AMD) where dense runs INT8/FP8, and with K read
once per 16 query blocks. The merge is 2·64·E·D products per query block. Memory beyond the kernel's:
an (nb, nb) byte mask and the (nb, E) indices per head, and the merge's slabs (``CHUNK`` elements).
"""
from __future__ import annotations

import torch

from . import api
from .sparse_extra_route import extra_tail_kernel
from .sparse_reference import BLOCK, EXTRA_BIN, EXTRA_BINS

CHUNK = 1 << 24  # elements of one (heads x query blocks x extra tokens x (rows + keys + values)) merge slab
QB = 16  # query blocks per extra-router program

__all__ = ["retail", "merge"]


def _exact_mask(lists, count, nb: int) -> torch.Tensor:
    """(n, nb, nb) bool from the router's lists: entries past ``count`` are unwritten (any value)."""
    ok = torch.arange(nb, device=lists.device) < count[..., None]
    idx = torch.where(ok, lists.long(), nb)  # the unwritten go to a spare column, dropped below
    mask = torch.zeros(lists.shape[:-1] + (nb + 1,), dtype=torch.bool, device=lists.device)
    return mask.scatter_(-1, idx, True)[..., :nb].contiguous()


def _heads(B: int, H: int, H_KV: int, a: int, b: int, device):
    """(batch, query head, key/value head) indices of the flat heads ``a:b`` (B*H order)."""
    bh = torch.arange(a, b, device=device)
    bi, hi = bh // H, bh % H
    return bi, hi, hi // (H // H_KV)


def _centred_kv(kh, vh, mu, bi, ki, D):
    """fp32 keys centred by ``mu`` and values of the key/value heads ``(bi, ki)``: (n, L, D) each."""
    kc = kh[bi, ki].float() - mu.view(kh.shape[0], kh.shape[1], -1)[bi, ki, None, :D]
    return kc, vh[bi, ki].float()


def retail(qh, kh, vh, cen, mu, lists, count, tail_m, tail_l, tail_acc, log2s: float, extra_tokens: int,
           precisions=("ieee", "ieee")):
    """Choose each query block's extra tokens and rewrite its tail (in place) as the per-token centroid
    terms of the other tokens outside its exact blocks (``sparse_extra_route.extra_tail_kernel``).
    ``qh, kh, vh``: (B, H|H_KV, L, D) views; ``cen`` (B*H, nb, d_pad), ``mu`` (B*H_KV, d_pad) and the
    router's outputs as ``sparse_launch.route``; ``precisions``: its (scores, P·V) products'. Returns the
    extra tokens' indices (B*H, nb, extra_tokens) int32 (the first ``n_extra`` of each row are live,
    the rest 0) and ``n_extra`` (B*H, nb) int32."""
    B, H, L, D = qh.shape
    H_KV = kh.shape[1]
    nb, d_pad = cen.shape[1], cen.shape[2]
    dev = qh.device
    exact = _exact_mask(lists, count, nb).view(torch.int8)
    idx = torch.zeros((B * H, nb, int(extra_tokens)), dtype=torch.int32, device=dev)
    n_extra = torch.empty((B * H, nb), dtype=torch.int32, device=dev)
    api._launch(extra_tail_kernel, (-(-nb // QB), B * H), (
        cen, kh, *kh.stride(), vh, *vh.stride(), mu, exact, tail_m, tail_l, tail_acc, idx, n_extra,
        H, H_KV, L, D, nb, int(extra_tokens), float(log2s),
    ), dict(QB=QB, D_PAD=d_pad, BIN=EXTRA_BIN, NBINS=EXTRA_BINS, SCORE_PREC=precisions[0],
            TAIL_PREC=precisions[1]), num_warps=4)
    return idx, n_extra


def merge(qh, kh, vh, mu, idx, n_extra, scale: float, oh, lse):
    """Add the extra tokens' exact attention to the kernel's rows in place: ``oh`` (B, H, L, D) view of the
    output, ``lse`` (B, H, L) fp32, the kernel's natural-log LSE in the centred frame ``q·(k - mu)·scale``
    (left in that frame, merged). ``qh`` is the (sign-folded) Q the kernel ran."""
    B, H, L, D = qh.shape
    H_KV = kh.shape[1]
    nb, E = idx.shape[1], idx.shape[2]
    dev = qh.device
    lse_flat = lse.view(B * H, L)
    per_block = E * (BLOCK + 2 * D)  # scores plus gathered keys and values per (head, query block)
    hc = max(1, min(B * H, CHUNK // (nb * per_block)))
    qc = nb if hc > 1 else max(1, min(nb, CHUNK // per_block))
    live = torch.arange(E, device=dev)
    for a in range(0, B * H, hc):
        b = min(B * H, a + hc)
        bi, hi, ki = _heads(B, H, H_KV, a, b, dev)
        kc, vv = _centred_kv(kh, vh, mu, bi, ki, D)
        rows = torch.arange(b - a, device=dev)[:, None, None]
        for i0 in range(0, nb, qc):
            i1 = min(nb, i0 + qc)
            r0, r1 = i0 * BLOCK, min(L, i1 * BLOCK)
            q = torch.nn.functional.pad(qh[bi, hi, r0:r1].float(), (0, 0, 0, (i1 - i0) * BLOCK - (r1 - r0)))
            q = q.view(b - a, i1 - i0, BLOCK, D)
            sel = idx[a:b, i0:i1].long()
            s = torch.matmul(q, kc[rows, sel].transpose(-1, -2)) * scale  # (n, q, 64, E), natural
            s = s.masked_fill(~(live < n_extra[a:b, i0:i1, None])[:, :, None, :], float("-inf"))
            lse2 = torch.logsumexp(s, dim=-1)  # -inf where the block has no extra token
            p = torch.exp(s - torch.where(lse2 == float("-inf"), 0.0, lse2)[..., None])
            o2 = torch.matmul(p, vv[rows, sel]).view(b - a, -1, D)[:, :r1 - r0]
            lse2 = lse2.view(b - a, -1)[:, :r1 - r0]
            lse1 = lse_flat[a:b, r0:r1]
            top = torch.maximum(lse1, lse2)  # NaN (a poisoned or out-of-range row) stays NaN
            top = torch.where(top == float("-inf"), 0.0, top)
            w1, w2 = torch.exp(lse1 - top), torch.exp(lse2 - top)
            den = w1 + w2
            o1 = oh[bi, hi, r0:r1].float()
            oh[bi, hi, r0:r1] = ((w1[..., None] * o1 + w2[..., None] * o2) / den[..., None]).to(oh.dtype)
            lse_flat[a:b, r0:r1] = top + torch.log(den)


