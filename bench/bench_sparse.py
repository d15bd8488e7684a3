"""Sparse attention on the GPU, side by side in one run: comfy-kitchen's ``sol_attn`` (same inputs, same tau /
top-k ratio, token_aug 0), torch SDPA, this pack's dense kernel and ``sparse_attn``.

    python bench/bench_sparse.py [--shapes 32760x24,75600x24,103950x56,160000x40] [--families random,video,local_sinks]
                                 [--settings tau:1.0,tau:1.3,tau:1.5,topk:0.1] [--extra 128,256]
                                 [--out bench/results/sparse_h200.json]

``--extra``: also tau 1.3 with that many ``extra_tokens`` (and comfy-kitchen's with that ``token_aug``),
columns "sparse tau 1.3 +N" / "sol tau 1.3 +N"; 0 or empty: none.

Per shape (B=1, head_dim 128, bf16, NHD) and input family (bench/sparse_inputs.py, with how concentrated
each family's attention is): time per call (median of CUDA-event timings after a warm-up), the fraction
of key blocks attended exactly, and the relative L2 error against exact fp32 attention on 2,048 query
rows spread over the sequence (every head; exact attention of the whole sequence would cost more than
the benchmark). comfy-kitchen returns no density: its column is the reference router's
(``kernels.sparse_reference.route_reference``) for the same tau, the method both implement. Also: the
routing share of ``sparse_attn``'s GPU time (from the profiler: what the dense path would not run, see
``routing_split``), and ``sparse_attn`` with every block routed exact against the dense kernel.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import time
from pathlib import Path

import sparse_inputs as si
import torch
from common import RESULTS, environment, import_pack, kernel_self_times, write_json

import_pack()
from sagetriton.kernels import sageattn, sparse_attn, sparse_launch  # noqa: E402
from sagetriton.kernels.arch import detect_arch, resolve_config  # noqa: E402
from sagetriton.kernels.sparse_reference import route_reference  # noqa: E402

SHAPES = "32760x24,75600x24,103950x56,160000x40"
SETTINGS = [("tau", 1.0), ("tau", 1.3), ("tau", 1.5), ("topk", 0.1)]
# Routing is what the dense path would not run. Not routing: the sparse attention kernel (it replaces the
# dense one) and V's conversion (the same launch on both paths). Each sparse launch that does a dense launch's
# work and more (``COUNTERPARTS``: the Q and K quantization, which also writes the router's block proxies; the
# pool, which reads V for its scale as the dense statistics launch does, and sums its blocks) counts as routing
# beyond what its dense counterpart takes on the same inputs in the same run (exact names). Until 2026-12-04's
# fourth session every launch named "*quantize_int8_kernel*" was left out, the sparse one's excess too, and the
# pool counted whole.
NOT_ROUTING = ("sparse_attention_kernel", "convert_v_kernel")
COUNTERPARTS = {"sparse_quantize_int8_kernel": "quantize_int8_kernel", "pool_kernel": "kv_stats_kernel"}


def timed(fn, min_reps: int = 3) -> float:
    """Median milliseconds per call of ``fn`` (one warm-up call first)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(min_reps if min_reps else 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 3)


def kitchen_sol():
    try:
        import comfy_kitchen

        fn = comfy_kitchen.sol_attn
        if not comfy_kitchen.sol_attn_is_available(torch.device("cuda")):
            raise RuntimeError("sol_attn_is_available() is False")
    except Exception as e:  # noqa: BLE001 - not installed or no build for this GPU: the table says so
        print(f"comfy-kitchen sol_attn unavailable: {type(e).__name__}: {e}")
        return None, None
    try:
        version = importlib.metadata.version("comfy-kitchen")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(comfy_kitchen, "__version__", "0.2.40 (unpacked)")
    return fn, version


def rel_rows(out, exact, rows) -> float:
    o = out[0, rows.to(out.device)].float()
    return round(float((o - exact[0]).norm() / exact[0].norm()), 5)


def routing_split(sparse: dict, dense: dict) -> dict:
    """Routing in a sparse call's GPU time ({kernel: ms} of one sparse and one dense call on the same inputs):
    every kernel but NOT_ROUTING, less per ``COUNTERPARTS`` entry the dense launch's time (at most the sparse
    one's). Without dense times every launch but NOT_ROUTING counts whole."""
    total = sum(sparse.values())
    credits = {name: min(sparse.get(name, 0.0), dense.get(twin, 0.0)) for name, twin in COUNTERPARTS.items()}
    routing = sum(t for name, t in sparse.items() if name not in NOT_ROUTING) - sum(credits.values())
    return {"gpu_ms": round(total, 3), "routing_ms": round(routing, 3),
            "routing_share": round(routing / total, 4) if total else float("nan"),
            "excess_ms": {name: round(sparse.get(name, 0.0) - c, 3) for name, c in credits.items()},
            "dense_counterparts_ms": {twin: round(dense.get(twin, 0.0), 3) for twin in COUNTERPARTS.values()}}


