"""Launch settings of the tiled Q/K rotation (``rotation.METHOD`` "tiled") swept at one shape on one GPU:
the Q and K quantization launches alone (no PDL, L2 flushed) and the whole call.

    python bench/rotation_sweep.py [--shape 2,24,8192,128] [--out bench/results/sm90_rotation_sweep.json]

Each row sets the method and its knobs (tiles per program, pipeline stages, register cap), then reports
the launches' median µs, the call's median ms (PDL on, as the pack runs) and the output's cosine against
the "dot" method's on the same inputs.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import triton.testing
from common import RESULTS, cosine, environment, import_pack, write_json
from rotation_cost_ab import BASE, quant_us, variants

import_pack()
from sagetriton.kernels import replay, rotation  # noqa: E402
from sagetriton.kernels.arch import detect_arch  # noqa: E402

# (label, method, tiles per program at most, pipeline stages, register cap). Earlier sweeps' other rows
# (one tile per program, tiles prefetched in registers, an 8-warp Q launch) were of variants removed since.
ROWS = [(BASE, "dot", 8, 2, 128), ("dot", "dot", 8, 2, 128), ("tiled", "tiled", 8, 2, 128),
        ("tiled 4", "tiled", 4, 2, 128), ("tiled 16", "tiled", 16, 2, 128), ("tiled 3 stages", "tiled", 8, 3, 128),
        ("tiled cap 168", "tiled", 8, 2, 168), ("tiled, again", "tiled", 8, 2, 128)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", default="2,24,8192,128")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    t0 = time.perf_counter()
    qkv = tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    payload = {"env": environment(), "shape": shape, "rows": []}
    print(payload["env"], flush=True)
    ref = None
    for label, method, tiles, stages, cap in ROWS:
        rotation.TILES_PER_PROGRAM, rotation.PIPE_STAGES, rotation.TILED_MAXNREG = tiles, stages, cap
        replay.clear()  # the knobs are not part of the replayed launches' keys
        name = BASE if label == BASE else method
        try:
            with_pdl, alone = variants(shape[3])[name], variants(shape[3], pdl=False)[name]
            out = with_pdl(*qkv).float()
            ref = out if label == "dot" else ref
            q = quant_us(alone, qkv)
            ms = triton.testing.do_bench(lambda f=with_pdl: f(*qkv), warmup=25, rep=200, return_mode="median")
            row = dict(label=label, method=method, tiles=tiles, stages=stages, maxnreg=cap, call_ms=ms, **q,
                       cos_vs_dot=cosine(out, ref) if ref is not None else None)
        except Exception as e:  # a setting that does not compile here is a row, not the end of the sweep
            row = dict(label=label, error=f"{type(e).__name__}: {str(e)[:200]}")
        payload["rows"].append(row)
        print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    rotation.METHOD, rotation.TILES_PER_PROGRAM, rotation.PIPE_STAGES, rotation.TILED_MAXNREG = "auto", 8, 2, 128
    replay.clear()
    payload["seconds"] = time.perf_counter() - t0
    arch = detect_arch(torch.device("cuda")).arch
    write_json(Path(args.out) if args.out else RESULTS / f"{arch}_rotation_sweep.json", payload)


if __name__ == "__main__":
    main()
