"""torch.compile of a patched model (issue 49): Flux and Wan at real sizes, random weights, one GPU.

    COMFYUI_PATH=... python bench/compile_models.py [--models flux,wan21] [--runs 7] [--out ...]
    python bench/compile_models.py --tiny --backend eager   # CPU smoke test of this script: times nothing

Compiled as ComfyUI's TorchCompileModel node compiles (``comfy_api.torch_helpers.set_torch_compile_wrapper``,
inductor by default), in both orders the graph can have: Patch Model Attention then TorchCompileModel, and the
other way round. Per model, one cond+uncond forward (as a sampling step sends it) of: the unpatched model,
the patched model, the patched model compiled in each order (and with --unpatched-compiled the unpatched
model compiled); timed in
interleaved rounds after warm-up (which holds the compilation, timed apart), with the kernel calls of one
forward, the cosine of each output to the unpatched one and to the uncompiled patched one, and 4 sampling
steps of each patched variant against the uncompiled patched model's (same kernel calls, near-same output:
inductor rounds the model's other ops its own way). The attention override is a graph break (the dispatcher
runs eagerly, ``nodes/routing/forward_plan.py``); RoPE in a compiled forward is ComfyUI's, fused by inductor.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

import bench_models as bm
import torch
from bench_models import build, forward_inputs, sample4, sampling_options, time_variants
from common import RESULTS, cosine, environment, write_json
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model
from sagetriton.nodes.reporting import stats

PATCHED = "patched"
ORDERS = {"patched, then compiled": "patch_then_compile", "compiled, then patched": "compile_then_patch"}


def compiled(model, backend: str, mode=None):
    """``model`` as TorchCompileModel gives it: a clone with ComfyUI's compile wrapper."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    m = model.clone()
    set_torch_compile_wrapper(model=m, backend=backend, mode=mode)
    return m


def variants_of(base, backend: str, mode=None, unpatched_compiled: bool = False) -> dict:
    settings = SageSettings()
    variants = {"unpatched": base, PATCHED: patch_model(base, settings),
                "patched, then compiled": compiled(patch_model(base, settings), backend, mode),
                "compiled, then patched": patch_model(compiled(base, backend, mode), settings)}
    if unpatched_compiled:  # one graph of the whole model: minutes of inductor at Flux's size
        variants["unpatched, compiled"] = compiled(base, backend, mode)
    return variants


def first_forwards(variants: dict, x, sigma, kwargs) -> dict:
    """Seconds of each variant's first forward (the compiled ones compile there)."""
    sync = torch.cuda.synchronize if bm.DEVICE == "cuda" else (lambda: None)
    out = {}
    with torch.no_grad():
        for label, patcher in variants.items():
            sync()
            t0 = time.perf_counter()
            patcher.model.apply_model(x, sigma, transformer_options=sampling_options(patcher), **kwargs)
            sync()
            out[label] = time.perf_counter() - t0
            print(f"first forward of {label}: {out[label]:.1f} s", flush=True)  # in the log even if cut short
    return out


def bench_model(name: str, runs: int, backend: str, mode=None, unpatched_compiled: bool = False) -> list:
    torch._dynamo.reset()
    base = build(name)
    variants = variants_of(base, backend, mode, unpatched_compiled)
    x, sigma, kwargs = forward_inputs(base, name)
    first = first_forwards(variants, x, sigma, kwargs)
    timed = time_variants(variants, x, sigma, kwargs, runs)
    ref, patched = timed["unpatched"], timed[PATCHED]
    samples = {}
    for label in (PATCHED, *ORDERS):
        samples[label] = (sample4(variants[label], name), stats.last_run())
    rows = []
    for label, t in timed.items():
        row = dict(model=name, variant=label, backend=backend if "compiled" in label else None, mode=mode,
                   seconds=t["seconds"], quartiles=t["quartiles"], runs=runs, first_forward_s=first[label],
                   speedup_vs_unpatched=ref["seconds"] / t["seconds"],
                   speedup_vs_patched=patched["seconds"] / t["seconds"], paired_vs_unpatched=t["paired_speedup"],
                   peak_gib=t["peak_gib"], calls=t["calls"], cosine_vs_unpatched=cosine(t["out"], ref["out"]),
                   cosine_vs_patched=cosine(t["out"], patched["out"]), finite=bool(torch.isfinite(t["out"]).all()))
        if label in samples:
            out, run = samples[label]
            row.update(cosine_4_steps_vs_patched=cosine(out, samples[PATCHED][0]), run_kernel=run["kernel"],
                       run_fallback=run["fallback"], run_rope=run["rope"], rope_off=run.get("rope_off"))
        rows.append(row)
        print(row, flush=True)
    kernel = {label: timed[label]["calls"]["kernel"] for label in (PATCHED, *ORDERS)}
    if len(set(kernel.values())) != 1 or not kernel[PATCHED]:
        print(f"BAD {name}: kernel calls per forward differ or are none: {kernel}", flush=True)
    del base, variants, timed
    gc.collect()
    if bm.DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="flux,wan21")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (TorchCompileModel's default)")
    ap.add_argument("--mode", default=None, help="torch.compile mode (default: none, as TorchCompileModel)")
    ap.add_argument("--unpatched-compiled", action="store_true",
                    help="also the unpatched model compiled (a control: what compile gives without the patch)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiny", action="store_true", help="tiny configs on the CPU: checks this script, times nothing")
    args = ap.parse_args(argv)
    if args.tiny:
        bm.shrink_for_cpu_smoke_test()
    elif not torch.cuda.is_available():
        sys.exit("compile_models.py needs a GPU")
    payload = {"env": environment(), "rows": []}
    print(payload["env"], flush=True)
    for name in args.models.split(","):
        payload["rows"] += bench_model(name, args.runs, args.backend, args.mode, args.unpatched_compiled)
    print(f"{'model':>6} {'variant':>24} {'s/forward':>10} {'1st fwd s':>9} {'vs unpatched':>12} {'vs patched':>10} "
          f"{'cos unp.':>8} {'cos patched':>11} {'cos 4 steps':>11}  kernel calls")
    for r in payload["rows"]:
        steps = r.get("cosine_4_steps_vs_patched")
        print(f"{r['model']:>6} {r['variant']:>24} {r['seconds']:10.4f} {r['first_forward_s']:9.2f} "
              f"{r['speedup_vs_unpatched']:12.3f} {r['speedup_vs_patched']:10.3f} {r['cosine_vs_unpatched']:8.5f} "
              f"{r['cosine_vs_patched']:11.5f} {'' if steps is None else f'{steps:11.5f}':>11}  "
              f"{r['calls']['kernel']}")
    from pathlib import Path

    default = RESULTS.parent / "out" / "compile_tiny.json" if args.tiny else RESULTS / "compile_models.json"
    write_json(Path(args.out) if args.out else default, payload)


if __name__ == "__main__":
    main()
