"""Triton 3.9 on the H200 (issue 38, item 5): is the Gluon kernel's 6-7 % loss to Triton 3.6 ptxas's doing?

Run under the staged Triton 3.9 (``../shared/tools/stage-triton``). It times the default Hopper path
(fp8 P·V, the Gluon kernel) at 2x24x8192, 1x24x16384 and 1x12x32768 (hd128, bf16) with the Gluon
kernels built two ways, interleaved over several rounds (medians), and checks their outputs agree:

  A  3.9 as shipped: its PTX assembled by ``ptxas-blackwell`` (CUDA 13.x), which 3.9 uses for sm90
     (the pack before ``triton_compat.sm90_ptxas_scope``);
  B  the same PTX assembled by a CUDA 12.x ``ptxas``, through ``triton_compat.sm90_ptxas_scope`` (what
     the pack now does where the 3.9 wheel ships its CUDA 12.9 ``ptxas``; the staged copy has none, so
     by default the machine's own Triton 3.6 ptxas, found on sys.path behind the staged folder;
     ``--old-ptxas`` to name one).

Everything else (the quantization kernels, the launches, the PTX itself) is the same in A and B:
the Gluon kernels of B are a second ``gluon.jit`` of the same functions, compiled inside that scope
(``TRITON_PTXAS_BLACKWELL_PATH`` names the older ptxas; Triton's cached ptxas version and LLVM
features are reset around it, so B's PTX is written for that ptxas's PTX version).
Each row also has the device time per call of the Gluon whole kernel, its split (tail) kernel and
the rest (torch.profiler). Under Triton 3.6 (no staging) the script runs A alone: the baseline in
the same format, so the two runs show which kernel lost the time. bench/NOTES.md ("Triton 3.9: why
the Gluon kernel is slower") says what each outcome means.

    python bench/gluon39_ab.py [--rounds 7] [--old-ptxas PATH]
"""
from __future__ import annotations

import argparse
import glob
import itertools
import os
import statistics
import sys
from contextlib import nullcontext

from common import environment, import_pack

import_pack()
import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402
from sagetriton.kernels import api, hopper_gluon, triton_compat  # noqa: E402
from sagetriton.kernels.arch import default_config, detect_arch  # noqa: E402
from triton.experimental import gluon  # noqa: E402

SHAPES = ((2, 24, 8192, 128), (1, 24, 16384, 128), (1, 12, 32768, 128))
T36_TOPS = {(2, 24, 8192, 128): 858, (1, 24, 16384, 128): 942, (1, 12, 32768, 128): 981}  # same H200, 2026-12-03


def tool_version(path: str) -> str:
    from triton.knobs import NvidiaTool

    tool = NvidiaTool.from_path(path)
    return tool.version if tool else "?"


def find_old_ptxas() -> str | None:
    """A CUDA 12 ptxas of another Triton on sys.path (the machine's own, behind the staged one)."""
    here = os.path.realpath(os.path.dirname(triton.__file__))
    for entry in sys.path:
        for path in glob.glob(os.path.join(entry or ".", "triton", "backends", "nvidia", "bin", "ptxas")):
            if not os.path.realpath(path).startswith(here) and tool_version(path).startswith("12."):
                return path
    mine = os.path.join(here, "backends", "nvidia", "bin", "ptxas")  # a full 3.9 wheel ships CUDA 12.9's too
    return mine if os.path.isfile(mine) and tool_version(mine).startswith("12.") else None


def compiled_facts(jit_fn) -> list:
    """Registers, spills and PTX version of what ``jit_fn`` compiled (a report: empty where Triton's
    caches look otherwise)."""
    out = []
    try:
        for cache in jit_fn.device_caches.values():
            for ck in cache[0].values():
                ck._init_handles()
                ptx = ck.asm.get("ptx", "")
                ver = ptx[ptx.find(".version"):].split("\n", 1)[0] if ".version" in ptx else "?"
                out.append(f"{jit_fn.fn.__name__}: {ck.n_regs} regs, {ck.n_spills} spilled, {ver}")
    except Exception as e:  # noqa: BLE001 - facts only
        out.append(f"{jit_fn.fn.__name__}: ({type(e).__name__}: {e})")
    return out


def timed(call, sets) -> float:
    turns = itertools.cycle(sets)  # alternate input sets: no call finds the last one's tensors in L2
    return triton.testing.do_bench(lambda: call(*next(turns)), warmup=25, rep=150, return_mode="median")


def sm90_tool_version() -> str:
    """Version of the ptxas this Triton assembles sm90 with."""
    from triton.backends.nvidia import compiler

    try:
        return compiler.get_ptxas(90).version
    except TypeError:  # a Triton whose get_ptxas takes no arch: one ptxas for every target
        return compiler.get_ptxas().version


