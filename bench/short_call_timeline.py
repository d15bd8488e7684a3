"""Where a short call's GPU time goes, beside SDPA's: what fewer launches could save below the crossover.

    python bench/short_call_timeline.py [--out bench/results/<arch>_short_call_timeline.json]

For each shape: the device time of every kernel of one call (torch.profiler, 20 calls), their sum, and
the call's time as the crossover measures it (``installer.selftest.time_call``: each call alone after
the L2 cache was overwritten, launches queued without waiting), with SDPA timed the same way. The call
time minus the kernels' sum is what launch gaps and host lag add; fusing launches can save at most that.
"""
from __future__ import annotations

import argparse
import sys

import torch
from common import RESULTS, environment, import_pack, kernel_self_times, write_json

import_pack()
from sagetriton.installer.selftest import time_call  # noqa: E402
from sagetriton.kernels.api import attention_forward  # noqa: E402
from sagetriton.kernels.arch import default_config, detect_arch  # noqa: E402

SHAPES = [(2, 24, n, d) for d in (128, 64) for n in (2048, 3072, 4096, 4608)]


def kernel_times(fn, calls: int = 20) -> dict:
    """{event (48 characters): µs per call}: each profiler event's total device time."""
    return {name[:48]: round(ms * 1000.0, 2) for name, ms in kernel_self_times(fn, calls, warm=3, total=True).items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("short_call_timeline.py needs a GPU")
    arch = detect_arch()
    env = environment()
    print(env, flush=True)
    rows = []
    for shape in SHAPES:
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cfg = default_config(arch, shape[3])
        ours = lambda q=q, k=k, v=v, cfg=cfg: attention_forward(  # noqa: E731
            q, k, v, "HND", False, None, None, False, cfg, True, False)
        sdpa = lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
        kernels = kernel_times(ours)
        total = sum(kernels.values())
        call_us = time_call(ours, q.device, iters=20) * 1e3
        sdpa_us = time_call(sdpa, q.device, iters=20) * 1e3
        attention_us = sum(t for name, t in kernels.items() if "attention" in name or "shared_kv" in name)
        row = dict(shape=list(shape), kernels_us=kernels, kernels_sum_us=round(total, 1),
                   quantization_us=round(total - attention_us, 1), call_us=round(call_us, 1),
                   gaps_and_host_us=round(call_us - total, 1), sdpa_us=round(sdpa_us, 1),
                   x_sdpa=round(sdpa_us / call_us, 3), attention_only_x_sdpa=round(sdpa_us / attention_us, 3))
        print(row, flush=True)
        rows.append(row)
    from pathlib import Path

    write_json(Path(args.out) if args.out else RESULTS / f"{arch.arch}_short_call_timeline.json",
               {"env": env, "rows": rows})


if __name__ == "__main__":
    main()
