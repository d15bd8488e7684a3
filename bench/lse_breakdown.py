"""Where asking for the LSE costs time: GPU time per kernel of ``sageattn`` with and without ``return_lse``.

    python bench/lse_breakdown.py [--lengths 8192,65536] [--heads 24] [--calls 20]

The profiler's per-kernel device time (mean over ``--calls`` calls, after a warm-up) for each variant,
NHD as yunchang calls it, so the difference bench_dropin.py reports can be placed: the quantization
launches (Q's carries the K-mean bias with the LSE), the attention kernel (its LSE twin), or the gaps.
"""
from __future__ import annotations

import argparse

import torch
from common import environment, import_pack, kernel_self_times

import_pack()
from sagetriton.kernels import sageattention_compat as ours  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lengths", default="8192,65536")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    print(environment())
    for L in map(int, args.lengths.split(",")):
        q, k, v = (torch.randn(1, L, args.heads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for lse in (False, True):
            call = lambda lse=lse, q=q, k=k, v=v: ours.sageattn(q, k, v, tensor_layout="NHD",  # noqa: E731
                                                                return_lse=lse)
            t = kernel_self_times(call, args.calls, warm=3)
            total = sum(t.values())
            print(f"L={L} H={args.heads} return_lse={lse}: GPU {total * 1000:.1f} us per call")
            for name, ms in t.items():
                print(f"    {ms * 1000:9.2f} us  {name[:70]}")


if __name__ == "__main__":
    main()
