"""Host time of an attention call through the Patch node's override, as ComfyUI makes it, against the
same call unpatched and against torch SDPA.

    python bench/host_time.py [--out bench/results/<arch>_host_time.json]   # on a GPU
    python bench/host_time.py --cpu                                          # CPU proxy, no GPU

ComfyUI calls ``wrap_attn(attention_pytorch)(q, k, v, heads, ..., transformer_options=...)``, and
``wrap_attn`` hands the call to ``optimized_attention_override(func, q, k, v, heads, ...)`` when the
model is patched. Rows:

- ``fallback``: calls the override sends to ComfyUI's attention (the defaults at 1K tokens). Host
  µs per call for the unpatched call and the patched one; ``override_overhead_us`` is the same
  difference with a backend that does nothing (``null_*``), which leaves only the pack's own cost.
- ``kernel``: calls that take the kernel (``min_seq_len=0``): host µs per call, its launches, and a
  cProfile of the Python work, sorted by own time.

Host µs is the median over many calls of the time to enqueue one (the GPU is not waited for; the
batches are short enough for the launch queue). ``wall_ms`` is back-to-back calls with a sync at the
end, per call, i.e. whichever of host and GPU is slower, and ``x_sdpa`` SDPA's ``wall_ms`` over it.
With ``--cpu`` the patched model runs as on an H200 (its arch simulated), Triton's launches do nothing
(its launcher needs a GPU: what is left is the pack's own Python) and the fallback runs ComfyUI's SDPA
on small CPU tensors.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

if "--cpu" in sys.argv:  # before triton is imported: CPU tensors count as a GPU for the dispatcher
    os.environ["TRITON_INTERPRET"] = "1"

import torch
from common import RESULTS, environment, find_comfyui, import_pack, write_json

import_pack()
from sagetriton_import import prepare_comfyui_for_cpu  # noqa: E402

# (label, batch, heads, tokens, head_dim, skip_reshape): SDXL's and SD1.5's (B, L, H·D) calls, Flux's (B, H, L, D)
SHAPES = [("sdxl 2x10x1024x64", 2, 10, 1024, 64, False), ("bench 2x20x1024x64", 2, 20, 1024, 64, False),
          ("bench 2x24x1024x128", 2, 24, 1024, 128, True), ("flux 1x24x4608x128", 1, 24, 4608, 128, True)]
CPU_SHAPES = [("cpu 2x10x16x64", 2, 10, 16, 64, False), ("cpu 1x4x16x128", 1, 4, 16, 128, True)]


def simulated_h200():
    from types import SimpleNamespace

    from sagetriton.kernels.arch import arch_from_properties

    return arch_from_properties(SimpleNamespace(name="NVIDIA H200", major=9, minor=0), is_hip=False)


def comfy_attention():
    """ComfyUI's ``attention_pytorch`` (wrapped by ``wrap_attn``), what SDPA-backed models call."""
    path = find_comfyui()
    if path is None:
        sys.exit("host_time.py needs ComfyUI (COMFYUI_PATH or ~/ComfyUI)")
    if not torch.cuda.is_available():
        prepare_comfyui_for_cpu(path)
    elif str(path) not in sys.path:
        sys.path.insert(0, str(path))
    import comfy.ldm.modules.attention as attention

    def no_attention(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                     **kwargs):
        return q  # the override's own cost, without attention's time and its noise

    return attention.attention_pytorch, attention.wrap_attn(no_attention)


def override_for(settings, arch=None):
    from sagetriton.nodes.config.install_report import InstallReport
    from sagetriton.nodes.routing.dispatch import PatchState
    from sagetriton.nodes.routing.override import make_attention_override

    state = PatchState(settings, arch=arch, report=InstallReport())
    state.begin_run()
    return make_attention_override(state), state


def make_inputs(b, h, n, d, skip_reshape, device, dtype):
    shape = (b, h, n, d) if skip_reshape else (b, n, h * d)
    return [torch.randn(shape, device=device, dtype=dtype) for _ in range(3)]


def host_us(fn, calls: int, sync) -> float:
    """Median µs to enqueue one call, over ``calls`` calls timed one by one (a sync every 20)."""
    times = []
    for i in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if i % 20 == 19:
            sync()
    sync()
    return statistics.median(times) * 1e6


def wall_ms(fn, calls: int, sync) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls * 1e3


def profile_text(fn, calls: int, sync, lines: int = 18) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    sync()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


class NoLaunches:
    """Inside the block, ``kernel[grid](...)`` does nothing (the CPU proxy: Triton's launcher needs a GPU)."""

    def __enter__(self):
        from sagetriton.kernels import quant

        self.cls = type(quant.quantize_int8_kernel)
        self.had = "__getitem__" in self.cls.__dict__
        self.previous = self.cls.__dict__.get("__getitem__")
        self.cls.__getitem__ = lambda kernel, grid: (lambda *args, **kwargs: None)
        try:  # launches replayed on CPU too, as they are on a GPU
            from sagetriton.kernels import replay

            self.replay, self.devices = replay, replay.DEVICE_TYPES
            replay.DEVICE_TYPES = ("cuda", "cpu")
        except ImportError:  # before launch replay existed
            self.replay = None
        return self

    def __exit__(self, *exc):
        if self.had:
            self.cls.__getitem__ = self.previous
        else:
            del self.cls.__getitem__
        if self.replay is not None:
            self.replay.DEVICE_TYPES = self.devices
            self.replay.clear()


