"""A/B of the sparse call's launches before its attention kernel (issue 54, "routing <= 3 % of the call"): each
``kernels.sparse_launch.TUNING`` variant below profiled in one process, variants alternating round by round,
per kernel (pool, Q/K quantization, router, small torch ops) and as the routing share bench_sparse.py reports
(``bench_sparse.routing_split``: beyond the dense path's launches on the same inputs, profiled in the same run).
Every variant must route as the default does (the same density, to 1e-6: sums in another order may flip a block
within ~1e-7 of its threshold) and give its answer within rounding of it.

    python bench/sparse_route_ab.py [--shapes 103950x56] [--families video,local_sinks] [--rounds 2]
                                    [--variants default,before,...] [--out bench/results/sparse_route_ab.json]

"before": the fp32 reductions the fourth session replaced (block means, row dots, V's block sums, the router's
prefix sum) and the router's online tail, i.e. the kernels as they were, in this tree.
"""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import bench_sparse as bs
import sparse_inputs as si
import torch
from common import RESULTS, environment, kernel_self_times, write_json
from sagetriton.kernels import sageattn, sparse_attn, sparse_launch

BASE = dict(sparse_launch.TUNING)
BEFORE = dict(quant_mma_sums=False, pool_mma_sums=False, route_scan_mma=False, route_fixed_frame=False)
VARIANTS = {
    "default": {},
    "before": BEFORE,
    "quant fp32 sums": dict(quant_mma_sums=False),
    "pool fp32 sums": dict(pool_mma_sums=False),
    "pool 1 stage": dict(pool_stages=1),
    "route cumsum": dict(route_scan_mma=False),
    "route online tail": dict(route_fixed_frame=False),
    "route 128x32 w8 1 stage": dict(route_tiles=(128, 32), route_warps=8, route_stages=1),
    "route 64x32 w4 1 stage": dict(route_tiles=(64, 32), route_warps=4, route_stages=1),
    "route 64x32 w4": dict(route_tiles=(64, 32), route_warps=4),
    "route 64x16 w4": dict(route_tiles=(64, 16), route_warps=4),
}
KERNELS = {"pool": ("pool_kernel", "pool_finish_kernel"), "quant": ("sparse_quantize_int8_kernel",),
           "route": ("route_kernel",), "attention": ("sparse_attention_kernel",), "convert_v": ("convert_v_kernel",)}


def split(times: dict) -> dict:
    out = {k: round(sum(times.get(n, 0.0) for n in names), 4) for k, names in KERNELS.items()}
    known = {n for names in KERNELS.values() for n in names}
    out["torch_ops"] = round(sum(t for n, t in times.items() if n not in known), 4)
    out["before_attention"] = round(sum(t for n, t in times.items() if n != "sparse_attention_kernel"), 4)
    return out


def run_variants(q, k, v, names: list, rounds: int, calls: int, tag: str) -> dict:
    """Each variant profiled ``rounds`` times, alternating; its density and answer checked against the first's."""
    dense = kernel_self_times(lambda: sageattn(q, k, v, "NHD"), calls=calls)
    runs: dict = {n: [] for n in names}
    checks: dict = {}
    ref = None
    for rnd in range(rounds):
        for n in names:
            sparse_launch.TUNING.clear()
            sparse_launch.TUNING.update(BASE, **VARIANTS[n])
            try:
                if rnd == 0:  # the variant's answer and routing against the first variant's
                    out, density = sparse_attn(q, k, v, 1.3, return_density=True)
                    if ref is None:
                        ref = (out, float(density))
                    diff = float((out.float() - ref[0].float()).norm() / ref[0].float().norm())
                    # the proxies' sums in another order may flip a block within ~1e-7 of its threshold: a few
                    # of the 148M at 103,950 x 56; more than 1e-6 of them is a routing change
                    checks[n] = {"density": float(density), "density_delta": float(density) - ref[1],
                                 "density_same": abs(float(density) - ref[1]) <= 1e-6,
                                 "rel_diff_vs_first": float(f"{diff:.3g}")}
                    del out
                times = kernel_self_times(lambda: sparse_attn(q, k, v, 1.3), calls=calls)
            except Exception as e:  # noqa: BLE001 - a variant that does not build loses, the rest go on
                print(f"  {tag} {n}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
                checks[n] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            split_ms = bs.routing_split(times, dense)
            r = {**split(times), **{key: split_ms[key] for key in ("routing_ms", "routing_share", "gpu_ms")}}
            runs[n].append(r)
            print(f"  {tag} round {rnd} {n:26s} " + " ".join(f"{a} {b}" for a, b in r.items()), flush=True)
    sparse_launch.TUNING.clear()
    sparse_launch.TUNING.update(BASE)
    case = {"dense_ms": {n: round(t, 4) for n, t in dense.items()}, "variants": {}}
    for n in names:
        if not runs[n]:
            case["variants"][n] = checks.get(n)
            continue
        med = {key: round(statistics.median(r[key] for r in runs[n]), 4) for key in runs[n][0]}
        case["variants"][n] = {"median": med, "rounds": runs[n], **checks.get(n, {})}
    print(f"{tag}: median per variant (ms)", flush=True)
    for n, c in case["variants"].items():
        if c and "median" in c:
            m = c["median"]
            print(f"  {n:26s} before attention {m['before_attention']:7.3f}  pool {m['pool']:6.3f}  quant "
                  f"{m['quant']:6.3f}  route {m['route']:6.3f}  torch {m['torch_ops']:6.3f}  routing "
                  f"{m['routing_ms']:6.3f} ({m['routing_share']:.2%})  density {c['density']:.6f} "
                  f"({'same' if c['density_same'] else 'DIFFERS'}: {c['density_delta']:+.1e}), answer "
                  f"{c['rel_diff_vs_first']:.1e} "
                  "from the first variant's", flush=True)
    return case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="103950x56")
    ap.add_argument("--families", default="video,local_sinks")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calls", type=int, default=3, help="profiled calls per variant and round")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=str(Path(os.environ.get("OUT", RESULTS)) / "sparse_route_ab.json"))
    args = ap.parse_args()
    names = args.variants.split(",")
    env = environment()
    record = {"environment": env, "base_tuning": dict(BASE), "variants": {n: VARIANTS[n] for n in names},
              "cases": {}}
    print(env, flush=True)
    for shape in args.shapes.split(","):
        T, H = (int(x) for x in shape.split("x"))
        for family in args.families.split(","):
            q, k, v = si.FAMILIES[family](T, H)
            record["cases"][f"{shape} {family}"] = run_variants(q, k, v, names, args.rounds, args.calls,
                                                                f"{shape} {family}")
            del q, k, v
            torch.cuda.empty_cache()
            write_json(Path(args.out), record)


if __name__ == "__main__":
    main()
