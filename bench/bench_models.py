"""End-to-end speed at real model sizes: ComfyUI's own model classes, random weights, one GPU.

    COMFYUI_PATH=... python bench/bench_models.py [--models wan21,flux,sdxl] [--out ...]
    (also sd15; flux2 and z_image need ComfyUI 0.3.75 or newer)

For each model: one full forward of the cond+uncond batch (as the sampler sends it), unpatched
(ComfyUI's default attention) vs through Patch Model Attention with default settings, and with
the kernel forced on every call (min_seq_len=0) to show where the crossover matters, without the
Q/K rotation, with INT8 P·V, with the ``fp8+residual`` P·V precision (at its own crossover), and, when the
``sageattention`` package is importable, with ComfyUI's own ``attention_sage`` (the reference
library) on every call, as ``--use-sage-attention`` would run it, and Sage Settings' ``backend`` choice for
each other backend installed here (SageAttention, comfy-kitchen, SDPA): the calls our kernel would take
run on that backend instead, side by side. Medians of
several runs after warm-up, peak GPU memory, fallback share by reason, cosine of the patched
output to the unpatched one, and the same after 4 sampling steps through ``comfy.sample.sample``.
"""
from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time

from common import RESULTS, cosine, environment, find_comfyui, import_pack, write_json

COMFY = find_comfyui()
if COMFY is None:
    sys.exit("bench_models.py needs ComfyUI (set COMFYUI_PATH)")
sys.path.insert(0, str(COMFY))

import torch  # noqa: E402

import_pack()
if "--tiny" in sys.argv:  # CPU smoke test: ComfyUI must not look for a GPU when it is imported
    import comfy.cli_args  # noqa: E402

    comfy.cli_args.args.cpu = True
import comfy.model_management  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.supported_models  # noqa: E402
from sagetriton.nodes.backends.alt_backends import available_backends  # noqa: E402
from sagetriton.nodes.config.settings import SageSettings  # noqa: E402
from sagetriton.nodes.patching import patch_model  # noqa: E402
from sagetriton.nodes.reporting.stats import attention_stats  # noqa: E402

WAN_1_3B = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=1536,
                ffn_dim=8960, freq_dim=256, text_dim=4096, out_dim=16, num_heads=12, num_layers=30,
                window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)
FLUX_DEV = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096,
                hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=19, depth_single_blocks=38,
                axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True)
# Flux.2 [dev]'s blocks (6144 wide, 48 heads of 128, text from Mistral's 3 x 5120 features) at a quarter of
# its depth, double to single blocks kept at 1:6: a forward's attention share is the full model's, its
# weights (~8 B parameters) fit beside everything else.
FLUX2_DEV_QUARTER = dict(image_model="flux2", in_channels=128, out_channels=128, vec_in_dim=None,
                         context_in_dim=15360, hidden_size=6144, mlp_ratio=3.0, num_heads=48, depth=2,
                         depth_single_blocks=12, axes_dim=[32, 32, 32, 32], theta=2000, patch_size=1, qkv_bias=False,
                         guidance_embed=True, global_modulation=True, mlp_silu_act=True, ops_bias=False,
                         default_ref_method="index", ref_index_scale=10.0)
Z_IMAGE_TURBO = dict(image_model="lumina2", patch_size=2, in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2,
                     n_heads=30, n_kv_heads=30, multiple_of=256, ffn_dim_multiplier=8.0 / 3.0, norm_eps=1e-5,
                     qk_norm=True, cap_feat_dim=2560, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512],
                     rope_theta=256.0, z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32)
SDXL_UNET = dict(use_checkpoint=False, image_size=32, out_channels=4, use_spatial_transformer=True, legacy=False,
                 num_classes="sequential", adm_in_channels=2816, in_channels=4, model_channels=320,
                 num_res_blocks=[2, 2, 2], transformer_depth=[0, 0, 2, 2, 10, 10], channel_mult=[1, 2, 4],
                 transformer_depth_middle=10, use_linear_in_transformer=True, context_dim=2048,
                 num_head_channels=64, transformer_depth_output=[0, 0, 0, 2, 2, 2, 10, 10, 10],
                 use_temporal_attention=False, use_temporal_resblock=False)
