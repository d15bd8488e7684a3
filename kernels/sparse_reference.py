"""Pure-torch reference of the block-sparse method ``sparse_attn`` runs (Sol-Attn, arXiv 2607.24027).

Written from the paper's description, in float64 by default, any length, any batch and GQA. It is
what the Triton kernels are tested against, so every choice of the method is made here, once:

* Tokens fall in 64-token blocks (the last one may be shorter). Per block: the mean of its queries
  (the centroid), the mean of its keys and the sum of its values, over its live tokens.
* K is centred by ``mu``, the mean of the block means (every block weighs the same, a short last one
  too). Exact logits are ``q·(k - mu)·scale``: the same softmax as ``q·k·scale``, as K smoothing.
* Proxy scores: ``S[i, j] = c_i·(kbar_j - mu)·scale·log2(e)`` (base 2) for query block i, key block j.
  Over j a proxy row has mean 0 (the centred block means sum to 0); its variance is estimated from
  the diagonal only, ``sum_d c_i[d]² · var_j(kbar_j[d] - mu[d])``, so the threshold needs no pass over
  the row: ``thr_i = tau · sqrt(var_i · (scale·log2 e)² + 1e-6)``. Key block j is exact for query
  block i if ``S[i, j] > thr_i``; with ``topk_ratio`` instead, the ``round(ratio · n')`` best
  (n' = key blocks that are not sinks, at least 1, at most n' - 1) and any tied with the last.
* Always exact: key blocks i-1, i, i+1, the ``sink_blocks`` key blocks for every query block, and
  every key block for the ``sink_q`` query blocks.
* Every other key block j adds one pooled term to the row's softmax: logit ``S[i, j]`` (the same for
  all rows of the query block), weight = its length, value = its summed V. So the whole sequence
  stays in the denominator.
* ``extra_tokens`` (0 or a multiple of 64 up to 256): per query block, tokens outside its exact
  blocks are scored by the centroid (``c_i·(k_t - mu)``, base 2) and fall in histogram cells
  ``floor(score / EXTRA_BIN)`` (a fixed grid; non-finite scores in none). Those in the best whole
  cells (at most ``EXTRA_BINS`` of them, from the best live cell down) are attended exactly by every
  row, as many cells as fit in ``extra_tokens`` tokens (a flat profile may admit none). Every other
  token outside the exact blocks then adds its own term with the centroid's logit instead of its
  block's pooled one.

``lse`` is the natural log of each row's softmax denominator in the frame of the unshifted logits
``q·k·scale`` (the pooled terms' logits moved by the row's ``q·mu·scale`` as the exact ones are).
A NaN or Inf in a query token makes its query block's centroid non-finite, so all 64 rows of that
block come out NaN (SDPA: that row only); one in a key or value makes its head NaN, as SDPA's rows.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

BLOCK = 64
EXTRA_BIN = 0.25  # base-2 logit width of one extra-token histogram bin (2^0.25: 19 % apart)
EXTRA_BINS = 64  # bins below the best score; tokens past them are never extra
EXTRA_MAX = 256
LOG2E = 1.4426950408889634

__all__ = ["BLOCK", "sparse_reference", "route_reference", "topk_count", "dense_reference"]


def topk_count(n_free: int, ratio: float) -> int:
    """Key blocks a query block keeps under ``topk_ratio``: ``ratio · n_free`` rounded, at least 1 and
    at most ``n_free - 1``; 0 when ``n_free <= 1`` (nothing to choose beyond the forced blocks)."""
    return max(0, min(n_free - 1, max(1, round(ratio * n_free))))


def _sink_range(value, n: int) -> tuple[int, int]:
    """A ``[start, end)`` block range clipped to ``[0, n)`` (sinks past the end are empty)."""
    if value is None:
        return 0, 0
    a, b = int(value[0]), int(value[1])
    return min(a, n), min(b, n)


def _lengths(t: int, n: int, device) -> torch.Tensor:
    lengths = torch.full((n,), float(BLOCK), dtype=torch.float64, device=device)
    lengths[-1] = t - (n - 1) * BLOCK
    return lengths


def _block_pool(x: torch.Tensor, n: int, reduce: str) -> torch.Tensor:
    """(B, H, T, D) -> (B, H, n, D): per 64-token block, the mean or the sum over its tokens."""
    b, h, t, d = x.shape
    xp = torch.nn.functional.pad(x, (0, 0, 0, n * BLOCK - t))
    s = xp.reshape(b, h, n, BLOCK, d).sum(dim=3)
    return s if reduce == "sum" else s / _lengths(t, n, x.device).to(x.dtype)[:, None]


def _as_bhld(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x if layout == "HND" else x.permute(0, 2, 1, 3)


def route_reference(q, k, tau: float = 1.3, *, tensor_layout: str = "NHD", scale: Optional[float] = None,
                    sink_blocks=None, sink_q=None, topk_ratio: Optional[float] = None,
                    dtype=torch.float64) -> dict:
    """The routing: ``exact`` (B, H, n, n) bool (query block, key block), the proxy scores ``scores``
    (B, H, n, n, base 2), ``threshold`` (B, H, n), and the proxies ``centroid`` (B, H, n, D), centred
    block means of K ``kc`` (B, Hkv, n, D) and ``mu`` (B, Hkv, D), all in ``dtype``."""
    qh, kh = (_as_bhld(x, tensor_layout).to(dtype) for x in (q, k))
    b, h, t, d = qh.shape
    h_kv = kh.shape[1]
    n = -(-t // BLOCK)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    log2s = scale * LOG2E
    cen = _block_pool(qh, n, "mean")
    kbar = _block_pool(kh, n, "mean")
    mu = kbar.mean(dim=2)
    kc = kbar - mu[:, :, None]
    kc_e = kc.repeat_interleave(h // h_kv, dim=1)
    scores = cen @ kc_e.transpose(-1, -2) * log2s
    s0, s1 = _sink_range(sink_blocks, n)
    q0, q1 = _sink_range(sink_q, n)
    idx = torch.arange(n, device=qh.device)
    sink_col = (idx >= s0) & (idx < s1)
    if topk_ratio:
        kk = topk_count(n - (s1 - s0), float(topk_ratio))
        ranked = scores.masked_fill(sink_col, float("-inf"))
        if kk:
            thr = ranked.topk(kk, dim=-1).values[..., -1]
            exact = ranked >= thr[..., None]
        else:
            thr = torch.full(scores.shape[:-1], float("inf"), dtype=dtype, device=qh.device)
            exact = torch.zeros_like(scores, dtype=torch.bool)
    else:
        var = (cen.pow(2) * kc_e.pow(2).mean(dim=2, keepdim=True)).sum(-1)
        thr = float(tau) * torch.sqrt(var * log2s * log2s + 1e-6)
        exact = scores > thr[..., None]
    exact = exact | ((idx[:, None] - idx[None, :]).abs() <= 1) | sink_col
    exact = exact | ((idx >= q0) & (idx < q1))[:, None]
    return {"exact": exact, "scores": scores, "threshold": thr, "centroid": cen, "kc": kc, "mu": mu}


def _extra_select(c: torch.Tensor, live: torch.Tensor, budget: int) -> torch.Tensor:
    """Which candidate tokens (``live``) the histogram admits: ``c`` base-2 centroid scores (rows:
    query blocks). Cells ``floor(c / EXTRA_BIN)`` of finite scores; whole cells from the best one down
    (at most ``EXTRA_BINS``), while their count fits ``budget``. Cells on a fixed grid, not counted from
    the best score, let one pass over the keys find the best cell and count the cells below it."""
    ok = live & torch.isfinite(c)
    cell = torch.floor(c / EXTRA_BIN)
    top = torch.where(ok, cell, float("-inf")).amax(dim=-1, keepdim=True)
    bins = torch.where(ok, top - cell, float(EXTRA_BINS)).clamp(max=EXTRA_BINS).long()
    counts = torch.zeros(c.shape[:-1] + (EXTRA_BINS + 1,), dtype=torch.long, device=c.device)
    counts.scatter_add_(-1, bins, torch.ones_like(bins))
    upto = counts[..., :EXTRA_BINS].cumsum(-1)  # tokens in bins 0..b
    n_bins = (upto <= budget).sum(-1, keepdim=True)  # bins admitted
    return ok & (bins < n_bins)


def sparse_reference(q, k, v, tau: float = 1.3, *, tensor_layout: str = "NHD", scale: Optional[float] = None,
                     sink_blocks=None, sink_q=None, topk_ratio: Optional[float] = None, extra_tokens: int = 0,
                     return_lse: bool = False, return_density: bool = False, dtype=torch.float64,
                     chunk_blocks: int = 16, query_blocks: Optional[range] = None):
    """The method in plain torch (see the module docstring); arguments as ``kernels.sparse_attn``.
    Computed in ``dtype``, ``chunk_blocks`` query blocks at a time (memory O(chunk · T) per head).
    Returns ``out`` in the input layout and dtype, then ``lse`` (B, H, L) fp32 and ``density`` (a
    0-dim float32 tensor: the fraction of (query block, key block) pairs attended exactly, over batch
    and heads) if asked for, in that order. ``query_blocks``: work out only these query blocks (a range
    of 64-row blocks; the other rows come out NaN), for spot checks of long sequences."""
    qh, kh, vh = (_as_bhld(x, tensor_layout).to(dtype) for x in (q, k, v))
    b, h, t, d = qh.shape
    rep = h // kh.shape[1]
    n = -(-t // BLOCK)
    scale_f = 1.0 / math.sqrt(d) if scale is None else float(scale)
    log2s = scale_f * LOG2E
    r = route_reference(q, k, tau, tensor_layout=tensor_layout, scale=scale, sink_blocks=sink_blocks,
                        sink_q=sink_q, topk_ratio=topk_ratio, dtype=dtype)
    exact, scores, cen, mu = r["exact"], r["scores"], r["centroid"], r["mu"]
    mu_e = mu.repeat_interleave(rep, dim=1)
    kc_tok = (kh - mu[:, :, None]).repeat_interleave(rep, dim=1)  # centred keys, per query head
    v_e = vh.repeat_interleave(rep, dim=1)
    vsum = _block_pool(v_e, n, "sum")
    lengths = _lengths(t, n, qh.device).to(dtype)
    tok_blk = torch.arange(t, device=qh.device) // BLOCK
    out = torch.full_like(qh, float("nan"))
    lse = torch.full((b, h, t), float("nan"), dtype=dtype, device=qh.device)
    todo = range(n) if query_blocks is None else range(max(0, query_blocks.start), min(n, query_blocks.stop))
    for i0 in range(todo.start, todo.stop, chunk_blocks):
        i1 = min(todo.stop, i0 + chunk_blocks)
        rows = slice(i0 * BLOCK, min(t, i1 * BLOCK))
        row_blk = tok_blk[rows] - i0  # query block of each row, within the chunk
        ex = exact[:, :, i0:i1]  # (B, H, c, n)
        keep_tok = ex[:, :, :, tok_blk][:, :, row_blk]  # (B, H, rows, T)
        s_tok = qh[:, :, rows] @ kc_tok.transpose(-1, -2) * log2s
        s_pool = scores[:, :, i0:i1].masked_fill(ex, float("-inf"))  # (B, H, c, n)
        pool_w = lengths
        pool_v = vsum
        if extra_tokens:
            c_tok = cen[:, :, i0:i1] @ kc_tok.transpose(-1, -2) * log2s  # (B, H, c, T)
            outside = ~ex[:, :, :, tok_blk]
            extra = _extra_select(c_tok, outside, int(extra_tokens))
            keep_tok = keep_tok | extra[:, :, row_blk]
            # per-token centroid terms replace the pooled ones (weight 1, value v_t)
            s_pool = c_tok.masked_fill(~(outside & ~extra), float("-inf"))
            pool_w = torch.ones(t, dtype=dtype, device=qh.device)
            pool_v = v_e
        s_tok = s_tok.masked_fill(~keep_tok, float("-inf"))
        s_row_pool = s_pool[:, :, row_blk]  # (B, H, rows, P)
        m = torch.maximum(s_tok.amax(-1), s_row_pool.amax(-1))[..., None]
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p_tok = torch.exp2(s_tok - m_safe)
        p_pool = torch.exp2(s_row_pool - m_safe)
        num = p_tok @ v_e + p_pool @ pool_v
        den = p_tok.sum(-1, keepdim=True) + (p_pool * pool_w).sum(-1, keepdim=True)
        out[:, :, rows] = num / den
        row_bias = (qh[:, :, rows] * mu_e[:, :, None]).sum(-1) * scale_f
        lse[:, :, rows] = (m_safe[..., 0] + torch.log2(den[..., 0])) * math.log(2) + row_bias
    res = (_as_bhld(out, tensor_layout).to(q.dtype),)
    if return_lse:
        res += (lse.float(),)
    if return_density:
        res += (exact.double().mean().float(),)
    return res[0] if len(res) == 1 else res


def dense_reference(q, k, v, *, tensor_layout: str = "NHD", scale: Optional[float] = None,
                    dtype=torch.float64, chunk: int = 1024) -> torch.Tensor:
    """Exact attention (the error's ground truth) in ``dtype``, ``chunk`` query rows at a time, so
    long sequences fit in memory. Returns ``out`` in the input layout, in ``dtype``."""
    qh, kh, vh = (_as_bhld(x, tensor_layout) for x in (q, k, v))
    b, h, t, d = qh.shape
    rep = h // kh.shape[1]
    scale_f = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = torch.empty(qh.shape, dtype=dtype, device=qh.device)
    for hi in range(h):
        kk = kh[:, hi // rep].to(dtype)
        vv = vh[:, hi // rep].to(dtype)
        for a in range(0, t, chunk):
            s = qh[:, hi, a:a + chunk].to(dtype) @ kk.transpose(-1, -2) * scale_f
            out[:, hi, a:a + chunk] = torch.softmax(s, dim=-1) @ vv
    return _as_bhld(out, tensor_layout)
