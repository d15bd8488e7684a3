"""Kernel speed and accuracy on a CUDA/ROCm GPU, side by side with torch SDPA.

    python bench/bench_kernels.py [--quick] [--sweep] [--out bench/results/<gpu>_kernels.json]

TOPS = 4·B·H·Lq·Lk·D / time, the full call (quantization included), median of do_bench over
rotating input sets so nothing is served from L2. Accuracy is cosine / relative L1 against an
fp32 math reference on a slice of heads. Memory: the peak a call adds to what was allocated
before it (its output included); for our kernel and the reference also how far that is from the
issue's budget, SDPA default's peak plus the quantized copies of Q, K and V
(``kernels.footprint.quantized_copy_bytes``; negative = within it).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import sys

import torch
import torch.nn.functional as F
import triton.testing
from common import RESULTS, cosine, environment, find_comfyui, import_pack, kitchen_attention, rel_l1, write_json
from torch.nn.attention import SDPBackend, sdpa_kernel

import_pack()
from sagetriton.installer.report import crossover_seq_len  # noqa: E402
from sagetriton.installer.selftest import alternating, measure_crossovers  # noqa: E402
from sagetriton.kernels.api import attention_forward  # noqa: E402
from sagetriton.kernels.arch import default_config, detect_arch, resolve_config  # noqa: E402
from sagetriton.kernels.footprint import quantized_copy_bytes  # noqa: E402

SHAPES = [  # (B, H, L, D): batch x heads large enough to fill the GPU
    (2, 24, 1024, 128), (2, 24, 4096, 128), (2, 24, 8192, 128), (1, 24, 16384, 128), (1, 12, 32768, 128),
    (2, 24, 1024, 64), (2, 24, 4096, 64), (2, 24, 8192, 64), (1, 24, 16384, 64), (1, 12, 32768, 64),
]
QUICK = [(2, 24, 4096, 128), (1, 24, 16384, 128), (1, 24, 16384, 64)]


def tops(shape, ms):
    B, H, L, D = shape
    return 4 * B * H * L * L * D / (ms * 1e-3) / 1e12


def timed(fn, sets):
    return triton.testing.do_bench(alternating(fn, sets), warmup=50, rep=300, return_mode="median")


def peak_mib(fn, q, k, v):
    """MiB a call adds to the allocator's peak, its output included."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(q, k, v)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak / 2**20


def sdpa_with(backends):
    def run(q, k, v):
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v)
    return run


def make_sets(shape, dtype, n=3):
    B, H, L, D = shape
    return [tuple(torch.randn(B, H, L, D, device="cuda", dtype=dtype) for _ in range(3)) for _ in range(n)]


def accuracy(fn, q, k, v):
    out = fn(q, k, v)[:, :2].float()
    ref = F.scaled_dot_product_attention(q[:, :2].float(), k[:, :2].float(), v[:, :2].float())
    return cosine(out, ref), rel_l1(out, ref)


def kernel_fn(cfg):
    """``(q, k, v) -> out`` through our kernel with ``cfg`` (HND, no mask, K smoothing on)."""
    return lambda q, k, v: attention_forward(q, k, v, "HND", False, None, None, False, cfg, True, False)[0]


def kernel_rows(arch, D):
    """(label, fn, config) for the per-arch default and each granularity / PV precision variant."""
    base = default_config(arch, D)
    rows = [("sage default", kernel_fn(base), base)]
    if base.shared_kv_min_len:  # the portable kernel alone, beside the default that switches to Gluon
        portable = base.replace(shared_kv_min_len=0)
        rows.append(("sage portable kernel", kernel_fn(portable), portable))
    pvs = ("fp16", "fp8", "fp8+residual", "int8") if arch.fp8 else ("fp16", "int8")
    for gran, pv in itertools.product(("per_block", "per_warp", "per_thread"), pvs):
        c, _ = resolve_config(arch, D, gran, pv)  # what Sage Settings gives for this choice
        if c == base:
            continue
        rows.append((f"sage {gran} {pv}", kernel_fn(c), c))
    return rows, base


