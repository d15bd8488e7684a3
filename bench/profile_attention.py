"""One attention call per kernel variant, for a hardware-counter profile under Nsight Compute.

    ncu --clock-control none --set full -k regex:'attention_kernel' --launch-skip 2 \
        python bench/profile_attention.py [--variant default|64x64|128x128x8] [--shape 1,24,16384,128]

Runs the variant three times (compile, warm-up, profiled), so ``--launch-skip 2`` lands on a warm
launch. Where the time goes inside the kernel (stall reasons, pipe utilisation, L2 traffic) is what
decides the next optimisation; see bench/NOTES.md.
"""
from __future__ import annotations

import argparse

import torch
from common import import_pack

import_pack()
from sagetriton.kernels.api import attention_forward  # noqa: E402
from sagetriton.kernels.arch import default_config, detect_arch  # noqa: E402

VARIANTS = {  # tile overrides of the per-arch default
    "default": {},
    "64x64": dict(block_m=64, block_n=64),
    "128x128x8": dict(block_m=128, block_n=128, num_warps=8),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    ap.add_argument("--shape", default="1,24,16384,128", help="B,H,L,D")
    args = ap.parse_args(argv)
    B, H, L, D = map(int, args.shape.split(","))
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cfg = default_config(detect_arch(), D).replace(**VARIANTS[args.variant])
    for _ in range(3):
        attention_forward(q, k, v, "HND", False, None, None, False, cfg, True, False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
