"""P·V formats side by side on a GPU: accuracy on a set of shaped inputs, then speed, with torch SDPA
and ComfyUI's built-in INT8 attention (comfy-kitchen) measured in the same run.

    python bench/pv_formats.py [--quick] [--out bench/results/<gpu>_pv_formats.json]

Accuracy: cosine and relative L1 against fp32 math attention on 1 x 4 x 8192 x 128 bf16 inputs:
random normal, and the shapes real models give that are hard on INT8 (``accuracy_cases.CASES``).
Speed: TOPS = 4·B·H·Lq·Lk·D / time of the full call (quantization included), median of do_bench
over rotating input sets.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
import triton.testing
from accuracy_cases import CASES, make_case
from common import RESULTS, cosine, environment, import_pack, kitchen_attention, rel_l1, write_json

import_pack()
from sagetriton.kernels.api import attention_forward  # noqa: E402
from sagetriton.kernels.arch import default_config, detect_arch, resolve_config  # noqa: E402

SHAPES = [(2, 24, 4608, 128), (2, 24, 8192, 128), (1, 24, 16384, 128), (1, 12, 32768, 128),
          (2, 24, 8192, 64), (1, 24, 16384, 64), (1, 12, 32768, 64)]
QUICK = [(2, 24, 8192, 128), (1, 24, 16384, 64)]


def ours(arch, D, pv, rotation):
    cfg = resolve_config(arch, D, pv_precision=pv)[0].replace(qk_rotation=rotation)
    return cfg, lambda q, k, v: attention_forward(q, k, v, "HND", False, None, None, False, cfg, True, False)[0]


def methods(arch, D):
    rows = [("sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), None)]
    for pv, rot in (("fp8", False), ("fp8", True), ("int8", False), ("int8", True), ("fp16", True)):
        cfg, fn = ours(arch, D, pv, rot)
        rows.append((f"sagetriton {pv}{' +rotation' if rot else ''}", fn, cfg))
    if default_config(arch, D) not in [r[2] for r in rows]:
        rows.insert(1, ("sagetriton default", ours(arch, D, None, default_config(arch, D).qk_rotation)[1], None))
    ck = kitchen_attention()
    if ck is not None:
        rows.append((*ck, None))
    return rows


def accuracy_table(arch):
    out = []
    for case in CASES:
        q, k, v = make_case(case, device="cuda")
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        for label, fn, _ in methods(arch, q.shape[-1]):
            if label == "sdpa":
                continue
            try:
                o = fn(q, k, v).float()
                row = dict(case=case, method=label, cosine=cosine(o, exact), rel_l1=rel_l1(o, exact))
            except Exception as e:  # noqa: BLE001
                row = dict(case=case, method=label, error=str(e).splitlines()[0][:200])
            print(row, flush=True)
            out.append(row)
    return out


def speed_table(arch, shapes):
    out = []
    for shape in shapes:
        B, H, L, D = shape
        sets = [tuple(torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)) for _ in range(3)]
        it = iter(range(10**9))

        rows = []
        for label, fn, _cfg in methods(arch, D):
            def call(fn=fn, sets=sets, it=it):
                return fn(*sets[next(it) % len(sets)])
            try:
                fn(*sets[0])  # compile outside the timing
                ms = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
            except Exception as e:  # noqa: BLE001
                rows.append(dict(shape=list(shape), method=label, error=str(e).splitlines()[0][:200]))
                continue
            rows.append(dict(shape=list(shape), method=label, ms=ms, tops=4 * B * H * L * L * D / ms / 1e9))
        sdpa = next(r for r in rows if r["method"] == "sdpa")
        ck = next((r for r in rows if r["method"].startswith("comfy-kitchen") and "ms" in r), None)
        for r in rows:
            if "ms" in r:
                r["vs_sdpa"] = sdpa["ms"] / r["ms"]
                if ck is not None:
                    r["vs_kitchen"] = ck["ms"] / r["ms"]
            print(r, flush=True)
        out += rows
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("pv_formats.py needs a GPU")
    arch = detect_arch()
    payload = {"env": environment() | {"arch": arch.arch}}
    print(payload["env"], flush=True)
    if not args.no_accuracy:
        payload["accuracy"] = accuracy_table(arch)
    payload["speed"] = speed_table(arch, QUICK if args.quick else SHAPES)
    write_json(__import__("pathlib").Path(args.out) if args.out else RESULTS / f"{arch.arch}_pv_formats.json", payload)


if __name__ == "__main__":
    main()
