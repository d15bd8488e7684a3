"""RoPE before attention, alone: ComfyUI's own (0.3.64's inline a * b + c * d, 0.3.75's addcmul_
``apply_rope``), comfy-kitchen's fused ``apply_rope`` (what current ComfyUI calls), and the pack's kernel
(``kernels.rope``), on Flux's and Wan's call shapes. Interleaved rounds, CUDA events, medians.

    python bench/rope_cost.py --out bench/results/sm90_rope_cost.json
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from common import RESULTS, environment, write_json
from sagetriton.kernels import reference, rope

# (label, q/k shape, layout): Flux-dev 1024² (cond + uncond), Wan 2.1 1.3B 480p 81 frames (B, L, H, D).
SHAPES = (("Flux 2x24x4608x128", (2, 24, 4608, 128), "BHLD"), ("Wan 2x32760x12x128", (2, 32760, 12, 128), "BLHD"))


def kitchen_rope():
    try:
        import comfy_kitchen

        return comfy_kitchen.apply_rope
    except Exception as e:  # noqa: BLE001 - not installed, or no build for this GPU
        print(f"comfy-kitchen unavailable: {type(e).__name__}: {e}")
        return None


def inputs_for(shape: tuple, layout: str):
    """bf16 q and k of ``shape`` and RoPE matrices laid out for it (Wan's (B, L, H, D): (1, L, 1, ...))."""
    q, k = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    length, half = shape[2] if layout == "BHLD" else shape[1], shape[3] // 2
    f = reference.rope_matrices(length, half, device="cuda")
    return q, k, (f if layout == "BHLD" else f.movedim(1, 2))


def variants_for(q, k, f, ck) -> dict:
    both = {"ComfyUI 0.3.64 (inline)": False, "ComfyUI 0.3.75 (apply_rope)": True}
    out = {name: (lambda fma=fma: (reference.rope(q, f, fma), reference.rope(k, f, fma))) for name, fma in both.items()}
    out["SageTriton kernel"] = lambda: rope.apply(q, f, k, fma=True)
    if ck is not None:
        out["comfy-kitchen apply_rope"] = lambda: ck(q, k, f)
    return out


def time_ms(fn, reps: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def sweep(args):
    """The kernel's rows per program and warps, interleaved, on each shape."""
    payload = {"env": environment(), "rows": []}
    tiles = [(b, w) for b in (4, 8, 16, 32) for w in (1, 2, 4, 8) if b * 128 // (32 * w) >= 4]
    for label, shape, layout in SHAPES:
        q, k, f = inputs_for(shape, layout)
        times = {t: [] for t in tiles}
        for _ in range(args.rounds):
            for t in tiles:
                rope.BLOCK_ROWS, rope.NUM_WARPS = t
                times[t].append(time_ms(lambda q=q, f=f, k=k: rope.apply(q, f, k, fma=True)))
        moved = 4 * q.numel() * q.element_size()
        for (b, w), ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(ts)
            row = dict(shape=label, rows=b, warps=w, ms=round(ms, 4), tb_per_s=round(moved / ms / 1e9, 2))
            payload["rows"].append(row)
            print(row, flush=True)
    write_json(Path(args.out), payload)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "sm90_rope_cost.json"))
    ap.add_argument("--sweep", action="store_true", help="only the kernel, each rows-per-program / warps pair")
    args = ap.parse_args(argv)
    if args.sweep:
        return sweep(args)
    ck = kitchen_rope()
    payload = {"env": environment(), "rows": []}
    for label, shape, layout in SHAPES:
        q, k, f = inputs_for(shape, layout)
        variants = variants_for(q, k, f, ck)
        times = {name: [] for name in variants}
        for r in range(args.rounds):
            names = list(variants)
            for name in names[r % len(names):] + names[:r % len(names)]:
                try:
                    times[name].append(time_ms(variants[name]))
                except Exception as e:  # noqa: BLE001 - a competitor that cannot take this shape: say so
                    print(f"{label} {name}: {type(e).__name__}: {str(e)[:200]}")
                    variants[name] = None
                    break
            variants = {n: v for n, v in variants.items() if v is not None}
        moved = 4 * q.numel() * q.element_size()  # q and k read once, written once
        for name, ts in times.items():
            if not ts:
                continue
            ms = statistics.median(ts)
            row = dict(shape=label, variant=name, ms=round(ms, 4), rounds=[round(t, 4) for t in ts],
                       tb_per_s=round(moved / ms / 1e9, 2))
            payload["rows"].append(row)
            print(row, flush=True)
    write_json(Path(args.out), payload)


if __name__ == "__main__":
    main()