def kernel_times(call, q, k, v, n: int = 10) -> dict:
    """Device µs per call: the Gluon whole kernel, its split (tail) kernel, everything else (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call(q, k, v)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call(q, k, v)
        torch.cuda.synchronize()
    out = {"whole": 0.0, "split": 0.0, "other": 0.0}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
        part = ("whole" if "shared_kv_attention" in e.key else "split" if "shared_kv_split" in e.key
                else "other")
        out[part] += t / n
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--old-ptxas", default=None, help="a CUDA 12.x ptxas (default: the machine's Triton's)")
    a = ap.parse_args(argv)
    assert torch.cuda.is_available(), "needs the GPU"
    sm90 = sm90_tool_version()
    print(environment())
    print(f"triton {triton.__version__} ({os.path.dirname(triton.__file__)}), sm90 ptxas {sm90}; "
          f"TRITON_DEFAULT_FP_FUSION={os.environ.get('TRITON_DEFAULT_FP_FUSION')}")
    variants = "A"
    old = None
    if not sm90.startswith("12."):  # Triton 3.9: B is the same PTX through a CUDA 12 ptxas
        old = a.old_ptxas or find_old_ptxas()
        if not old:
            print("no CUDA 12 ptxas found: name one with --old-ptxas")
            return 2
        variants = "AB"
        print(f"B: ptxas {tool_version(old)} {old}")
    else:  # 3.6-3.8 assemble sm90 with a CUDA 12 ptxas already: A alone, the baseline in the same format
        print("this Triton assembles sm90 with a CUDA 12 ptxas: A only (the baseline)")

    triton_compat._sm90_ptxas[:] = [None]  # A: as this Triton builds it; B: the ptxas named here, explicitly
    cfg = default_config(detect_arch(torch.device("cuda")), 128)
    originals = (hopper_gluon.shared_kv_attention_kernel, hopper_gluon.shared_kv_split_kernel)
    twins = {k: gluon.jit(k.fn) for k in originals}
    state = {"variant": "A", "ran": set()}

    def launch(kernel, grid, args, constexprs, options):  # api's launch hook: B runs the twins
        k = twins.get(kernel, kernel) if state["variant"] == "B" else kernel
        k[grid](*args, **constexprs, **options)
        state["ran"].add(k)

    api.set_launch_hook(launch)
    gen = torch.Generator(device="cuda").manual_seed(0)
    data = {s: [tuple(torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
                for _ in range(2)] for s in SHAPES}

    def call(q, k, v):
        return api.attention_forward(q, k, v, "HND", False, None, None, False, cfg, True, False)[0]

    outs = {}
    for variant in variants:  # compile (B with the older ptxas) and keep one output per shape
        state["variant"] = variant
        with triton_compat.sm90_ptxas_scope(old) if variant == "B" else nullcontext():
            for s in SHAPES:
                outs[variant, s] = call(*data[s][0]).clone()
        torch.cuda.synchronize()
    used = [k for k in originals if k in state["ran"]] + [twins[k] for k in originals if twins[k] in state["ran"]]
    for line in (f for k in used for f in compiled_facts(k)):
        print("  ", line)
    assert any(k in state["ran"] for k in originals), "the Gluon kernel did not run"
    assert "B" not in variants or all(twins[k] in state["ran"] for k in originals if k in state["ran"])

    times = {(v, s): [] for v in variants for s in SHAPES}
    for r in range(a.rounds):
        for s in SHAPES:
            for variant in (variants if r % 2 == 0 else variants[::-1]):
                state["variant"] = variant
                times[variant, s].append(timed(call, data[s]))

    print(f"\n{'shape':>22} {'var':>3} {'ms':>7} {'TOPS':>5} {'vs A':>6} {'3.6 TOPS':>8}  "
          "device µs/call: whole + split + other   outputs vs A")
    for s in SHAPES:
        B_, H, L, D = s
        for variant in variants:
            state["variant"] = variant
            ms = statistics.median(times[variant, s])
            ref = statistics.median(times["A", s])
            kt = kernel_times(call, *data[s][0])
            oa, ov = outs["A", s].float(), outs[variant, s].float()
            same = "identical" if torch.equal(oa, ov) else (
                f"max|d| {float((oa - ov).abs().max()):.2e}, cos "
                f"{float(torch.nn.functional.cosine_similarity(oa.flatten(), ov.flatten(), dim=0)):.6f}")
            print(f"{str(list(s)):>22} {variant:>3} {ms:7.3f} {4 * B_ * H * L * L * D / (ms * 1e-3) / 1e12:5.0f} "
                  f"{ms / ref:6.3f} {T36_TOPS[s]:8d}  {kt['whole']:7.0f} + {kt['split']:5.0f} + {kt['other']:5.0f}"
                  f"   {same}")
    spread = ", ".join(f"{v} {max(times[v, s]) / min(times[v, s]) - 1:.1%}" for s in SHAPES for v in variants)
    print(f"{a.rounds} rounds, medians; max/min - 1 per shape and variant: {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
