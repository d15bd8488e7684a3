"""What the Q/K rotation costs per launch variant (``rotation.METHOD``, issue 42 item 2); one GPU, one process.

    python bench/rotation_cost_ab.py --out bench/results/sm90_rotation_cost_ab.json [--rounds 5]
    python bench/rotation_cost_ab.py --kernels --out ...   # where a whole 8K call's time goes, clock and power

For 2x24x8192x128, 1x24x16384x128 and 1x12x32768x128 bf16 (random inputs): whole ``sageattn`` calls
(do_bench medians per round, rounds interleaved with a rotating start, then the median over rounds) and the Q
and K quantization launches alone (device time per kernel from torch.profiler, L2 flushed before each call),
for no rotation, today's rotation ("dot") and each variant. Accuracy: each variant's output against "dot"
on the same inputs (cosine >= 0.99999 expected), and on the massive-channel and outlier-key cases against
fp32 math attention (cosine >= 0.9995). Targets: rotation <= 1 % of a call at 8K; >= 1.47x / 1.55x SDPA.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from accuracy_cases import make_case
from common import RESULTS, cosine, environment, import_pack, write_json

import_pack()
from sagetriton.kernels import api, replay, rotation  # noqa: E402
from sagetriton.kernels.arch import default_config, detect_arch  # noqa: E402

SHAPES = [(2, 24, 8192, 128), (1, 24, 16384, 128), (1, 12, 32768, 128)]
BASE = "no rotation"


def variants(D: int, pdl: bool = True) -> dict:
    cfg = default_config(detect_arch(torch.device("cuda")), D)
    cfg = cfg if pdl else cfg.replace(pdl=False)
    plain, rot = cfg.replace(qk_rotation=False), cfg.replace(qk_rotation=True)

    def make(c, method):
        def run(q, k, v):
            if rotation.METHOD != method:
                rotation.METHOD = method
                replay.clear()
            return api.attention_forward(q, k, v, "HND", False, None, None, False, c, True, False)[0]
        return run
    return {BASE: make(plain, "dot"), **{m: make(rot, m) for m in rotation.METHODS}}


def device_events(fn, qkv, calls: int) -> list:
    """The GPU kernels of ``calls`` calls of ``fn`` (torch.profiler), each call after an L2 flush."""
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    fn(*qkv)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            fn(*qkv)
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def quant_us(fn, qkv, calls: int = 10) -> dict:
    """Median device µs of the call's Q and K quantization launches (the first and second
    ``quantize_int8_kernel`` of each call), each call after an L2 flush."""
    events = sorted((e for e in device_events(fn, qkv, calls) if "quantize_int8_kernel" in e.name),
                    key=lambda e: e.time_range.start)
    durs = [e.time_range.elapsed_us() for e in events]
    if len(durs) != 2 * calls:
        return {"q_us": None, "k_us": None, "launches": len(durs)}
    q, k = durs[0::2], durs[1::2]
    return {"q_us": statistics.median(q), "k_us": statistics.median(k),
            "qk_us": statistics.median(a + b for a, b in zip(q, k, strict=True))}


def kernel_breakdown(shape=(2, 24, 8192, 128), names=(BASE, "dot", "tiled"), calls: int = 20) -> dict:
    """Where a whole call's time goes, per variant, with and without PDL (which lets a launch start while the
    one before it ends, so a profiled launch time includes its wait): device µs per call of each kernel
    (torch.profiler, L2 flushed before each call), the call's median, and the SM clock and power drawn
    (nvidia-smi every 100 ms) over 3 s of back-to-back calls: a slower attention kernel on rotated operands
    would show up here."""
    import subprocess

    qkv = tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = {}
    for pdl, name in itertools.product((True, False), names):
        fn = variants(shape[3], pdl)[name]
        name = f"{name}{'' if pdl else ', no PDL'}"
        per = {}
        for e in device_events(fn, qkv, calls):
            if "elementwise" not in e.name and "fill" not in e.name:  # the L2 flush (a torch fill kernel)
                per[e.name[:48]] = per.get(e.name[:48], 0.0) + e.time_range.elapsed_us() / calls
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                "-lms", "100"], stdout=subprocess.PIPE, text=True)
        t_end = time.time() + 3.0
        while time.time() < t_end:
            fn(*qkv)
        torch.cuda.synchronize()
        smi.terminate()
        samples = [tuple(float(x) for x in line.split(",")) for line in smi.communicate()[0].splitlines()
                   if line.count(",") == 1]
        clock = statistics.median(c for c, _ in samples) if samples else None
        power = statistics.median(p for _, p in samples) if samples else None
        ms = triton.testing.do_bench(lambda f=fn: f(*qkv), warmup=25, rep=150, return_mode="median")
        out[name] = dict(kernels_us=per, call_ms=ms, sm_clock_mhz=clock, power_w=power)
        print(f"{name:21} call {ms * 1e3:7.1f} µs, clock {clock} MHz, power {power} W; "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])), flush=True)
    return out


def speed(rounds: int, methods: list) -> list:
    rows = []
    for shape in SHAPES:
        B, H, L, D = shape
        qkv = tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fns = {"sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
               **{n: f for n, f in variants(D).items() if n in (BASE, *methods)}}
        alone = variants(D, pdl=False)
        ref_out = fns["dot"](*qkv).float()
        check = {}
        for name in methods:
            out = fns[name](*qkv).float()
            check[name] = dict(cos_vs_dot=cosine(out, ref_out), max_abs_vs_dot=(out - ref_out).abs().max().item())
        # without PDL each launch's time is its own (with it, a launch's time includes its wait for the one before)
        quant = {name: quant_us(alone[name], qkv) for name in fns if name != "sdpa"}
        times = {name: [] for name in fns}
        for r in range(rounds):
            names = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
            for name in names:
                times[name].append(triton.testing.do_bench(lambda f=fns[name], x=qkv: f(*x), warmup=25, rep=150,
                                                           return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        tops = {name: 4 * B * H * L * L * D / (m * 1e-3) / 1e12 for name, m in ms.items()}
        row = dict(shape="x".join(map(str, shape)), ms=ms, per_round=times, tops=tops,
                   x_sdpa={n: ms["sdpa"] / m for n, m in ms.items()},
                   pct_vs_no_rotation={n: 100.0 * (ms[n] / ms[BASE] - 1.0) for n in ms if n != "sdpa"},
                   quant=quant, check=check)
        rows.append(row)
        print(f"\n{row['shape']}  (sdpa {ms['sdpa']:.3f} ms)")
        print(f"{'variant':12} {'TOPS':>7} {'x SDPA':>7} {'% vs none':>9} {'Q µs':>7} {'K µs':>7} {'cos vs dot':>11}")
        for n in [BASE, *methods]:
            qu, c = quant[n], check.get(n, {})
            fmt = lambda x: f"{x:7.1f}" if x is not None else "      ?"  # noqa: E731
            print(f"{n:12} {tops[n]:7.1f} {row['x_sdpa'][n]:7.3f} {row['pct_vs_no_rotation'][n]:+9.2f} "
                  f"{fmt(qu.get('q_us'))} {fmt(qu.get('k_us'))} {c.get('cos_vs_dot', float('nan')):11.7f}", flush=True)
        del qkv
    return rows


def accuracy(methods: list) -> list:
    rows = []
    fns = {n: f for n, f in variants(128).items() if n in (BASE, *methods)}
    for case in ("massive_channels", "outlier_key", "randn"):
        q, k, v = make_case(case, device="cuda")
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        row = {"case": case}
        for name, fn in fns.items():
            row[name] = cosine(fn(q, k, v).float(), exact)
        rows.append(row)
        print(case, {n: f"{c:.5f}" for n, c in row.items() if n != "case"}, flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kernels", action="store_true", help="only the per-kernel breakdown, clock and power at 8K")
    ap.add_argument("--methods", default=",".join(rotation.METHODS), help="comma-separated rotation.METHODS")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    unknown = set(methods) - set(rotation.METHODS)
    if unknown or "dot" not in methods:
        ap.error(f"--methods: unknown {sorted(unknown)} (choose from {rotation.METHODS}); 'dot' is the reference")
    t0 = time.perf_counter()
    payload = {"env": environment(), "methods": methods}
    print(payload["env"], flush=True)
    if args.kernels:
        payload["kernels"] = kernel_breakdown(names=(BASE, *methods))
    else:
        payload["accuracy"] = accuracy(methods)
        payload["speed"] = speed(args.rounds, methods)
    rotation.METHOD = "auto"
    payload["seconds"] = time.perf_counter() - t0
    arch = detect_arch(torch.device("cuda")).arch
    write_json(Path(args.out) if args.out else RESULTS / f"{arch}_rotation_cost_ab.json", payload)
    print(f"{payload['seconds']:.0f} s")


if __name__ == "__main__":
    main()