def reference_sage():
    """(label, fn) for the reference ``sageattention`` package when it is importable, else None.

    ``sageattn`` picks its own kernel per GPU: on Hopper the 2.x CUDA build runs its sm90 FP8 kernel,
    while 1.x (the PyPI wheel) is pure Triton (INT8 Q·Kᵀ, FP16 P·V). The label says which ran."""
    try:
        import sageattention
        from sageattention import sageattn as ref_sageattn
    except ImportError:
        return None
    core = sys.modules.get("sageattention.core")
    cuda = any(getattr(core, f"SM{a}_ENABLED", False) for a in (80, 89, 90))
    try:
        version = importlib.metadata.version("sageattention")
    except importlib.metadata.PackageNotFoundError:  # a source build on sys.path, no metadata
        version = "2.x" if hasattr(core, "SM90_ENABLED") else getattr(sageattention, "__version__", "?")
    label = f"sageattention {version} ({'CUDA' if cuda else 'Triton'})"
    return label, lambda q, k, v: ref_sageattn(q, k, v, tensor_layout="HND"), None


def measured_crossovers(arch):
    """{head_dim: key length from which the dispatcher picks the kernel}, measured as first start
    does (``selftest.measure_crossovers``) on this machine: its host speed moves the crossover, and
    the "dispatch" row must show what a user here gets."""
    cross = measure_crossovers(arch, torch.device("cuda"), torch.bfloat16)
    return {d: crossover_seq_len(cross, d) for d in (64, 128)}, cross


def comfy_attention():
    """ComfyUI's ``attention_pytorch`` (wrapped by ``wrap_attn``), or None (printed why) without ComfyUI."""
    path = find_comfyui()
    if path is None:
        print("ComfyUI not found (COMFYUI_PATH): the dispatch row shows the routed method's timing instead")
        return None
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    try:
        import comfy.ldm.modules.attention as attention
    except Exception as e:  # noqa: BLE001 - a ComfyUI that does not import here
        print(f"ComfyUI does not import ({type(e).__name__}: {e}): dispatch row from the routed method")
        return None
    return attention.attention_pytorch


def override_methods(attention, crossovers):
    """(label, fn, None) rows: ComfyUI's attention unpatched, and the same call through the Patch node's
    override (``optimized_attention_override(func, q, k, v, heads, ...)`` from ``wrap_attn``) with the
    default settings and the crossovers measured here, i.e. what a patched model gets; and its state."""
    from sagetriton.nodes.config.install_report import NoReport
    from sagetriton.nodes.routing.dispatch import PatchState
    from sagetriton.nodes.routing.override import make_attention_override

    class Measured(NoReport):  # the crossovers measured by this run, as install.py's report would give them
        def crossover(self, arch, cfg, head_dim=128):
            return (crossovers or {}).get(head_dim)

    state = PatchState(report=Measured())
    state.begin_run()
    opts = {"optimized_attention_override": make_attention_override(state)}

    def call(q, k, v, transformer_options):  # Flux's form: (B, H, L, D) in; (B, H, L, D) out as SDPA's row
        return attention(q, k, v, q.shape[1], skip_reshape=True, skip_output_reshape=True,
                         transformer_options=transformer_options)

    return [("comfy sdpa", lambda q, k, v: call(q, k, v, {}), None),
            ("dispatch", lambda q, k, v: call(q, k, v, opts), None)], state


