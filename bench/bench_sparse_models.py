"""Sparse attention at model level: Wan 2.1 1.3B at 720p x 81 frames (75,600 tokens), random weights.

    COMFYUI_PATH=... python bench/bench_sparse_models.py [--runs 5] [--steps 20] [--out ...]
    TRITON_INTERPRET=1 COMFYUI_PATH=... python bench/bench_sparse_models.py --tiny --runs 1  # CPU smoke test

Random weights: the times are real, the images are not (speed only; the outputs' cosines say how far
sparse moves a forward of random weights, nothing about quality).

1. One forward of the cond+uncond batch (as a sampling step sends it), unpatched (ComfyUI's attention)
   against Patch Model Attention dense (defaults) and sparse (Sage Settings sparse = sol at tau 1.0, 1.3,
   1.5; top-k 10 %), and, where comfy-kitchen's ``sol_attn`` runs, core's Model Sparse Attention's routing
   on it (self-attention from 12,288 tokens, cross-attention on ComfyUI's attention). Issue 54's target:
   sparse tau 1.3 >= 3x unpatched.
2. A whole sampling run through ``comfy.sample.sample`` (20 steps, euler, cfg 5): unpatched, the pack's
   dense kernel, and sparse tau 1.3 with its default window (the first 20 % of the schedule dense).
   Target: >= 2.2x unpatched. The run summary of the sparse run (sparse calls, density, the calls left
   dense and why) goes into the JSON.
"""
from __future__ import annotations

import argparse
import sys
import time

import bench_models as bm  # also prepares ComfyUI (and the CPU for --tiny)
import comfy.sample
import torch
from common import RESULTS, cosine, environment, write_json
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.config.sparse_settings import SparseSettings
from sagetriton.nodes.patching import patch_model
from sagetriton.nodes.reporting import stats

MODEL = "wan21_720p"
bm.MODELS[MODEL] = ("WAN21_T2V", bm.WAN_1_3B, (1, 16, 21, 90, 160), 512, 4096, lambda g: {})  # 720x1280, 81 frames
bm.TINY[MODEL] = bm.TINY["wan21"]
TINY_LATENT = (1, 16, 6, 16, 16)  # 384 tokens: 6 blocks, enough for the sparse path
CFG = 5.0


def sparse(min_tokens: int, **kw) -> SageSettings:
    return SageSettings(sparse=SparseSettings(min_tokens=min_tokens, **kw))


