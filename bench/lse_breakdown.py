"""Where asking for the LSE costs time: GPU time per kernel of ``sageattn`` with and without ``return_lse``.

    python bench/lse_breakdown.py [--lengths 8192,65536] [--heads 24] [--calls 20]

The profiler's per-kernel device time (mean over ``--calls`` calls, after a warm-up) for each variant,
NHD as yunchang calls it, so the difference bench_dropin.py reports can be placed: the quantization
launches (Q's carries the K-mean bias with the LSE), the attention kernel (its LSE twin), or the gaps.
"""
from __future__ import annotations

import argparse

import torch
from common import environment, import_pack

import_pack()
from sagetriton.kernels import sageattention_compat as ours  # noqa: E402


def per_kernel(fn, calls: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        t = e.self_cuda_time_total if t is None else t
        if t:
            times[e.key[:70]] = times.get(e.key[:70], 0.0) + t / 1000.0 / calls
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


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
            t = per_kernel(lambda lse=lse, q=q, k=k, v=v: ours.sageattn(q, k, v, tensor_layout="NHD", return_lse=lse),
                           args.calls)
            total = sum(t.values())
            print(f"L={L} H={args.heads} return_lse={lse}: GPU {total * 1000:.1f} us per call")
            for name, ms in t.items():
                print(f"    {ms * 1000:9.2f} us  {name}")


if __name__ == "__main__":
    main()
