"""A/B of whole checkouts on a GPU: each tree's ``sageattn`` defaults timed at the same shapes, the
trees alternating round by round so that drift of the machine falls on both.

    python bench/ab_trees.py --tree A=/path/to/old/checkout --tree N=. [--rounds 2] [--shapes d128,d64] [--out ab.json]

Each tree runs in its own process (the pack is imported from that tree), times every shape with
``do_bench`` (median, inputs rotating, warmed by an accuracy call first) and reports TOPS and cosine
against an fp32 reference on two heads. The table printed last has one column per tree and round.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import itertools
import json
import subprocess
import sys
from pathlib import Path

SHAPE_SETS = {  # (B, H, L, D, pv_precision)
    # Flux's call, the table's lengths, Wan's call
    "d128": [(2, 24, 4608, 128, "fp8"), (2, 24, 8192, 128, "fp8"), (1, 24, 16384, 128, "fp8"),
             (1, 12, 32768, 128, "fp8"), (2, 12, 32760, 128, "fp8"), (2, 24, 8192, 128, "fp8+residual")],
    # the table's head_dim-64 lengths from where the dispatcher uses the kernel, and one below
    "d64": [(2, 24, 4608, 64, "fp8"), (2, 24, 8192, 64, "fp8"), (1, 24, 16384, 64, "fp8"),
            (1, 12, 32768, 64, "fp8")],
    # below Hopper's Gluon length: the portable kernel's loop, fp8 and INT8 P·V (other GPUs' defaults)
    "portable": [(2, 24, 2048, 128, "fp8"), (2, 24, 4096, 128, "fp8"), (2, 24, 4096, 128, "int8"),
                 (2, 24, 4096, 64, "fp8"), (2, 24, 4096, 64, "int8")],
    # Hopper's Gluon kernel with INT8 P·V, and the INT8 path at 64K
    "int8": [(2, 24, 8192, 128, "int8"), (1, 24, 16384, 128, "int8"), (1, 24, 65536, 128, "int8")],
    # ``sparse_attn`` at tau 1.3 (random inputs: density ~10 %), its FP8 and INT8 P·V
    "sparse": [(1, 24, 75600, 128, "sparse:fp8"), (1, 24, 75600, 128, "sparse:int8"),
               (1, 56, 103950, 128, "sparse:fp8"), (1, 56, 103950, 128, "sparse:int8")],
}


def _child(tree: Path, shapes: list) -> None:
    import torch
    import torch.nn.functional as F
    import triton.testing

    sys.path.append(str(Path(__file__).resolve().parent.parent))
    from sagetriton_import import import_pack

    import_pack(pack_dir=tree)  # the tree under test, not this checkout
    from sagetriton.kernels import sageattn, sparse_attn
    from sagetriton.kernels.arch import detect_arch, resolve_config
    from sagetriton.kernels.reference import cosine

    def alternating(fn, sets):  # the trees may predate installer/: kept here
        turns = itertools.cycle(sets)
        return lambda: fn(*next(turns))

    print(json.dumps({"env": {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
                              "torch": torch.__version__, "triton": triton.__version__}}), flush=True)
    for B, H, L, D, pv in shapes:
        sets = [tuple(torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                for _ in range(3)]
        q, k, v = sets[0]
        if pv.startswith("sparse:"):  # the same call in both trees; the cosine is against dense attention
            cfg = resolve_config(detect_arch(), D, pv_precision=pv.split(":")[1])[0]
            fn = functools.partial(sparse_attn, tau=1.3, tensor_layout="HND", config=cfg)
        else:
            fn = functools.partial(sageattn, pv_precision=pv)
        out = fn(q, k, v)[:, :2].float()
        ref = F.scaled_dot_product_attention(q[:, :2].float(), k[:, :2].float(), v[:, :2].float())
        cos = cosine(out, ref)
        call = alternating(fn, sets)
        ms = triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")
        print(json.dumps({"shape": f"{B}x{H}x{L}x{D} {pv}", "ms": round(ms, 4),
                          "tops": round(4 * B * H * L * L * D / (ms * 1e-3) / 1e12, 1), "cos": round(cos, 6)}),
              flush=True)
        del sets, q, k, v, call
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", default=[], help="NAME=checkout directory")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="d128", help="comma-separated shape sets: " + ", ".join(SHAPE_SETS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(Path(a.child).resolve(), [x for name in a.shapes.split(",") for x in SHAPE_SETS[name]])
        return
    trees = dict(t.split("=", 1) for t in a.tree)
    rows, env = [], None
    for r in range(a.rounds):
        for name, path in trees.items():
            tag = f"{name}{r + 1}"
            done = subprocess.run([sys.executable, __file__, "--child", path, "--shapes", a.shapes],
                                  capture_output=True, text=True)
            if done.returncode:
                print(f"{tag}: failed\n{done.stderr[-3000:]}", flush=True)
                continue
            for line in done.stdout.splitlines():
                if line.startswith('{"env"'):
                    env = json.loads(line)["env"]
                elif line.startswith("{"):
                    rows.append({"tag": tag, **json.loads(line)})
                    print(tag, line, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"env": env, "trees": trees, "rows": rows}, indent=1))
    tags = list(dict.fromkeys(r["tag"] for r in rows))
    print("shape".ljust(28) + "".join(t.rjust(9) for t in tags))
    for shape in dict.fromkeys(r["shape"] for r in rows):
        cells = {r["tag"]: r["tops"] for r in rows if r["shape"] == shape}
        print(shape.ljust(28) + "".join(str(cells.get(t, "-")).rjust(9) for t in tags))


if __name__ == "__main__":
    main()