def count_launches(fn) -> int:
    from sagetriton.installer.crosscompile import record_launches

    with record_launches() as specs:
        fn()
    return len(specs)


def bench_shape(label, b, h, n, d, skip_reshape, attention, null, device, dtype, calls, sync, cpu: bool):
    from sagetriton.nodes.config.settings import SageSettings

    HOPPER = simulated_h200()

    q, k, v = make_inputs(b, h, n, d, skip_reshape, device, dtype)
    kw = dict(skip_reshape=skip_reshape, skip_output_reshape=False)
    fallback_ov, _ = override_for(SageSettings(min_seq_len=1 << 30))  # every call to ComfyUI's attention
    fallback32_ov, _ = override_for(SageSettings(min_seq_len=1 << 30))
    kernel_ov, kernel_state = override_for(SageSettings(min_seq_len=0), arch=HOPPER if cpu else None)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    qh, kh, vh = (t if skip_reshape else t.view(b, n, h, d).transpose(1, 2) for t in (q, k, v))
    fns = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh),
        "unpatched": lambda: attention(q, k, v, h, transformer_options={}, **kw),
        "fallback": lambda: attention(q, k, v, h, transformer_options={"optimized_attention_override": fallback_ov},
                                      **kw),
        "kernel": lambda: attention(q, k, v, h, transformer_options={"optimized_attention_override": kernel_ov},
                                    **kw),
        "null_unpatched": lambda: null(q, k, v, h, transformer_options={}, **kw),
        "null_fallback": lambda: null(q, k, v, h, transformer_options={"optimized_attention_override": fallback_ov},
                                      **kw),
        # fp32 inputs: a reason found by the call checks, not by length (before the call cache only
        # calls too short for the kernel skipped those checks)
        "null_fallback_fp32": lambda: null(q32, k32, v32, h, **kw,
                                           transformer_options={"optimized_attention_override": fallback32_ov}),
    }
    row = dict(shape=label, b=b, h=h, n=n, d=d, layout="HND" if skip_reshape else "NLD")
    no_launches = NoLaunches() if cpu else contextlib.nullcontext()
    with no_launches:
        for _ in range(5):
            for fn in fns.values():
                fn()
        sync()
        for name, fn in fns.items():
            row[f"{name}_host_us"] = host_us(fn, calls, sync)
            if not cpu and not name.startswith("null"):
                row[f"{name}_wall_ms"] = wall_ms(fn, calls, sync)
    # The pack's cost per call that falls back: the override around a backend that does nothing.
    row["override_overhead_us"] = row["null_fallback_host_us"] - row["null_unpatched_host_us"]
    row["override_overhead_fp32_us"] = row["null_fallback_fp32_host_us"] - row["null_unpatched_host_us"]
    if not cpu:
        for name in ("unpatched", "fallback", "kernel"):
            row[f"{name}_x_sdpa"] = row["sdpa_wall_ms"] / row[f"{name}_wall_ms"]
    row["kernel_calls"] = kernel_state.run.kernel
    try:  # replays that went straight to the compiled kernels' launchers (kernels/launcher.py)
        from sagetriton.kernels import failures

        row["kernel_direct_replays"] = sum(r.direct_calls for r in failures.memory.replays.values())
    except (ImportError, AttributeError):  # a tree from before direct launches
        row["kernel_direct_replays"] = None
    with NoLaunches() if cpu else contextlib.nullcontext():
        row["kernel_launches"] = count_launches(fns["kernel"])
    with NoLaunches() if cpu else contextlib.nullcontext():
        row["kernel_profile"] = profile_text(fns["kernel"], 200, sync)
        row["fallback_profile"] = profile_text(fns["fallback"], 200, sync, lines=12)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cpu", action="store_true", help="CPU proxy: no GPU, kernel launches not run")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-profile-print", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated starts of shape labels, e.g. 'sdxl,bench'")
    args = ap.parse_args(argv)
    cpu = args.cpu or not torch.cuda.is_available()
    if cpu:
        torch.set_num_threads(1)  # steadier timings of the tiny CPU calls
    attention, null = comfy_attention()
    device = "cpu" if cpu else "cuda"
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    dtype = torch.float16 if cpu else torch.bfloat16
    env = environment() | {"mode": "cpu proxy" if cpu else "gpu"}
    print(env, flush=True)
    rows = []
    for shape in (CPU_SHAPES if cpu else SHAPES):
        if args.only and not shape[0].startswith(tuple(args.only.split(","))):
            continue
        row = bench_shape(*shape, attention, null, device, dtype, args.calls, sync, cpu)
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if "profile" not in k},
              flush=True)
        if not args.no_profile_print:
            print(row["kernel_profile"])
    if args.out or not cpu:
        from sagetriton.kernels.arch import detect_arch

        out = args.out or RESULTS / f"{detect_arch().arch}_host_time.json"
        write_json(out if not isinstance(out, str) else __import__("pathlib").Path(out), {"env": env, "rows": rows})


if __name__ == "__main__":
    main()