SD15_UNET = dict(use_checkpoint=False, image_size=32, out_channels=4, use_spatial_transformer=True, legacy=False,
                 adm_in_channels=None, in_channels=4, model_channels=320, num_res_blocks=[2, 2, 2, 2],
                 transformer_depth=[1, 1, 1, 1, 1, 1, 0, 0], channel_mult=[1, 2, 4, 4], transformer_depth_middle=1,
                 use_linear_in_transformer=False, context_dim=768, num_heads=8, num_head_channels=-1,
                 transformer_depth_output=[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], use_temporal_attention=False,
                 use_temporal_resblock=False)

DEVICE = "cuda"
# Smoke test of this script on a CPU (Triton interpreter): python bench_models.py --tiny
TINY = {"wan21": dict(dim=256, ffn_dim=512, num_heads=2, num_layers=1, text_dim=64),
        "flux": dict(hidden_size=256, num_heads=2, depth=1, depth_single_blocks=1, context_in_dim=64, vec_in_dim=768),
        "sdxl": dict(model_channels=64, transformer_depth=[0, 0, 1, 1, 1, 1], transformer_depth_middle=1,
                     transformer_depth_output=[0, 0, 0, 1, 1, 1, 1, 1, 1], context_dim=64),
        "sd15": dict(model_channels=64, context_dim=64),
        "flux2": dict(hidden_size=256, num_heads=2, depth=1, depth_single_blocks=1, context_in_dim=64),
        "z_image": dict(dim=256, n_heads=2, n_kv_heads=2, n_layers=1, n_refiner_layers=1, multiple_of=32,
                        cap_feat_dim=64)}

# name -> (supported_models class, unet config, latent shape, text tokens, text dim, conditioning extras)
MODELS = {
    "wan21": ("WAN21_T2V", WAN_1_3B, (1, 16, 21, 60, 104), 512, 4096, lambda g: {}),  # 480x832, 81 frames
    "flux": ("Flux", FLUX_DEV, (1, 16, 128, 128), 512, 4096,  # 1024x1024
             lambda g: {"pooled_output": torch.randn(1, 768, generator=g), "guidance": 3.5}),
    "sdxl": ("SDXL", SDXL_UNET, (1, 4, 128, 128), 77, 2048,  # 1024x1024
             lambda g: {"pooled_output": torch.randn(1, 1280, generator=g), "width": 1024, "height": 1024}),
    "sd15": ("SD15", SD15_UNET, (1, 4, 64, 64), 77, 768, lambda g: {}),  # 512x512
    # 1024x1024 (ComfyUI 0.3.75 on: the classes are newer than 0.3.64). Mistral gives no pooled output.
    "flux2": ("Flux2", FLUX2_DEV_QUARTER, (1, 128, 64, 64), 512, 15360,
              lambda g: {"pooled_output": None, "guidance": 4.0}),
    "z_image": ("ZImage", Z_IMAGE_TURBO, (1, 16, 128, 128), 256, 2560, lambda g: {}),
}


