"""The drop-in ``sageattention`` (``kernels/sageattention_compat.py``) against the reference SageAttention,
name by name, and what asking for the LSE costs, on a CUDA GPU.

    python bench/bench_dropin.py [--quick] [--out bench/results/sm90_dropin.json]
    python bench/bench_dropin.py --names sageattn_qk_int8_pv_fp8_cuda_sm90 --k-scales groups,keys --no-lse

``--k-scales``: per_thread's K scales on Hopper's Gluon kernel (``hopper_host.TUNING["k_groups"]``): SageAttention's
sm90 groups, per key, or both in turn per shape (an A/B in one process; ``ours`` is the first).

Each of the six names is called as the engines call it (yunchang: NHD, ``return_lse=True``, its
``pv_accum_dtype``; diffusers' varlen: two packed sequences) on ours and on the reference's same name,
in one run: median time of ``do_bench`` over rotating input sets, and the cosine of each output against
fp32 attention on a slice of heads. The reference is the CUDA SageAttention importable as
``sageattention`` (built from source: bench/NOTES.md); a name it does not provide on this GPU (its
sm89 kernel on an H200) is reported as such. Then ``sageattn`` with and without ``return_lse`` from 8K
to 64K tokens: ring attention asks for the LSE at every step (issue: within 2 %).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from common import RESULTS, cosine, environment, import_pack, write_json
from torch.nn.attention import SDPBackend, sdpa_kernel

import_pack()
from sagetriton.installer.selftest import alternating  # noqa: E402
from sagetriton.kernels import sageattention_compat as ours  # noqa: E402

SHAPES = [(1, 24, 8192, 128), (1, 24, 16384, 128), (1, 12, 32768, 128)]  # (B, H, L, D), as bench_kernels
QUICK = [(1, 24, 16384, 128)]
LSE_LENGTHS = [8192, 16384, 32768, 65536]
LSE_HEADS = 24
# How the engines call each name (yunchang's AttnType.SAGE_* partials; xDiT and diffusers call sageattn).
CALLS = {
    "sageattn": {},
    "sageattn_qk_int8_pv_fp16_triton": {},
    "sageattn_qk_int8_pv_fp16_cuda": {"pv_accum_dtype": "fp32"},
    "sageattn_qk_int8_pv_fp8_cuda": {"pv_accum_dtype": "fp32+fp32"},
    "sageattn_qk_int8_pv_fp8_cuda_sm90": {"pv_accum_dtype": "fp32+fp32"},
}
SETS = 3  # rotating input sets: no call is served from L2


def reference_module():
    """The CUDA SageAttention as a module, or None (printed why). Never this pack's own drop-in."""
    try:
        import sageattention
    except ImportError as e:
        print(f"reference SageAttention not importable ({e}): only ours is timed")
        return None
    if hasattr(sageattention, "PACK_DIR") or "sagetriton" in str(getattr(sageattention, "__file__", "")):
        sys.exit("`sageattention` here is SageTriton's drop-in, not the reference: put the CUDA build first on "
                 "PYTHONPATH (or run install.py --remove-sageattention)")
    return sageattention


@contextmanager
def gluon_runs():
    """Inside the block, the list gets which Hopper Gluon kernel each of our calls ran (per tile or per key
    K scales), for calls not replayed (the first of each shape)."""
    from sagetriton.kernels import hopper_host

    ran: list = []
    real = hopper_host.run_shared_kv

    def noting(*a, **kw):
        ok = real(*a, **kw)
        ran.append(f"gluon, K {('per tile', 'per key', 'per group')[kw.get('k_cols', 0)]}" if ok else "portable")
        return ok

    hopper_host.run_shared_kv = noting
    try:
        yield ran
    finally:
        hopper_host.run_shared_kv = real


def k_groups(choice: str) -> None:
    """per_thread's K scales on the Gluon kernel from now on: "groups" or "keys" (calls are re-planned: the replay
    key holds the choice)."""
    from sagetriton.kernels import hopper_host

    hopper_host.TUNING["k_groups"] = {"groups": True, "keys": False}[choice]


def timed(fn, sets) -> float:
    return triton.testing.do_bench(alternating(fn, sets), warmup=25, rep=200, return_mode="median")


def exact_slice(q, k, v, heads=2):
    """fp32 attention (memory-efficient SDPA, nothing materialized) of the first ``heads`` heads, NHD."""
    qs, ks, vs = (t[:, :, :heads].transpose(1, 2).float() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2)


