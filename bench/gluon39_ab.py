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
bench/NOTES.md ("Triton 3.9: why the Gluon kernel is slower") says what each outcome means.

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

from common import import_pack

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
    out = []
    for cache in jit_fn.device_caches.values():
        for ck in cache[0].values():
            ck._init_handles()
            ptx = ck.asm.get("ptx", "")
            ver = ptx[ptx.find(".version"):].split("\n", 1)[0] if ".version" in ptx else "?"
            out.append(f"{jit_fn.fn.__name__}: {ck.n_regs} regs, {ck.n_spills} spilled, {ver}")
    return out


def timed(call, sets) -> float:
    turns = itertools.cycle(sets)  # alternate input sets: no call finds the last one's tensors in L2
    return triton.testing.do_bench(lambda: call(*next(turns)), warmup=25, rep=150, return_mode="median")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--old-ptxas", default=None, help="a CUDA 12.x ptxas (default: the machine's Triton's)")
    a = ap.parse_args(argv)
    assert torch.cuda.is_available(), "needs the GPU"
    old = a.old_ptxas or find_old_ptxas()
    new = triton.knobs.nvidia.ptxas_blackwell.path
    print(f"triton {triton.__version__} ({os.path.dirname(triton.__file__)}); fp fusion default "
          f"{os.environ.get('TRITON_DEFAULT_FP_FUSION')}")
    print(f"A: ptxas {tool_version(new)} {new}\nB: ptxas {tool_version(old) if old else '-'} {old}")
    if not old:
        print("no CUDA 12 ptxas found: name one with --old-ptxas")
        return 2

    triton_compat._sm90_ptxas[:] = [None]  # A: as 3.9 builds it; B: the older ptxas named here, explicitly
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
    for variant in ("A", "B"):  # compile (B with the older ptxas) and keep one output per shape
        state["variant"] = variant
        with triton_compat.sm90_ptxas_scope(old) if variant == "B" else nullcontext():
            for s in SHAPES:
                outs[variant, s] = call(*data[s][0]).clone()
        torch.cuda.synchronize()
    used = [k for k in originals if k in state["ran"]] + [twins[k] for k in originals if twins[k] in state["ran"]]
    for line in (f for k in used for f in compiled_facts(k)):
        print("  ", line)
    assert all(twins[k] in state["ran"] for k in originals if k in state["ran"]), "B did not run the twins"

    times = {(v, s): [] for v in "AB" for s in SHAPES}
    for r in range(a.rounds):
        for s in SHAPES:
            for variant in ("AB" if r % 2 == 0 else "BA"):
                state["variant"] = variant
                times[variant, s].append(timed(call, data[s]))

    print(f"\n{'shape':>22} {'A ms':>7} {'B ms':>7} {'B/A':>6} {'A TOPS':>7} {'B TOPS':>7} {'3.6 TOPS':>8}  "
          "outputs A vs B")
    for s in SHAPES:
        B_, H, L, D = s
        ma, mb = (statistics.median(times[v, s]) for v in "AB")
        t = [4 * B_ * H * L * L * D / (m * 1e-3) / 1e12 for m in (ma, mb)]
        oa, ob = outs["A", s].float(), outs["B", s].float()
        same = "identical" if torch.equal(oa, ob) else (
            f"max|d| {float((oa - ob).abs().max()):.2e}, cos "
            f"{float(torch.nn.functional.cosine_similarity(oa.flatten(), ob.flatten(), dim=0)):.6f}")
        print(f"{str(list(s)):>22} {ma:7.3f} {mb:7.3f} {mb / ma:6.3f} {t[0]:7.0f} {t[1]:7.0f} {T36_TOPS[s]:8d}  {same}")
    spread = ", ".join(f"{v} {max(times[v, s]) / min(times[v, s]) - 1:.1%}" for s in SHAPES for v in "AB")
    print(f"{a.rounds} rounds, medians; max/min - 1 per shape and variant: {spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