def fill_random_(module: torch.nn.Module, seed: int) -> None:
    """Weights of a trained net's scale (std 1/sqrt(fan_in)), norms at 1, biases 0: activations stay sane
    through 30-57 blocks, so the attention inputs look like real ones."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                fan_in = math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=g, device=DEVICE, dtype=torch.float32).div_(math.sqrt(fan_in)))
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def build(name: str, dtype=torch.bfloat16):
    cls, unet, *_ = MODELS[name]
    config = getattr(comfy.supported_models, cls)(dict(unet))
    config.set_inference_dtype(dtype, None)
    model = config.get_model({}, device=torch.device(DEVICE))
    fill_random_(model.diffusion_model, seed=0)
    model.eval()
    dev = torch.device(DEVICE)
    return comfy.model_patcher.ModelPatcher(model, load_device=dev, offload_device=dev)


def conditioning(name: str):
    _, _, latent, tokens, dim, extras = MODELS[name]
    g = torch.Generator().manual_seed(1)
    pos = [[torch.randn(1, tokens, dim, generator=g), extras(g)]]
    neg = [[torch.randn(1, tokens, dim, generator=g), extras(g)]]
    return torch.zeros(latent), pos, neg


def forward_inputs(patcher, name: str):
    """The cond+uncond batch one sampling step sends through ``apply_model``."""
    latent, pos, neg = conditioning(name)
    model = patcher.model
    x = torch.randn((2, *latent.shape[1:]), device=DEVICE, dtype=torch.float32, generator=None)
    sigma = torch.full((2,), 0.7, device=DEVICE)
    conds = []
    for c in (pos, neg):
        extra = model.extra_conds(**c[0][1], cross_attn=c[0][0].to(DEVICE), noise=x[:1], device=DEVICE)
        conds.append(extra)
    kwargs = {}
    for key in conds[0]:
        cond = conds[0][key].concat([conds[1][key]]) if hasattr(conds[0][key], "concat") else None
        if cond is None:
            cond = conds[0][key].process_cond(2, DEVICE).cond
        kwargs[key] = cond.to(DEVICE) if isinstance(cond, torch.Tensor) else cond  # constants: Lumina's num_tokens
    return x, sigma, kwargs


def sampling_options(patcher) -> dict:
    """``transformer_options`` as a sampling run hands them to ``apply_model``: the model's own, with the
    patcher's wrappers merged in (ComfyUI does that when sampling starts), so APPLY_MODEL wrappers run."""
    topts = dict(patcher.model_options.get("transformer_options", {}))
    wrappers = {kind: dict(by_key) for kind, by_key in topts.get("wrappers", {}).items()}
    for kind, by_key in patcher.wrappers.items():
        wrappers.setdefault(kind, {}).update(by_key)
    if wrappers:
        topts["wrappers"] = wrappers
    return topts


def time_variants(variants: dict, x, sigma, kwargs, runs: int, warmup: int = 2) -> dict:
    """Median seconds per forward of each variant, timed in interleaved rounds whose order rotates
    (A, B, C, then B, C, A, ...) so clock and cache drift, and whatever the variant before leaves
    behind, hit every variant alike. Also: output, peak memory, calls per forward."""
    cuda = DEVICE == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def call(patcher):
        return patcher.model.apply_model(x, sigma, transformer_options=sampling_options(patcher), **kwargs)

    result = {}
    with torch.no_grad():
        for label, patcher in variants.items():  # warm-up, output, memory and call counts, one variant at a time
            for _ in range(warmup):
                call(patcher)
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            before = attention_stats()
            # Kept on the host: outputs left on the GPU would count in the next variants' peaks.
            out = call(patcher).float().cpu()
            sync()
            after = attention_stats()
            calls = {"kernel": after["kernel"] - before["kernel"],
                     "fallback": {r: n - before["fallback"].get(r, 0) for r, n in after["fallback"].items()
                                  if n - before["fallback"].get(r, 0)}}
            peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
            result[label] = dict(out=out, peak_gib=peak, calls=calls, times=[])
        # Untimed interleaved rounds for at least 2 s first: short forwards (SDXL, ~60 ms) otherwise
        # time the GPU's clock ramp, and the variant measured first looks slow (seen: 0.092 vs 0.060 s).
        t_end = time.perf_counter() + 2.0
        while time.perf_counter() < t_end:
            for patcher in variants.values():
                call(patcher)
            sync()
        labels = list(variants)
        for i in range(runs):
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                patcher = variants[label]
                sync()
                t0 = time.perf_counter()
                call(patcher)
                sync()
                result[label]["times"].append(time.perf_counter() - t0)
    ref_times = result[labels[0]]["times"]
    for r in result.values():
        times = r.pop("times")
        r["seconds"] = statistics.median(times)
        r["quartiles"] = statistics.quantiles(times, n=4)[::2] if len(times) > 1 else times * 2  # the spread
        # Each round's own ratio to the first variant timed in that round, then their median: on a noisy
        # host (host-bound forwards, SDXL) slow stretches hit both sides of a ratio and cancel.
        r["paired_speedup"] = statistics.median(a / b for a, b in zip(ref_times, times, strict=True))
    return result


def sample4(patcher, name: str):
    latent, pos, neg = conditioning(name)
    noise = comfy.sample.prepare_noise(latent, 0)
    return comfy.sample.sample(patcher, noise, 4, 3.5 if name != "flux" else 1.0, "euler", "simple", pos, neg, latent,
                               seed=0, disable_pbar=True).float()