def bench_shape(shape, dtype, arch, all_variants=True, crossovers=None, attention=None, others=True):
    B, H, L, D = shape
    sets = make_sets(shape, dtype)
    rows = []
    krows, base = kernel_rows(arch, D)
    if not all_variants:
        krows = krows[:1]
    methods = [("sdpa default", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), None)]
    if others:
        methods += [(f"sdpa {b.name.lower()}", sdpa_with([b]), None) for b in
                    (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)]
    methods += krows
    ref = reference_sage() if others else None
    if ref is not None:
        methods.append(ref)
    ck = kitchen_attention() if others else None  # ComfyUI's built-in INT8 attention, where importable
    if ck is not None:
        methods.append((*ck, None))
    state = None
    if attention is not None:
        extra, state = override_methods(attention, crossovers)
        methods += extra
    for label, fn, cfg in methods:
        try:
            cos, l1 = accuracy(fn, *sets[0])  # first: builds the kernels outside the timing
            ms = timed(fn, sets)
            mib = peak_mib(fn, *sets[0])
        except Exception as e:  # a backend this GPU lacks: report, keep going
            rows.append(dict(method=label, error=str(e).splitlines()[0][:200]))
            continue
        rows.append(dict(method=label, ms=ms, tops=tops(shape, ms), cosine=cos, rel_l1=l1, peak_mib=mib))
        if label.startswith("sage"):  # ours and the reference: against SDPA's peak plus the quantized copies
            copies = quantized_copy_bytes(B, H, H, L, L, D, v_residual=bool(cfg and cfg.v_residual)) / 2**20
            rows[-1]["copies_mib"] = copies
    sdpa = next(r for r in rows if r["method"] == "sdpa default")
    sage = next(r for r in rows if r["method"] == "sage default")
    measured = (crossovers or {}).get(D)
    crossover = measured if measured is not None else base.min_seq_len
    source = dict(crossover=crossover, crossover_source="measured here" if measured is not None else "table default")
    dispatch = next((r for r in rows if r["method"] == "dispatch"), None)
    if dispatch is not None:  # timed through the override: its routing and host time included
        dispatch.update(routed_to="kernel" if state.run.kernel else "sdpa", **source)
    else:
        use_kernel = L >= crossover
        pick = sage if use_kernel else sdpa
        rows.append(dict(method="dispatch", **{k: pick[k] for k in ("ms", "tops", "cosine", "rel_l1", "peak_mib")},
                         **({"copies_mib": pick["copies_mib"]} if use_kernel else {}),
                         routed_to="kernel" if use_kernel else "sdpa", **source))
    ref_row = next((r for r in rows if ref is not None and r["method"] == ref[0] and "ms" in r), None)
    for r in rows:
        r.update(shape=list(shape), dtype=str(dtype).replace("torch.", ""))
        if "ms" in r:
            r["vs_sdpa"] = sdpa["ms"] / r["ms"]
            if "copies_mib" in r:
                r["over_budget_mib"] = r["peak_mib"] - sdpa["peak_mib"] - r["copies_mib"]
            if ref_row is not None:
                r["vs_reference"] = ref_row["ms"] / r["ms"]
    return rows, base


TILES = [(64, 64, 4, 3), (64, 128, 4, 2), (64, 128, 4, 3), (64, 128, 4, 4),
         (128, 128, 8, 3), (128, 64, 4, 3), (64, 256, 4, 2), (128, 128, 4, 2)]
# (pv precision, tensor descriptors)
TILE_VARIANTS = [("fp16", False), ("fp8", False), ("fp8", True)]


def sweep(arch, shapes, dtype, tiles=TILES, variants=TILE_VARIANTS):
    """Tile configurations and code-path switches: pick the table's entries from this."""
    out = []
    for shape in shapes:
        D = shape[3]
        sets = make_sets(shape, dtype)
        base = default_config(arch, D)
        for bm, bn, w, s in tiles:
            for pv, tma in variants:
                c = base.replace(block_m=bm, block_n=bn, num_warps=w, num_stages=s, pv_precision=pv, use_tma=tma)
                fn = kernel_fn(c)
                try:
                    ms = timed(fn, sets)
                    cos, _ = accuracy(fn, *sets[0])
                    row = dict(shape=list(shape), pv=pv, tma=tma, block_m=bm, block_n=bn, warps=w,
                               stages=s, ms=ms, tops=tops(shape, ms), cosine=cos)
                except Exception as e:
                    row = dict(shape=list(shape), pv=pv, tma=tma, block_m=bm, block_n=bn, warps=w,
                               stages=s, error=str(e).splitlines()[0][:160])
                print(row, flush=True)
                out.append(row)
    return out