def tops(shape, ms) -> float:
    B, H, L, D = shape
    return 4 * B * H * L * L * D / (ms * 1e-3) / 1e12


def one(fn, sets, exact, label) -> dict:
    """Time and accuracy of ``fn(q, k, v)`` (its first output), or the error it raised."""
    try:
        out = fn(*sets[0])
        out = out[0] if isinstance(out, tuple) else out
        torch.cuda.synchronize()
        ms = timed(fn, sets)
    except Exception as e:  # noqa: BLE001 - a reference name not built for this GPU: reported, not fatal
        print(f"  {label:10s} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return {"error": f"{type(e).__name__}: {e}"}
    c = cosine(out[:, :, :exact.shape[2]], exact)
    return {"ms": round(ms, 4), "cos": round(c, 6)}


def bench_names(shape, ref, names=None, k_scales=("groups",)) -> list:
    B, H, L, D = shape
    sets = [[torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(SETS)]
    exact = exact_slice(*sets[0])
    rows = []
    for name, kw in CALLS.items():
        if names and name not in names:
            continue
        row = {"name": name, "shape": shape, "layout": "NHD", "return_lse": True, "kwargs": kw}
        # ours under each K layout asked for (the first is "ours"; the others only where per_thread may take the
        # Gluon kernel: fp8 P·V), then the reference
        layouts = k_scales if "pv_fp8" in name else k_scales[:1]
        whos = [("ours" if i == 0 else f"ours_k_{ks}", ours, ks) for i, ks in enumerate(layouts)]
        for who, mod, ks in whos + [("reference", ref, None)]:
            if mod is None:
                continue
            fn = getattr(mod, name)
            if ks is not None:
                k_groups(ks)
            with gluon_runs() as ran:
                row[who] = one(lambda q, k, v, fn=fn, kw=kw: fn(q, k, v, tensor_layout="NHD", return_lse=True, **kw),
                               sets, exact, who)
            if ks is not None:  # which kernel served the name (per_thread: the Gluon kernel's grouped or per-key K)
                row[who]["kernel"] = ran[0] if ran else "portable"
        k_groups(k_scales[0])
        rows.append(row)
        _print_row(row)
        for who, _, _ in whos[1:]:
            if "ms" in row[who] and "ms" in row["ours"]:
                print(f"  {who}: {row[who]['ms']:.3f} ms [{row[who]['kernel']}] cos {row[who]['cos']:.5f}; "
                      f"ours/{who} speed {row[who]['ms'] / row['ours']['ms']:.3f}x", flush=True)
    if names and "sageattn_varlen" not in names:
        return rows
    # diffusers' sage_varlen: the batch's sequences packed, two of L/2 tokens each.
    packed = [[t.reshape(B * L, H, D) for t in s] for s in sets]
    cu = torch.tensor([0, L // 2, L], dtype=torch.int32, device="cuda") if B == 1 else \
        torch.arange(0, B * L + 1, L // 2, dtype=torch.int32, device="cuda")
    exact_v = torch.cat([exact_slice(*(t[:, a:b] for t in sets[0])) for a, b in ((0, L // 2), (L // 2, L))], 1)
    row = {"name": "sageattn_varlen", "shape": shape, "layout": "packed (2 sequences)", "return_lse": False}
    for who, mod in (("ours", ours), ("reference", ref)):
        if mod is None:
            continue
        fn = mod.sageattn_varlen
        row[who] = one(lambda q, k, v, fn=fn: fn(q, k, v, cu, cu, L // 2, L // 2).reshape(B, L, H, D), packed,
                       exact_v, who)
    rows.append(row)
    _print_row(row)
    return rows


def _print_row(row) -> None:
    ours_r, ref_r = row.get("ours", {}), row.get("reference", {})
    ratio = ""
    if "ms" in ours_r and "ms" in ref_r:
        row["speedup"] = round(ref_r["ms"] / ours_r["ms"], 3)
        ratio = f"  ours/ref speed {row['speedup']:.3f}x"
    line = f"{row['name']:36s} {str(tuple(row['shape'])):22s}"
    if "kernel" in ours_r:
        line += f" [{ours_r['kernel']}]"
    for who, r in (("ours", ours_r), ("ref", ref_r)):
        if "ms" in r:
            line += f"  {who} {r['ms']:8.3f} ms ({tops(row['shape'], r['ms']):5.0f} TOPS) cos {r['cos']:.5f}"
        elif r:
            line += f"  {who} unavailable"
    print(line + ratio, flush=True)


def bench_lse(lengths, ref, rounds: int = 5) -> list:
    """``sageattn`` with and without ``return_lse``, NHD as yunchang calls it; the reference's too. Each
    round times both, the order swapped every round (clock and thermal drift fall on both alike); the
    cost is the median of the rounds' ratios, and the spread of those ratios is kept beside it."""
    rows = []
    for L in lengths:
        shape = (1, LSE_HEADS, L, 128)
        sets = [[torch.randn(1, L, LSE_HEADS, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
                for _ in range(2)]
        row = {"shape": shape, "rounds": rounds}
        for who, mod in (("ours", ours), ("reference", ref)):
            if mod is None:
                continue
            calls = (lambda q, k, v, m=mod: m.sageattn(q, k, v, tensor_layout="NHD"),
                     lambda q, k, v, m=mod: m.sageattn(q, k, v, tensor_layout="NHD", return_lse=True))
            try:
                times = [[], []]
                for i in range(rounds):
                    for j in ((0, 1) if i % 2 == 0 else (1, 0)):
                        times[j].append(timed(calls[j], sets))
            except Exception as e:  # noqa: BLE001
                row[who] = {"error": f"{type(e).__name__}: {e}"}
                continue
            ratios = sorted(b / a for a, b in zip(*times, strict=True))
            row[who] = {"ms": round(statistics.median(times[0]), 4), "ms_lse": round(statistics.median(times[1]), 4),
                        "lse_cost": round(statistics.median(ratios) - 1, 4),
                        "lse_cost_range": [round(ratios[0] - 1, 4), round(ratios[-1] - 1, 4)]}
        rows.append(row)
        print(f"LSE {L:6d} tokens x {LSE_HEADS} heads ({rounds} rounds): " + "  ".join(
            f"{who} {r['ms']:.3f} ms, with LSE {r['ms_lse']:.3f} ms ({100 * r['lse_cost']:+.1f} %, rounds "
            f"{100 * r['lse_cost_range'][0]:+.1f}..{100 * r['lse_cost_range'][1]:+.1f} %)"
            for who, r in row.items() if isinstance(r, dict) and "ms" in r), flush=True)
        del sets
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one shape, LSE at 8K and 32K")
    ap.add_argument("--lse-only", action="store_true", help="only what the LSE costs, not the six names")
    ap.add_argument("--rounds", type=int, default=5, help="LSE: rounds of both timings, order swapped each round")
    ap.add_argument("--no-reference", action="store_true", help="time only this pack (no SageAttention import)")
    ap.add_argument("--out", type=Path, help="JSON results (default bench/results/<gpu>_dropin.json)")
    ap.add_argument("--names", help="comma-separated names to time (default: all six)")
    ap.add_argument("--shapes", help="B,H,L,D;... shapes of the names (default: 8K x 24, 16K x 24, 32K x 12)")
    ap.add_argument("--k-scales", default="groups", help="groups, keys or groups,keys: per_thread's K on Hopper's "
                                                          "Gluon kernel (the first is \"ours\")")
    ap.add_argument("--no-lse", action="store_true", help="skip the LSE cost part")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_dropin.py needs a CUDA GPU")
    env = environment()
    ref = None if args.no_reference else reference_module()
    env["reference"] = getattr(ref, "__file__", None)
    print(env)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")] if args.shapes else \
        (QUICK if args.quick else SHAPES)
    k_scales = tuple(args.k_scales.split(","))
    assert set(k_scales) <= {"groups", "keys"}, args.k_scales
    env["k_scales"] = list(k_scales)
    k_groups(k_scales[0])
    names = [] if args.lse_only else [row for shape in shapes for row in bench_names(
        shape, ref, args.names.split(",") if args.names else None, k_scales)]
    lse = [] if args.no_lse else bench_lse([8192, 32768] if args.quick else LSE_LENGTHS, ref, max(1, args.rounds))
    slow = [r["name"] for r in names if r.get("speedup", 1) < 1]
    costly = [r["shape"][2] for r in lse if r.get("ours", {}).get("lse_cost", 0) > 0.02]
    print(f"names slower than the reference: {slow or 'none'}; LSE over 2 % at: {costly or 'none'}")
    major, minor = torch.cuda.get_device_capability()
    out = args.out or RESULTS / f"sm{major}{minor}_dropin{'_lse' if args.lse_only else ''}.json"
    write_json(out, {**env, "names": names, "lse": lse})
    return 0


if __name__ == "__main__":
    sys.exit(main())
