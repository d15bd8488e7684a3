"""Input families for the sparse-attention benchmark (bench/bench_sparse.py): q, k, v as (1, T, H, 128) bf16.

No real model weights are available here, so the families are proxies for what video models' attention
looks like, each documented with how concentrated its attention is (``concentration``, measured on a
sample of query rows and reported beside every result):

* ``random``: i.i.d. Gaussian q, k, v (k with a per-channel offset, as real K has). Near-uniform
  attention: every method's sparse answer is far from exact here; it measures speed and bookkeeping.
* ``video``: tokens on a T x H x W latent grid (Wan 2.1's at these lengths), features that vary smoothly
  in time and space (a random field of low spatial frequencies) plus per-token noise, and 3D RoPE
  (channel pairs split 22/21/21 over t, y, x, as Wan's). Each head has its own sharpness, from diffuse
  to local, as in video DiTs where some heads look at a neighbourhood and others at the whole clip.
* ``local_sinks``: a 1D sequence whose heads attend a window around each token (a band of random
  frequencies whose cosines sum to a kernel about ``window`` tokens wide) plus a few global "sink"
  tokens at the start (the first 256: text/conditioning tokens packed before the video, as in
  MiniMax-H3), which every query weighs heavily through one shared channel.
"""
from __future__ import annotations

import math

import torch

D = 128
# Latent grids (frames, height, width) with these token counts: Wan 2.1 480p and 720p at 81 frames, and
# two longer clips.
GRIDS = {32760: (21, 30, 52), 75600: (21, 45, 80), 103950: (21, 55, 90), 160000: (25, 80, 80)}