def routing_share(call, dense_call=None) -> dict:
    """GPU time of one sparse call by kernel (profiler) and its routing share (``routing_split``), the dense
    quantization measured on ``dense_call`` (the dense path on the same inputs) in the same run; without one
    the sparse quantization counts whole."""
    times = kernel_self_times(call)
    dense = kernel_self_times(dense_call) if dense_call is not None else {}
    top = sorted(times.items(), key=lambda kv: -kv[1])[:10]
    return {**routing_split(times, dense), "kernels_ms": {k[:60]: round(v, 3) for k, v in top},
            "dense_kernels_ms": {k[:60]: round(v, 3) for k, v in sorted(dense.items(), key=lambda kv: -kv[1])[:6]}}


def bench_case(T: int, H: int, family: str, sol, args) -> dict:
    t0 = time.time()
    q, k, v = si.FAMILIES[family](T, H)
    rows = si.sample_rows(T, args.rows)
    exact = si.exact_rows(q, k, v, rows)
    entry = {"tokens": T, "heads": H, "family": family, "concentration": si.concentration(q, k, rows)}
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    results = {}

    def run(name, fn, density=None):
        out = fn()
        if isinstance(out, tuple):
            out, density = out[0], float(out[1])
        err = rel_rows(out, exact, rows)
        del out
        ms = timed(fn, args.reps)
        results[name] = {"ms": ms, "rel_l2": err, **({"density": round(density, 4)} if density is not None else {})}
        print(f"  {T}x{H} {family:11s} {name:22s} {ms:9.2f} ms  rel L2 {err:.4f}"
              + (f"  density {density:.4f}" if density is not None else ""), flush=True)

    run("sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh).transpose(1, 2))
    run("dense", lambda: sageattn(q, k, v, "NHD"))
    for pv, cfg in args.configs:
        name = "sparse all blocks" if pv == args.configs[0][0] else f"sparse[{pv}] all blocks"
        run(name, lambda cfg=cfg: sparse_attn(q, k, v, tau=-1e9, return_density=True, config=cfg))
    for kind, value in args.settings:
        kw = {"tau": value} if kind == "tau" else {"topk_ratio": value}
        label = f"{kind} {value}"
        if sol is not None:
            r = route_reference(q, k, **kw, dtype=torch.float32)
            ref_density = float(r["exact"].float().mean())
            del r
            ck_kw = dict(tau=value if kind == "tau" else 1.3, topk_ratio=value if kind == "topk" else 0.0, token_aug=0)
            run(f"sol {label}", lambda ck_kw=ck_kw: sol(q, k, v, **ck_kw), density=ref_density)
        for pv, cfg in args.configs:
            name = f"sparse {label}" if pv == args.configs[0][0] else f"sparse[{pv}] {label}"
            run(name, lambda kw=kw, cfg=cfg: sparse_attn(q, k, v, **kw, return_density=True, config=cfg))
    for extra in args.extra:  # single tokens beyond the exact blocks (kernels/sparse_extra.py), at tau 1.3
        if sol is not None:
            try:
                run(f"sol tau 1.3 +{extra}", lambda extra=extra: sol(q, k, v, tau=1.3, topk_ratio=0.0, token_aug=extra))
            except Exception as e:  # noqa: BLE001 - a token_aug comfy-kitchen refuses: the table says so
                print(f"  sol token_aug {extra}: {type(e).__name__}: {e}", flush=True)
        run(f"sparse tau 1.3 +{extra}", lambda extra=extra: sparse_attn(q, k, v, 1.3, extra_tokens=extra,
                                                                       return_density=True,
                                                                       config=args.configs[0][1]))
    entry["methods"] = results
    try:
        entry["profile_tau_1.3"] = routing_share(lambda: sparse_attn(q, k, v, 1.3, config=args.configs[0][1]),
                                                 lambda: sageattn(q, k, v, "NHD", config=args.configs[0][1]))
    except Exception as e:  # noqa: BLE001 - no profiler here: the rest of the table still counts
        entry["profile_tau_1.3"] = {"routing_share": float("nan"), "error": f"{type(e).__name__}: {e}"}
    prof = entry["profile_tau_1.3"]
    print(f"  routing share at tau 1.3: {prof['routing_share']:.2%} ({prof.get('routing_ms')} of {prof.get('gpu_ms')}"
          f" ms; beyond the dense launches {prof.get('excess_ms')}, those {prof.get('dense_counterparts_ms')})"
          f" {prof.get('kernels_ms')}", flush=True)
    print(f"  ({time.time() - t0:.0f} s for the case)", flush=True)
    return entry


def verdicts(cases: list) -> list:
    """The issue's targets, checked per case (only where comfy-kitchen ran)."""
    lines = []
    for c in cases:
        m = c["methods"]
        tag = f"{c['tokens']}x{c['heads']} {c['family']}"
        extra = [n.split(" ", 2)[2] for n in m if n.startswith("sparse tau 1.3 +")]
        for kind, value in [*SETTINGS, *(("tau", e) for e in extra)]:
            ours, theirs = m.get(f"sparse {kind} {value}"), m.get(f"sol {kind} {value}")
            if ours is None or theirs is None:
                continue
            err_ok = ours["rel_l2"] <= 1.05 * theirs["rel_l2"]
            time_ok = ours["ms"] <= 0.6 * theirs["ms"]
            lines.append(f"{'ok ' if err_ok and time_ok else 'MISS'} {tag} {kind} {value}: error "
                         f"{ours['rel_l2']:.4f} vs {theirs['rel_l2']:.4f} ({'ok' if err_ok else 'over 1.05x'}), time "
                         f"{ours['ms'] / theirs['ms']:.2f}x sol's ({'ok' if time_ok else 'over 0.6x'})")
        allb = m["sparse all blocks"]["ms"] / m["dense"]["ms"]
        lines.append(f"{'ok ' if allb <= 1.1 else 'MISS'} {tag} every block routed: {allb:.2f}x dense")
        share = c["profile_tau_1.3"]["routing_share"]
        lines.append(f"{'ok ' if share <= 0.03 else 'MISS'} {tag} routing share {share:.2%} of the call")
        if (c["tokens"], c["heads"]) == (103950, 56) and "sparse tau 1.3" in m:
            x = m["sdpa"]["ms"] / m["sparse tau 1.3"]["ms"]
            lines.append(f"{'ok ' if x >= 6 else 'MISS'} {tag} tau 1.3: {x:.1f}x SDPA")
    return lines


def markdown(cases: list) -> str:
    """The results as docs/RESULTS.md's table: per case, ms / relative L2 / density of each method."""
    cols = ["sdpa", "dense", "sparse all blocks"] + [f"{w} {k} {v}" for k, v in SETTINGS for w in ("sol", "sparse")]
    extra = sorted({m.split("+")[1] for c in cases for m in c["methods"] if "+" in m}, key=int)
    cols += [f"{w} tau 1.3 +{n}" for n in extra for w in ("sol", "sparse")]
    head = ["tokens × heads, input (top-5 % blocks' mass)"] + cols
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cases:
        m = c["methods"]
        row = [f"{c['tokens']:,} × {c['heads']} {c['family']} ({c['concentration']['mass_in_top5pct_blocks']:.2f})"]
        for col in cols:
            r = m.get(col)
            if r is None:
                row.append("–")
                continue
            cell = f"{r['ms']:.1f} / {r['rel_l2']:.3f}"
            if "density" in r and col.split()[0] in ("sol", "sparse") and "all" not in col:
                cell += f" / {r['density']:.3f}"
            row.append(f"**{cell}**" if col.startswith("sparse") and "all" not in col else cell)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--families", default=",".join(si.FAMILIES))
    ap.add_argument("--settings", default=",".join(f"{k}:{v}" for k, v in SETTINGS),
                    help="routing settings per case, kind:value (tau or topk)")
    ap.add_argument("--extra", default="128,256", help="extra_tokens budgets run at tau 1.3 (0 or empty: none)")
    ap.add_argument("--rows", type=int, default=2048, help="query rows the error is measured on")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pv", default="default", help="P·V precisions of the sparse columns, the first one the "
                    "main column: default (this GPU's), fp8, int8, fp16, fp8+residual")
    ap.add_argument("--pick", help="bench/sparse_ab.py's pick (JSON): its TUNING, and its P·V as the main column "
                    "(then this GPU's default beside it)")
    ap.add_argument("--out", default=str(Path(os.environ.get("OUT", RESULTS)) / "sparse_bench.json"))
    ap.add_argument("--markdown", help="print the table of a results JSON and exit")
    args = ap.parse_args(argv)
    if args.markdown:
        data = json.loads(Path(args.markdown).read_text())
        print(markdown(data["cases"]))
        print("\n".join(data.get("verdicts") or verdicts(data["cases"])))
        return
    if args.pick:
        pick = json.loads(Path(args.pick).read_text())
        sparse_launch.TUNING.update(pick["tuning"])
        if args.pv == "default":
            args.pv = pick["pv"] if pick["pv"] == "fp8" else f"{pick['pv']},default"
    args.settings = [(kind, float(value)) for kind, value in (x.split(":") for x in args.settings.split(",") if x)]
    args.extra = [int(x) for x in args.extra.split(",") if x and int(x)]
    arch = detect_arch()
    args.configs = [(pv, resolve_config(arch, 128, pv_precision=None if pv == "default" else pv)[0])
                    for pv in args.pv.split(",")]
    sol, version = kitchen_sol()
    env = environment()
    env["comfy_kitchen"] = version
    env["sparse_tuning"] = dict(sparse_launch.TUNING)
    env["sparse_pv"] = [(pv, cfg.pv_choice()) for pv, cfg in args.configs]
    print(env, flush=True)
    cases = []
    for shape in args.shapes.split(","):
        T, H = (int(x) for x in shape.split("x"))
        for family in args.families.split(","):
            cases.append(bench_case(T, H, family, sol, args))
            torch.cuda.empty_cache()
            write_json(Path(args.out), {"environment": env, "cases": cases, "verdicts": verdicts(cases)})
    print("\n".join(verdicts(cases)))


if __name__ == "__main__":
    main()