def profile_stages(arch, dtype):
    """Device time per kernel of one call (torch.profiler): where the time goes, quantization included."""
    from torch.profiler import ProfilerActivity, profile

    out = []
    for shape in [(2, 24, 4096, 128), (1, 24, 16384, 128), (2, 24, 4096, 64)]:
        q, k, v = make_sets(shape, dtype, n=1)[0]
        for gran in ("per_block", "per_warp"):
            c = default_config(arch, shape[3]).replace(qk_quant_gran=gran)
            fn = lambda c=c, q=q, k=k, v=v: attention_forward(  # noqa: E731
                q, k, v, "HND", False, None, None, False, c, True, False)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            for e in prof.key_averages():
                t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
                if t > 0:
                    row = dict(shape=list(shape), gran=gran, kernel=e.key[:60], us_per_call=t / 10)
                    print(row, flush=True)
                    out.append(row)
    return out


def print_table(rows):
    print(f"{'shape':>20} {'dtype':>8} {'method':>34} {'ms':>8} {'TOPS':>7} {'xSDPA':>6} {'xRef':>6} "
          f"{'cos':>8} {'relL1':>7} {'MiB':>7} {'vs budget':>9}")
    for r in rows:
        if "error" in r:
            print(f"{str(r['shape']):>20} {r['dtype']:>8} {r['method']:>34}  error: {r['error'][:60]}")
            continue
        print(f"{str(r['shape']):>20} {r['dtype']:>8} {r['method']:>34} {r['ms']:8.3f} {r['tops']:7.0f} "
              f"{r['vs_sdpa']:6.2f} {r.get('vs_reference', float('nan')):6.2f} {r['cosine']:8.5f} {r['rel_l1']:7.4f} "
              f"{r.get('peak_mib', float('nan')):7.1f} {r.get('over_budget_mib', float('nan')):+9.1f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="three shapes, default kernel only")
    ap.add_argument("--sweep", action="store_true", help="also sweep tile configurations")
    ap.add_argument("--profile", action="store_true", help="device time per kernel of one call")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--table-crossover", action="store_true",
                    help="dispatch row from the per-arch table's crossover instead of measuring it here")
    ap.add_argument("--no-override", action="store_true",
                    help="dispatch row from the routed method's timing, not through the Patch node's override")
    ap.add_argument("--shapes", default=None, help="only these shapes, e.g. 2x24x1024x128,2x20x1024x64")
    ap.add_argument("--dispatch-only", action="store_true", help="SDPA, the default kernel and the override only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA or ROCm GPU")
    arch = detect_arch()
    env = environment() | {"arch": arch.arch}
    print(env, flush=True)
    payload = {"env": env, "rows": []}
    crossovers = None
    if not (args.quick or args.table_crossover):
        crossovers, payload["crossover"] = measured_crossovers(arch)
        print(f"crossover measured here (key tokens, by head_dim): {crossovers}", flush=True)
    if args.profile:
        payload["profile"] = profile_stages(arch, torch.bfloat16)
    if args.sweep:
        payload["sweep"] = sweep(arch, [(1, 24, 16384, 128), (1, 24, 16384, 64), (2, 24, 4096, 128)], torch.bfloat16)
    attention = None if args.no_override else comfy_attention()
    for dt in filter(None, args.dtypes.split(",")):
        dtype = getattr(torch, dt)
        shapes = ([tuple(map(int, x.split("x"))) for x in args.shapes.split(",")] if args.shapes
                  else QUICK if args.quick else SHAPES)
        for shape in shapes:
            rows, base = bench_shape(shape, dtype, arch, all_variants=not (args.quick or args.dispatch_only)
                                     and dt == "bfloat16",
                                     crossovers=crossovers, attention=attention, others=not args.dispatch_only)
            print_table(rows)
            payload["rows"] += rows
            payload.setdefault("configs", {})[str(shape[3])] = base.as_dict()
    out = args.out or RESULTS / f"{arch.arch}_kernels.json"
    write_json(out if not isinstance(out, str) else __import__("pathlib").Path(out), payload)
    print_table(payload["rows"])


if __name__ == "__main__":
    main()
