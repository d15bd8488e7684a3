"""Host time of one ``sageattn`` call against SDPA's, and where it goes (cProfile).

    python bench/host_time.py > bench/results/sm90_host_time.txt

For each shape: the mean time the host needs to enqueue a call (100 calls, fewer launches than the
launch queue holds, so the GPU's pace does not show), then a cProfile of 100 calls sorted by own
time. (1, 1, 256, 128) and (2, 24, 8192, 64) take the portable kernel's path (five launches),
(2, 24, 4608, 128) the Gluon kernel's. Host time decides the crossover on fast GPUs
(bench/NOTES.md, "Host time per call").
"""
from __future__ import annotations

import cProfile
import pstats
import time

import torch
import torch.nn.functional as F
from common import import_pack

import_pack()
from sagetriton.kernels import sageattn  # noqa: E402

SHAPES = [(1, 1, 256, 128), (2, 24, 4608, 128), (2, 24, 8192, 64)]


def enqueue_us(fn, q, k, v, calls: int = 100) -> float:
    for _ in range(20):
        fn(q, k, v)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn(q, k, v)
    host = (time.perf_counter() - t) / calls
    torch.cuda.synchronize()
    return host * 1e6


def main() -> None:
    for shape in SHAPES:
        q, k, v = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        for fn, name in ((sageattn, "sageattn"), (F.scaled_dot_product_attention, "sdpa")):
            print(shape, name, f"host enqueue {enqueue_us(fn, q, k, v):.0f} us/call", flush=True)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(100):
            sageattn(q, k, v)
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