def host_profile(patcher, x, sigma, kwargs, top: int = 15) -> None:
    """Where the host (Python) time of one forward goes: the attention override versus the rest."""
    import cProfile
    import pstats

    with torch.no_grad():
        prof = cProfile.Profile()
        prof.enable()
        patcher.model.apply_model(x, sigma, transformer_options=sampling_options(patcher), **kwargs)
        prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


# Kernel-name fragments by what they do, first match wins: where a forward's device time goes.
KERNEL_KINDS = (("pack attention", ("quantize_int8", "kv_stats", "convert_v", "attention_kernel", "shared_kv")),
                ("other attention", ("flash", "fmha", "cudnn", "attention", "sdpa")),
                ("matmul", ("gemm", "xmma", "nvjet", "cutlass", "matmul", "addmm", "linear")),
                ("copies", ("copy", "cat", "transpose", "contiguous")),
                ("element-wise", ("elementwise", "vectorized", "reduce", "norm", "mul", "add", "silu", "gelu")))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, parts in KERNEL_KINDS if any(p in low for p in parts)), "other")


def device_profile(patcher, x, sigma, kwargs, top: int = 12) -> dict:
    """Device time of one forward by kind of kernel (``KERNEL_KINDS``), and its ``top`` kernels: how much
    of the forward attention is, and what else (RoPE, copies) sits around it. CPU time on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    cuda = DEVICE == "cuda"
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with torch.no_grad(), profile(activities=acts) as prof:
        patcher.model.apply_model(x, sigma, transformer_options=sampling_options(patcher), **kwargs)
        if cuda:
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if (e.self_device_time_total if cuda else e.self_cpu_time_total) > 0]
    if cuda:  # CUDA kernels only; CPU-side ops carry no self device time beyond their kernels'
        events = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    else:
        events = [e for e in events if e.key.startswith("aten::") and e.cpu_children == []]
    us = {e.key: (e.self_device_time_total if cuda else e.self_cpu_time_total) for e in events}
    kinds: dict = {}
    for name, t in us.items():
        kind = kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + t / 1e3
    return {"ms_by_kind": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top": [(name[:90], round(t / 1e3, 3)) for name, t in sorted(us.items(), key=lambda kv: -kv[1])[:top]]}


def with_reference_sage(base):
    """A clone that sends every attention call to ComfyUI's ``attention_sage`` (the reference
    ``sageattention`` package), through the same override hook our patch uses; None without it."""
    import comfy.ldm.modules.attention as attention

    if not getattr(attention, "SAGE_ATTENTION_IS_AVAILABLE", False):
        return None
    return with_override(base, lambda func, *args, **kwargs: attention.attention_sage(*args, **kwargs))


def with_override(base, override):
    """A clone whose attention calls go through ``override``, by the hook our patch uses."""
    patcher = base.clone()
    topts = dict(patcher.model_options.get("transformer_options", {}))
    topts["optimized_attention_override"] = override
    patcher.model_options["transformer_options"] = topts
    return patcher


def control_variants(base) -> dict:
    """What the timing itself can tell apart: the same unpatched model timed twice (the noise
    between two identical variants), and an override that only calls ComfyUI's attention back (the
    cost of the hook itself, before any decision of ours)."""
    return {"control: unpatched again": base.clone(),
            "control: pass-through override": with_override(base, lambda func, *args, **kwargs: func(*args, **kwargs))}


def bench_model(name: str, runs: int, profile_host: bool = False, controls: bool = False,
                only: tuple = (), profile_device: bool = False) -> list:
    """``only``: starts of the variant labels to time (the unpatched model always is)."""
    base = build(name)
    variants = {"unpatched": base, "patched (defaults)": patch_model(base, SageSettings()),
                "patched (kernel on every call)": patch_model(base, SageSettings(min_seq_len=0)),
                "patched (no Q/K rotation)": patch_model(base, SageSettings(qk_rotation="off")),
                "patched (ComfyUI's RoPE)": patch_model(base, SageSettings(fast_rope=False)),
                "patched (int8 P·V)": patch_model(base, SageSettings(pv_precision="int8")),
                "patched (fp8+residual)": patch_model(base, SageSettings(pv_precision="fp8+residual"))}
    if controls:
        variants.update(control_variants(base))
    reference = with_reference_sage(base)
    if reference is not None:
        variants["reference sageattention"] = reference
    for backend in available_backends():  # Sage Settings' backend choice: the same routing, another attention
        if backend != "SageTriton":
            variants[f"backend {backend}"] = patch_model(base, SageSettings(backend=backend))
    if only:
        variants = {k: p for k, p in variants.items() if k == "unpatched" or k.startswith(only)}
    x, sigma, kwargs = forward_inputs(base, name)
    if profile_host:
        for label in ("unpatched", "patched (defaults)"):
            print(f"--- host profile, {name}, {label}")
            host_profile(variants[label], x, sigma, kwargs)
    profiles = {}
    if profile_device:
        for label in [v for v in ("unpatched", "patched (defaults)") if v in variants]:
            profiles[label] = device_profile(variants[label], x, sigma, kwargs)
            print(f"--- device profile, {name}, {label}: {profiles[label]}", flush=True)
    timed = time_variants(variants, x, sigma, kwargs, runs)
    ref = timed["unpatched"]
    ref_sample = sample4(base, name)
    rows = []
    for label, patcher in variants.items():
        t = timed[label]
        sampled = ref_sample if patcher is base else sample4(patcher, name)
        rows.append(dict(model=name, variant=label, seconds=t["seconds"], speedup=ref["seconds"] / t["seconds"],
                         paired_speedup=t["paired_speedup"], quartiles=t["quartiles"], runs=runs,
                         peak_gib=t["peak_gib"], calls=t["calls"], cosine_forward=cosine(t["out"], ref["out"]),
                         cosine_4_steps=cosine(sampled, ref_sample), finite=bool(torch.isfinite(t["out"]).all())))
        if label in profiles:
            rows[-1]["device_profile"] = profiles[label]
        print(rows[-1], flush=True)
    del base, variants, timed
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


def shrink_for_cpu_smoke_test() -> None:
    global DEVICE
    DEVICE = "cpu"
    for name, (cls, unet, latent, _tokens, _dim, extras) in list(MODELS.items()):
        small = {**unet, **TINY[name]}
        small_dim = next(small[k] for k in ("text_dim", "context_in_dim", "context_dim", "cap_feat_dim") if k in small)
        MODELS[name] = (cls, small, (1, latent[1], *([2] if len(latent) == 5 else []), 8, 8), 16, small_dim, extras)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="wan21,flux,sdxl")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile-host", action="store_true", help="cProfile one forward, unpatched and patched")
    ap.add_argument("--profile-device", action="store_true",
                    help="device time of one forward by kind of kernel, unpatched and patched (in the JSON rows)")
    ap.add_argument("--controls", action="store_true",
                    help="also time the unpatched model twice and a pass-through override (noise and hook cost)")
    ap.add_argument("--variants", default="",
                    help="comma-separated starts of variant labels to time, e.g. 'patched (defaults),control'")
    ap.add_argument("--tiny", action="store_true", help="tiny configs on the CPU: checks this script, times nothing")
    args = ap.parse_args(argv)
    if args.tiny:
        shrink_for_cpu_smoke_test()
    elif not torch.cuda.is_available():
        sys.exit("bench_models.py needs a GPU")
    payload = {"env": environment(), "rows": []}
    print(payload["env"], flush=True)  # the log states its run, like the JSON
    for name in args.models.split(","):
        payload["rows"] += bench_model(name, args.runs, args.profile_host, args.controls,
                                       tuple(v for v in args.variants.split(",") if v), args.profile_device)
    print(f"{'model':>6} {'variant':>32} {'s/forward':>10} {'speedup':>8} {'paired':>7} {'peak GiB':>9} {'cos fwd':>8} "
          f"{'cos 4 steps':>11}  calls")
    for r in payload["rows"]:
        print(f"{r['model']:>6} {r['variant']:>32} {r['seconds']:10.4f} {r['speedup']:8.3f} {r['paired_speedup']:7.3f} "
              f"{r['peak_gib']:9.2f} "
              f"{r['cosine_forward']:8.5f} {r['cosine_4_steps']:11.5f}  {r['calls']}")
    from pathlib import Path

    default = RESULTS.parent / "out" / "models_tiny.json" if args.tiny else RESULTS / "models.json"
    write_json(Path(args.out) if args.out else default, payload)


if __name__ == "__main__":
    main()
