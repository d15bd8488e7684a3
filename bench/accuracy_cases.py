"""Inputs for accuracy measurements: random normal, and the shapes real models give that are hard
on INT8 quantization. Shared by the GPU benchmarks and ``accuracy_table.py``.

Each case is (1, H, L, D) bf16 Q, K, V built from one seeded generator:
- ``randn``: the benchmark's inputs (a flat softmax).
- ``k_offset``: K with a per-channel offset of 5 standard deviations (what smooth_k removes).
- ``sharp``: Q x 3, a sharper softmax, closer to real attention maps.
- ``heavy_v``: V tokens with log-normal norms (a few tokens much larger than the rest).
- ``heavy_v_t``: V elements Student-t with 3 degrees of freedom (heavy tails inside tokens).
- ``all_three``: k_offset, sharp and heavy_v together.
- ``outlier_key``: one channel of one key token at 100.
- ``massive_channels``: two channels of Q and K x 30, as real DiTs' massive activations.
"""
from __future__ import annotations

import torch

CASES = ("randn", "k_offset", "sharp", "heavy_v", "heavy_v_t", "all_three", "outlier_key", "massive_channels")


def make_case(case: str, B: int = 1, H: int = 4, L: int = 8192, D: int = 128, device="cpu", seed: int = 0):
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; known: {', '.join(CASES)}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    if case in ("k_offset", "all_three"):
        k = k + 5 * torch.randn(D, generator=g)
    if case in ("sharp", "all_three"):
        q = 3 * q
    if case in ("heavy_v", "all_three"):
        v = v * torch.exp(torch.randn(B, H, L, 1, generator=g))
    if case == "heavy_v_t":
        chi2 = sum(torch.randn(B, H, L, D, generator=g) ** 2 for _ in range(3)) / 3
        v = v / chi2.sqrt()
    if case == "outlier_key":
        k[:, :, L // 3, 7] = 100.0
    if case == "massive_channels":
        q[..., [3, 77 % D]] *= 30
        k[..., [3, 77 % D]] *= 30
    return tuple(t.to(device=device, dtype=torch.bfloat16) for t in (q, k, v))
