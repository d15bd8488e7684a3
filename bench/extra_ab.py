"""``sparse_attn(..., extra_tokens=N)`` against the same call without, on the GPU (issue 54): per query-block
count of the extra router (``sparse_launch.TUNING["extra_qb"]``: the default, then each one given), the
call's time (median of CUDA-event timings, the variants interleaved round by round), the profiler's time of
``extra_tail_kernel`` and ``extra_merge_kernel``, and the output's relative L2 distance from the default
variant's (the variants choose the same tokens: 0 up to rounding order).

    python bench/extra_ab.py [--shape 103950x56] [--family video] [--extra 128] [--qb 16,32] [--rounds 5]
                             [--out $OUT/extra_ab.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import sparse_inputs as si
import torch
from common import RESULTS, environment, import_pack, kernel_self_times, write_json

import_pack()
from sagetriton.kernels import sparse_attn, sparse_launch  # noqa: E402


def time_once(fn) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="103950x56")
    ap.add_argument("--family", default="video", choices=tuple(si.FAMILIES))
    ap.add_argument("--extra", type=int, default=128)
    ap.add_argument("--qb", default="16,32", help="query blocks per extra-router program to try beside the default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tau", type=float, default=1.3)
    ap.add_argument("--out", default=str(Path(os.environ.get("OUT", RESULTS)) / "extra_ab.json"))
    args = ap.parse_args(argv)
    T, H = (int(x) for x in args.shape.split("x"))
    q, k, v = si.FAMILIES[args.family](T, H)
    variants = [("plain", 0, None), ("default", args.extra, None)]
    variants += [(f"qb {qb}", args.extra, int(qb)) for qb in args.qb.split(",") if qb]

    def call(extra, qb):
        sparse_launch.TUNING["extra_qb"] = qb
        try:
            return sparse_attn(q, k, v, args.tau, extra_tokens=extra)
        finally:
            sparse_launch.TUNING["extra_qb"] = None

    outs = {name: call(extra, qb) for name, extra, qb in variants}  # also the warm-up (compiles)
    torch.cuda.synchronize()
    times = {name: [] for name, _, _ in variants}
    for _ in range(args.rounds):
        for name, extra, qb in variants:
            times[name].append(time_once(lambda e=extra, b=qb: call(e, b)))
    rows = []
    for name, extra, qb in variants:
        kt = kernel_self_times(lambda e=extra, b=qb: call(e, b)) if extra else {}
        pick = {key[:40]: round(ms, 3) for key, ms in kt.items() if "extra_" in key}
        dist = float((outs[name].float() - outs["default"].float()).norm() / outs["default"].float().norm()) \
            if extra else None
        rows.append({"variant": name, "extra_tokens": extra, "qb": qb, "ms": round(statistics.median(times[name]), 3),
                     "rounds_ms": [round(t, 3) for t in times[name]], "kernels_ms": pick, "rel_to_default": dist})
        print(f"{args.shape} {args.family} {name:8} {rows[-1]['ms']:9.3f} ms  {pick}  rel {dist}", flush=True)
    write_json(Path(args.out), {"environment": environment(), "shape": args.shape, "family": args.family,
                                "tau": args.tau, "rows": rows})


if __name__ == "__main__":
    main()
