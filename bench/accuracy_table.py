"""Accuracy of every option combination against exact fp64 attention (runs anywhere).

    python bench/accuracy_table.py [--device cuda] [--out bench/results/accuracy_<device>.json]

On a CPU the kernels run through the Triton interpreter (set automatically). Inputs: random
normal Q, V and K with per-channel offsets (what real models' K looks like, and what smooth_k is for),
or one of ``accuracy_cases.CASES`` with ``--case``. ComfyUI's built-in INT8 attention (comfy-kitchen) is
a row too on a GPU where it is importable.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

if "--device" not in sys.argv or "cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from accuracy_cases import CASES, make_case  # noqa: E402
from common import RESULTS, cosine, environment, import_pack, kitchen_attention, rel_l1, write_json  # noqa: E402

import_pack()
from sagetriton.kernels import reference, sageattn  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--case", default=None, choices=CASES,
                    help="one of accuracy_cases.CASES instead of randn Q, V and K with channel offsets")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    B, H, L, D = 1, 4, args.seq, 128
    if args.case:
        q, k, v = make_case(args.case, B, H, L, D, device=args.device)
    else:
        q, k, v = (torch.randn(B, H, L, D, device=args.device) for _ in range(3))
        k = k + 3 * torch.randn(D, device=args.device)
        q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    exact, _ = reference.exact_attention(q, k, v)
    rows = []
    for gran, pv, acc, smooth_k, smooth_v, rotation in itertools.product(
            ("per_block", "per_warp", "per_thread"), ("fp16", "fp8", "fp8+residual", "int8"),
            ("fp32", "fp16+fp32"), (True, False), (False, True), (False, True)):
        if pv == "int8" and acc != "fp32":
            continue  # INT8 P·V sums in int32: no accumulation choice
        out = sageattn(q, k, v, qk_quant_gran=gran, pv_precision=pv, pv_accum_dtype=acc, smooth_k=smooth_k,
                       smooth_v=smooth_v, qk_rotation=rotation)
        rows.append(dict(qk_quant_gran=gran, pv_precision=pv, pv_accum_dtype=acc, smooth_k=smooth_k,
                         smooth_v=smooth_v, qk_rotation=rotation, cosine=cosine(out, exact),
                         rel_l1=rel_l1(out, exact)))
        r = rows[-1]
        print(f"| {gran} | {pv} | {acc} | {smooth_k} | {smooth_v} | {rotation} | {r['cosine']:.5f} | "
              f"{r['rel_l1']:.4f} |", flush=True)
    ck = kitchen_attention() if args.device != "cpu" else None  # ComfyUI's INT8 attention: GPUs only
    if ck is not None:
        out = ck[1](q, k, v)
        rows.append(dict(method=ck[0], cosine=cosine(out, exact), rel_l1=rel_l1(out, exact)))
        print(f"| {ck[0]} | {rows[-1]['cosine']:.5f} | {rows[-1]['rel_l1']:.4f} |", flush=True)
    write_json(__import__("pathlib").Path(args.out) if args.out else RESULTS / f"accuracy_{args.device}.json",
               {"env": environment(), "shape": [B, H, L, D], "dtype": "bfloat16",
                                                       "case": args.case or "randn, K offsets x3", "rows": rows})


if __name__ == "__main__":
    main()