def _grid(T: int) -> tuple:
    if T in GRIDS:
        return GRIDS[T]
    side = max(1, int(round(math.sqrt(T / 21))))
    return (-(-T // (side * side)), side, side)


def random_qkv(T: int, H: int, seed: int = 0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(1, T, H, D, generator=g, device=device) for _ in range(3))
    k += torch.randn(D, generator=g, device=device)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def _rope3d(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """3D RoPE on (T, h, D): channel pairs 0-21 rotate with t, 22-42 with y, 43-63 with x (Wan's split)."""
    pairs = (22, 21, 21)
    angles = []
    for axis, n in enumerate(pairs):
        theta = 10000.0 ** (-torch.arange(n, device=x.device, dtype=torch.float32) / n)
        angles.append(pos[:, axis:axis + 1] * theta[None, :])
    ang = torch.cat(angles, dim=1)[:, None, :]  # (T, 1, 64)
    cos, sin = ang.cos(), ang.sin()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def video_qkv(T: int, H: int, seed: int = 0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    nt, ny, nx = _grid(T)
    idx = torch.arange(T, device=device)
    pos = torch.stack([idx // (ny * nx), (idx // nx) % ny, idx % nx], dim=1).float()  # (T, 3)
    norm = pos / torch.tensor([max(nt, 1), ny, nx], device=device, dtype=torch.float32)
    # A smooth random field: 128 channels of cos(pos·w + phase) with low frequencies (a few periods per clip).
    w = torch.randn(3, D, generator=g, device=device) * 6.0
    phase = torch.rand(D, generator=g, device=device) * 6.2832
    field = torch.cos(norm @ w + phase)  # (T, D)
    sharp = torch.linspace(0.6, 2.2, H, device=device)[torch.randperm(H, generator=g, device=device)]
    mix_q = torch.randn(H, D, D, generator=g, device=device) / math.sqrt(D)
    mix_k = mix_q + 0.3 * torch.randn(H, D, D, generator=g, device=device) / math.sqrt(D)
    out = []
    for mix, noise in ((mix_q, 0.6), (mix_k, 0.6)):
        x = torch.einsum("td,hde->the", field, mix) * sharp[None, :, None] * 2.0
        x += noise * torch.randn(T, H, D, generator=g, device=device)
        out.append(_rope3d(x, pos))
    q, k = out
    k += 0.5 * torch.randn(D, generator=g, device=device)
    v = torch.einsum("td,hde->the", field, torch.randn(H, D, D, generator=g, device=device) / math.sqrt(D))
    v += 0.5 * torch.randn(T, H, D, generator=g, device=device)
    return q[None].bfloat16(), k[None].bfloat16(), v[None].bfloat16()


def local_sinks_qkv(T: int, H: int, seed: int = 0, device="cuda", n_sinks: int = 256):
    g = torch.Generator(device=device).manual_seed(seed)
    pos = torch.arange(T, device=device, dtype=torch.float32)
    windows = 2.0 ** torch.linspace(8, 12, H, device=device)  # 256 .. 4096 tokens, one per head
    pairs = (D - 2) // 2
    q = torch.empty(T, H, D, device=device)
    k = torch.empty(T, H, D, device=device)
    for h in range(H):
        theta = torch.rand(pairs, generator=g, device=device) * (math.pi / windows[h])
        ang = pos[:, None] * theta[None, :]
        feat = torch.stack([ang.cos(), ang.sin()], dim=-1).reshape(T, 2 * pairs)
        amp = math.sqrt(14.0 * math.sqrt(D) / pairs)  # a peak logit of ~14 nats over the far background
        q[:, h, :2 * pairs] = amp * feat + 0.3 * torch.randn(T, 2 * pairs, generator=g, device=device)
        k[:, h, :2 * pairs] = amp * feat + 0.3 * torch.randn(T, 2 * pairs, generator=g, device=device)
    # the sinks: one channel that every query holds and only the first n_sinks keys answer
    q[:, :, D - 2] = 3.0
    k[:, :, D - 2] = 0.0
    k[:n_sinks, :, D - 2] = 9.0 * math.sqrt(D) / 3.0  # q·k / sqrt(D) = 9 nats over the other keys
    q[:, :, D - 1] = 0.0
    k[:, :, D - 1] = 1.0  # a per-channel K offset
    v = torch.randn(T, H, D, generator=g, device=device)
    return q[None].bfloat16(), k[None].bfloat16(), v[None].bfloat16()


FAMILIES = {"random": random_qkv, "video": video_qkv, "local_sinks": local_sinks_qkv}


def sample_rows(T: int, n: int = 2048) -> torch.Tensor:
    """Query rows the errors are measured on: ``n`` evenly spread over the sequence."""
    return torch.linspace(0, T - 1, min(n, T)).round().long().unique()


def exact_rows(q, k, v, rows, chunk_heads: int = 8) -> torch.Tensor:
    """Exact attention (fp32) for the query ``rows`` of every head: (1, len(rows), H, D) fp32, computed a
    few heads at a time (the full exact output would cost as much as fp32 SDPA on the whole sequence)."""
    H = q.shape[2]
    out = torch.empty((1, len(rows), H, D), dtype=torch.float32, device=q.device)
    rows = rows.to(q.device)
    for h0 in range(0, H, chunk_heads):
        hs = slice(h0, min(H, h0 + chunk_heads))
        qs = q[0, rows, hs].float().transpose(0, 1)  # (h, n, D)
        ks = k[0, :, hs].float().transpose(0, 1)
        vs = v[0, :, hs].float().transpose(0, 1)
        out[0, :, hs] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
    return out


def concentration(q, k, rows, heads: int = 8, block: int = 64) -> dict:
    """How concentrated the attention of ``rows`` is, averaged over up to ``heads`` heads: the share of
    the probability mass in the best 5 % of 64-token key blocks, and the effective number of keys
    (exp of the entropy) as a fraction of the sequence."""
    T, H = q.shape[1], q.shape[2]
    rows = rows.to(q.device)
    top, eff = [], []
    nb = -(-T // block)
    for h in range(0, H, max(1, H // heads)):
        s = (q[0, rows, h].float() @ k[0, :, h].float().T) / math.sqrt(D)
        p = torch.softmax(s, dim=-1)
        eff.append(float(torch.exp(-(p * torch.log(p.clamp_min(1e-30))).sum(-1)).mean()) / T)
        pb = torch.nn.functional.pad(p, (0, nb * block - T)).reshape(len(rows), nb, block).sum(-1)
        kk = max(1, round(0.05 * nb))
        top.append(float(pb.topk(kk, dim=-1).values.sum(-1).mean()))
    return {"mass_in_top5pct_blocks": round(sum(top) / len(top), 4),
            "effective_keys_fraction": round(sum(eff) / len(eff), 5)}