def kitchen_sol_override(min_tokens: int, tau: float = 1.3, token_aug: int = 0):
    """An override with core's Model Sparse Attention routing on comfy-kitchen's ``sol_attn`` (no sinks:
    Wan's text is in cross-attention; ``token_aug``: core's extra_tokens, 256 by default in current core), or
    None where it does not run here (printed)."""
    try:
        import comfy_kitchen as ck

        sol = ck.sol_attn
        probe = torch.randn(1, 128, 2, 128, device=bm.DEVICE, dtype=torch.bfloat16)
        sol(probe, probe, probe, tau=tau)
    except Exception as e:  # noqa: BLE001 - not installed, no build for this GPU, another API
        print(f"comfy-kitchen sol_attn unavailable: {type(e).__name__}: {e}")
        return None

    def override(func, q, k, v, heads, mask=None, *args, **kwargs):
        b, n, width = q.shape
        if (mask is not None or args or kwargs.get("skip_reshape") or k.shape != q.shape or n < min_tokens
                or width // heads != 128):
            return func(q, k, v, heads, mask, *args, **kwargs)
        split = [t.view(b, n, heads, width // heads) for t in (q, k, v)]
        return sol(*split, tau=tau, scale=kwargs.get("scale"), token_aug=token_aug).to(q.dtype).reshape(b, n, width)

    return override


def forward_variants(base, min_tokens: int) -> dict:
    variants = {"unpatched": base, "patched dense (defaults)": patch_model(base, SageSettings())}
    for tau in (1.0, 1.3, 1.5):
        variants[f"sparse sol tau {tau}"] = patch_model(base, sparse(min_tokens, mode="sol", tau=tau))
    variants["sparse sol tau 1.3 +256 extra tokens"] = patch_model(base, sparse(min_tokens, mode="sol", tau=1.3,
                                                                                extra_tokens=256))
    variants["sparse top-k 10 %"] = patch_model(base, sparse(min_tokens, mode="top-k", topk_ratio=0.1))
    for extra in (0, 256):  # core's node before and after its extra_tokens default became 256
        kitchen = kitchen_sol_override(min_tokens, token_aug=extra)
        if kitchen is not None:
            name = "comfy-kitchen sol_attn tau 1.3 (core's routing)" + (f" +{extra} extra tokens" if extra else "")
            variants[name] = bm.with_override(base, kitchen)
    return variants


def timed_sample(patcher, steps: int):
    """Seconds of one sampling run, its output and the run summary the patch left (None unpatched)."""
    latent, pos, neg = bm.conditioning(MODEL)
    noise = comfy.sample.prepare_noise(latent, 0)
    before = stats.last_run()
    sync = torch.cuda.synchronize if bm.DEVICE == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = comfy.sample.sample(patcher, noise, steps, CFG, "euler", "simple", pos, neg, latent, seed=0,
                              disable_pbar=True)
    sync()
    seconds = time.perf_counter() - t0
    after = stats.last_run()
    return seconds, out.float().cpu(), (after if after != before else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="timed forwards per variant")
    ap.add_argument("--steps", type=int, default=None, help="sampling steps of the whole run (default 20; 5 tiny)")
    ap.add_argument("--skip-sampling", action="store_true", help="forwards only")
    ap.add_argument("--skip-forwards", action="store_true", help="the sampling runs only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU: checks this script, times nothing")
    args = ap.parse_args(argv)
    min_tokens = SparseSettings().min_tokens
    if args.tiny:
        bm.shrink_for_cpu_smoke_test()
        cls, unet, _, tokens, dim, extras = bm.MODELS[MODEL]
        bm.MODELS[MODEL] = (cls, unet, TINY_LATENT, tokens, dim, extras)
        min_tokens = 256
    elif not torch.cuda.is_available():
        sys.exit("bench_sparse_models.py needs a GPU (or --tiny)")
    steps = args.steps or (5 if args.tiny else 20)
    payload = {"env": environment(), "model": "Wan 2.1 1.3B (random weights: speed only)",
               "latent": list(bm.MODELS[MODEL][2]), "tokens": None, "rows": [], "sampling": []}
    latent = bm.MODELS[MODEL][2]
    payload["tokens"] = latent[2] * (latent[3] // 2) * (latent[4] // 2)
    print(payload["env"], payload["model"], "tokens", payload["tokens"], flush=True)

    base = bm.build(MODEL)
    variants = {} if args.skip_forwards else forward_variants(base, min_tokens)
    x, sigma, kwargs = bm.forward_inputs(base, MODEL)
    timed = bm.time_variants(variants, x, sigma, kwargs, args.runs) if variants else {}
    ref = timed.get("unpatched")
    for label, t in timed.items():
        row = dict(variant=label, seconds=t["seconds"], speedup=ref["seconds"] / t["seconds"],
                   paired_speedup=t["paired_speedup"], quartiles=t["quartiles"], runs=args.runs, peak_gib=t["peak_gib"],
                   calls=t["calls"], cosine_forward=cosine(t["out"], ref["out"]),
                   finite=bool(torch.isfinite(t["out"]).all()))
        payload["rows"].append(row)
        print(row, flush=True)

    if not args.skip_sampling:
        runs = {"unpatched": base, "patched dense (defaults)": patch_model(base, SageSettings()),
                "sparse sol tau 1.3, first 20 % dense": patch_model(base, sparse(min_tokens, mode="sol", tau=1.3))}
        ref_out = None
        for label, patcher in runs.items():
            seconds, out, summary = timed_sample(patcher, steps)
            ref_out = out if ref_out is None else ref_out
            row = dict(variant=label, steps=steps, seconds=seconds, cosine=cosine(out, ref_out),
                       finite=bool(torch.isfinite(out).all()),
                       summary=None if summary is None else {k: summary.get(k) for k in
                                                             ("kernel", "fallback", "sparse", "text")})
            payload["sampling"].append(row)
            print(row, flush=True)
        first = payload["sampling"][0]["seconds"]
        for row in payload["sampling"]:
            row["speedup"] = first / row["seconds"]

    print(f"{'variant':>48} {'s/forward':>10} {'speedup':>8} {'paired':>7} {'cos fwd':>8}")
    for r in payload["rows"]:
        print(f"{r['variant']:>48} {r['seconds']:10.4f} {r['speedup']:8.3f} {r['paired_speedup']:7.3f} "
              f"{r['cosine_forward']:8.5f}")
    for r in payload["sampling"]:
        print(f"{r['variant']:>48} {r['steps']} steps {r['seconds']:9.2f} s {r['speedup']:8.3f}x "
              f"cos {r['cosine']:.5f}")
    from pathlib import Path

    default = RESULTS.parent / "out" / "sparse_models_tiny.json" if args.tiny else RESULTS / "sm90_sparse_models.json"
    write_json(Path(args.out) if args.out else default, payload)


if __name__ == "__main__":
    main()
