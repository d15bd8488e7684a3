"""Cross-compile the default kernels for GPUs this machine does not have, and check the assembly.

``triton.compile(ASTSource(...), target=GPUTarget(...))`` runs Triton's full NVIDIA or AMD
pipeline on any machine, GPU or not. Scanning the generated PTX / AMDGCN for matrix instructions
proves that Q·Kᵀ really runs as an int8 matmul (and P·V as fp8 where the arch table picks it) on
each GPU family, which is how the AMD paths are proven without an AMD GPU.

Triton's interpreter replaces ``@triton.jit`` functions at import time, so this cannot run in a
process with ``TRITON_INTERPRET=1``; ``check_targets_in_child`` runs it in a clean child instead.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Optional

from ..kernels.arch import ArchInfo, KernelConfig, arch_from_properties, default_config
from ..kernels.build_errors import root_cause
from ..kernels.triton_compat import TRITON_VERSION, sm90_ptxas_scope
from .doctor import GpuInfo
from .progress import progress_bar

DEFAULT_TARGETS = ("sm80", "sm86", "sm89", "sm90", "sm120", "gfx1100", "gfx1201", "gfx942")
PACK_DIR = Path(__file__).resolve().parent.parent

# Matrix instructions, as they are spelled in the assembly.
_PTX_MATRIX = re.compile(r"\b(wgmma\.mma_async[\w.:]*|mma\.sync[\w.:]*|tcgen05\.mma[\w.:]*)")
_AMDGCN_MATRIX = re.compile(r"\b(v_wmma_\w+|v_swmmac_\w+|v_mfma_\w+)")


@dataclass(frozen=True)
class Target:
    name: str  # "sm90", "gfx1201"
    backend: str  # "cuda" | "hip"
    arch: object  # int capability (cuda) or "gfxNNNN" (hip)
    warp_size: int

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)

    def arch_info(self) -> ArchInfo:
        """The arch table's view of this target, through the same code path as a real device."""
        if self.backend == "cuda":
            major, minor = divmod(self.arch, 10)
            props = GpuInfo(name=f"cross-compile {self.name}", major=major, minor=minor)
            return arch_from_properties(props, is_hip=False)
        return arch_from_properties(GpuInfo(name=f"cross-compile {self.name}", gcnArchName=self.arch), is_hip=True)


# Real GPUs of the supported families. Anything else (a typo such as sm91) would reach LLVM, which
# dies on an unknown processor instead of saying what is wrong.
KNOWN_TARGETS = ("sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm120", "sm121",
                 "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151",
                 "gfx1200", "gfx1201")


def parse_target(name: str) -> Target:
    """``sm90`` -> CUDA capability 90; ``gfx1201`` -> HIP, wave32 on RDNA, wave64 on CDNA (gfx9xx)."""
    given = name.strip()
    name = given.lower()
    m = re.fullmatch(r"sm_?(\d{2,3})a?", name)
    if m and f"sm{m.group(1)}" in KNOWN_TARGETS:
        return Target(f"sm{m.group(1)}", "cuda", int(m.group(1)), 32)
    if name in KNOWN_TARGETS and name.startswith("gfx"):
        return Target(name, "hip", name, 64 if name.startswith("gfx9") else 32)
    raise ValueError(f"unknown target {given!r}; known: {', '.join(KNOWN_TARGETS)}")


def parse_targets(text: str) -> list:
    return [parse_target(t) for t in text.split(",") if t.strip()]


# ---------------------------------------------------------------------------------------------
# What must be in the assembly


_PV_PATTERNS = {  # backend kind -> P·V precision -> operand types of its matrix instruction
    "cuda": {"fp8": r".*(\.e4m3|kind::f8f6f4)", "int8": r".*(\.s8|kind::i8)", "fp16": r".*(\.f16|\.bf16|kind::f16)"},
    "cdna": {"fp8": r"^v_mfma_f32_\w+_(fp8_fp8|f8f6f4)$", "int8": r"^v_mfma_i32_\w+_i8$",
             "fp16": r"^v_mfma_f32_\w+_(f16|bf16)$"},
    "rdna": {"fp8": r"^v_wmma_f32_16x16x16_fp8_fp8", "int8": r"^v_wmma_i32_16x16x16_iu8",
             "fp16": r"^v_wmma_f32_16x16x16_(f16|bf16)"},
}


def expected_instructions(target: Target, cfg: KernelConfig) -> dict:
    """label -> regex that must match one of the matrix instructions found."""
    want = {}
    pv = cfg.pv_precision if cfg.pv_precision in ("fp8", "int8") else "fp16"
    if target.backend == "cuda":
        mma = r"^wgmma\." if target.arch // 10 == 9 else r"^(mma\.sync|tcgen05\.mma)"
        # Blackwell datacenter parts (sm100) spell the operand types as tcgen05 "kind"s.
        want["int8 Q·Kᵀ"] = mma + _PV_PATTERNS["cuda"]["int8"]
        want[f"{cfg.pv_precision} P·V"] = mma + _PV_PATTERNS["cuda"][pv]
    else:
        kind = "cdna" if target.arch.startswith("gfx9") else "rdna"
        want["int8 Q·Kᵀ"] = _PV_PATTERNS[kind]["int8"]
        want[f"{cfg.pv_precision} P·V"] = _PV_PATTERNS[kind][pv]
    return want


def matrix_instructions(asm: str, backend: str) -> list:
    pattern = _PTX_MATRIX if backend == "cuda" else _AMDGCN_MATRIX
    return sorted(set(pattern.findall(asm)))


# ---------------------------------------------------------------------------------------------
# Compiling


def _arg_type(a) -> str:
    """The Triton signature type of one launch argument."""
    import torch

    dtypes = {torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.float32: "fp32", torch.float16: "fp16",
              torch.bfloat16: "bf16", torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv",
              torch.float8_e4m3fnuz: "fp8e4b8"}
    if isinstance(a, torch.Tensor):
        return "*" + dtypes[a.dtype]
    if isinstance(a, bool):
        return "i1"
    if isinstance(a, int):
        return "i32" if -(2**31) <= a < 2**31 else "i64"
    if isinstance(a, float):
        return "fp32"
    if type(a).__name__ == "TensorDescriptor":
        return f"tensordesc<{dtypes[a.base.dtype]}[{','.join(map(str, a.block_shape))}]>"
    raise TypeError(f"no Triton type for {type(a).__name__}")


@contextmanager
def record_launches():
    """Inside the block, the kernel library's launches are described, not run: yields the list of specs
    (``{"name", "fn", "signature", "args", "constexprs", "options"}``) they append to."""
    from ..kernels import api

    specs: list = []

    def record(kernel, grid, args, constexprs, options):
        names = [n for n in kernel.arg_names if n not in constexprs]
        signature = dict(zip(names, map(_arg_type, args), strict=True))
        signature.update({n: "constexpr" for n in constexprs})
        specs.append({"name": kernel.fn.__name__, "fn": kernel, "signature": signature, "args": args,
                      "constexprs": constexprs, "options": options})

    previous = api.set_launch_hook(record)
    try:
        yield specs
    finally:
        api.set_launch_hook(previous)


def compile_specs(cfg: KernelConfig, head_dim: int = 128, dtype=None, seq_len: int = 1024) -> list:
    """The launches of ``sageattn`` calls with ``cfg`` (no mask), recorded on meta tensors: one at
    ``seq_len`` and, where the config switches kernels on length (Hopper's Gluon kernel), one at
    that length too, so every attention kernel a user can run is in the list once. So this check
    builds what users run; ``args`` (meta tensors and ints) let ``launch_source`` specialize them as
    Triton's launcher would."""
    import torch

    from ..kernels import api, hopper_gluon, tail_split

    dtype = dtype or torch.bfloat16
    specs: list = []
    for length in sorted({seq_len, max(seq_len, cfg.shared_kv_min_len)}):
        heads = 2
        if cfg.shared_kv_min_len and length >= cfg.shared_kv_min_len:  # record the Gluon kernel's both launches
            heads = tail_split.heads_with_split_tail(*hopper_gluon.grid(length, length),
                                                     api.sm_count(torch.device("meta")))
        q = torch.empty((1, heads, length, head_dim), dtype=dtype, device="meta")
        with record_launches() as recorded:
            api.attention_forward(q, q, q, "HND", False, None, None, False, cfg, True, False)
        seen = {s["name"] for s in specs}
        specs += [s for s in recorded if s["name"] not in seen]
    return specs


def rope_specs(head_dim: int = 128, dtype=None, seq_len: int = 1024) -> list:
    """The RoPE kernel's launches (``kernels.rope``: Flux's q and k together; ComfyUI's both roundings),
    recorded on meta tensors as ``compile_specs`` records the attention's."""
    import torch

    from ..kernels import rope

    x = torch.empty((1, 2, seq_len, head_dim), dtype=dtype or torch.bfloat16, device="meta")
    freqs = torch.empty((1, 1, seq_len, head_dim // 2, 2, 2), dtype=torch.float32, device="meta")
    with record_launches() as recorded:
        for fma in (False, True):
            rope.apply(x, freqs, x, fma=fma)
    for spec, fma in zip(recorded, (False, True), strict=True):
        spec["name"] = f"rope_kernel{'_fma' if fma else ''}"
    return recorded


def sparse_specs(cfg: KernelConfig, head_dim: int = 128, backend: str = "cuda", dtype=None,
                 seq_len: int = 1000) -> list:
    """The launches of ``sparse_attn`` calls with ``cfg`` (tau, top-k and extra tokens; a length that is no
    multiple of 64, so the ragged last block is in), recorded on meta tensors as ``compile_specs`` records the
    dense ones. The routers' fp32 products take the precision the target's backend runs
    (``sparse_launch.dot_precisions``)."""
    import torch

    from ..kernels import sparse_extra, sparse_launch
    from ..kernels.sparse_api import sparse_attn

    q = torch.empty((1, seq_len, 2, head_dim), dtype=dtype or torch.bfloat16, device="meta")
    specs: list = []
    with record_launches() as recorded:
        sparse_attn(q, q, q, 1.3, config=cfg, return_lse=True)
        sparse_attn(q, q, q, topk_ratio=0.2, config=cfg)
        sparse_attn(q, q, q, 1.3, config=cfg, extra_tokens=128)
    score, tail = sparse_launch.dot_precisions(torch.device("cuda")) if backend == "cuda" else ("ieee", "ieee")
    seen: set = set()
    for spec in recorded:
        name = spec["name"]
        if name not in ("pool_kernel", "pool_finish_kernel", "centre_means_kernel", "sparse_quantize_int8_kernel",
                        "route_kernel", "sparse_attention_kernel", "extra_tail_kernel", "extra_merge_kernel"):
            continue  # V's conversion: the dense specs build it
        key = (name, tuple(sorted((k, str(v)) for k, v in spec["constexprs"].items())))
        if key in seen:
            continue
        seen.add(key)
        c = spec["constexprs"]
        if name == "route_kernel":
            c.update(SCORE_PREC=score, TAIL_PREC=tail)
            spec["name"] = "route_kernel_topk" if c["HAS_THR"] else "route_kernel"
        elif name == "extra_tail_kernel":
            c.update(SCORE_PREC=sparse_extra.score_precision(c["PARTS"], score), TAIL_PREC=tail)
        elif name == "extra_merge_kernel":
            c.update(PREC="tf32x3" if score == "tf32" else "ieee")
        elif name == "pool_kernel":
            spec["name"] = f"pool_kernel{'_absmax' if c['ABSMAX'] else ''}"
        elif name == "sparse_quantize_int8_kernel":  # K's (centred) and Q's (row dots: LSE or not) launches
            spec["name"] = f"{name}_{'k' if c['SUBTRACT'] else 'q'}{c['ROW_DOTS'] or ''}"
        elif name == "sparse_attention_kernel" and not c["RETURN_LSE"]:
            spec["name"] = "sparse_attention_kernel_nolse"
        elif name == "sparse_attention_kernel" and not c["HAS_QBIAS"]:  # extra tokens: the LSE in the centred
            spec["name"] = "sparse_attention_kernel_centred"  # frame, for the merge
        specs.append(spec)
    return specs


def launch_source(spec: dict, target: Target):
    """The ``ASTSource`` a real launch with ``spec["args"]`` compiles: specialized by Triton's own
    launcher code (16-byte-aligned pointers and integers, integers equal to 1 as constants).

    Without that the compiler cannot prove unit strides or alignment, vectorizes nothing and the
    register counts describe a kernel nobody runs (gfx1201 spilled 81 VGPRs that way, against none
    in the real build). Falls back to the plain signature where Triton's internals differ.
    """
    from triton.compiler import ASTSource

    kernel, constexprs = spec["fn"], spec.get("constexprs") or {}
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    if "args" in spec:
        try:
            from triton.compiler import make_backend
            from triton.runtime.jit import create_function_from_signature

            backend = make_backend(target.gpu_target())
            bind = create_function_from_signature(kernel.signature, kernel.params, backend)
            names = [n for n in kernel.arg_names if n not in constexprs]
            bound, specialization, _ = bind(**dict(zip(names, spec["args"], strict=True)), **constexprs)
            _, signature, consts, attrs = kernel._pack_args(backend, {}, bound, specialization, {})
            return ASTSource(kernel, signature, consts, attrs)
        except Exception:  # noqa: BLE001 - private Triton API: a plain build is still a valid check
            pass
    return ASTSource(kernel, spec["signature"], constexprs, spec.get("attrs"))


# Attention kernel name -> where compile_target reports its registers, spills and shared memory.
_ATTENTION_KERNELS = {"attention_kernel": None, "shared_kv_attention_kernel": "shared_kv_kernel",
                      "shared_kv_split_kernel": "shared_kv_split_kernel", "sparse_attention_kernel": "sparse_kernel",
                      "route_kernel": "route_kernel"}


def _compile_one(spec: dict, target: Target) -> dict:
    import triton

    gluon = getattr(spec["fn"], "is_gluon", lambda: False)() and target.name == "sm90"
    with sm90_ptxas_scope() if gluon else nullcontext():  # the ptxas api builds the Gluon kernels with
        compiled = triton.compile(launch_source(spec, target), target=target.gpu_target(),
                                  options=dict(spec.get("options") or {}))
    asm = compiled.asm.get("ptx" if target.backend == "cuda" else "amdgcn", "")
    out = {"asm": asm if isinstance(asm, str) else asm.decode(errors="replace"),
           "shared": compiled.metadata.shared}
    if spec.get("name") in _ATTENTION_KERNELS:  # the kernels whose occupancy matters
        out.update(_resources(compiled, target))
    return out


def _resources(compiled, target: Target) -> dict:
    """Registers per thread and spills of a compiled kernel. AMD: VGPRs spilled, from the amdgcn
    metadata. NVIDIA: local-memory load/store instructions in the SASS (nvdisasm ships with Triton;
    cuobjdump's LOCAL figure can read 0 while spill code exists). Empty if unavailable."""
    try:
        if target.backend == "hip":
            asm = compiled.asm["amdgcn"]
            return {"registers": int(re.search(r"\.vgpr_count:\s+(\d+)", asm).group(1)),
                    "spills": int(re.search(r"\.vgpr_spill_count:\s+(\d+)", asm).group(1))}
        import tempfile

        import triton

        tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            use = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                                 text=True, check=True).stdout
            sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                                  check=True).stdout
        return {"registers": int(re.search(r"REG:(\d+)", use).group(1)),
                "spills": len(re.findall(r"\b(?:LDL|STL)\b", sass)),
                # Stores to local memory: how many values are spilled (each then reloaded where used).
                "spill_stores": len(re.findall(r"\bSTL\b", sass))}
    except Exception:  # noqa: BLE001 - resource numbers are a report, never a failure
        return {}


def compile_target(target: Target, head_dim: int = 128, specs_for: Optional[Callable] = None) -> dict:
    """``{"ok", "instructions", "expected", "missing", "config", "seconds", "error"?}`` for one target."""
    t0 = time.perf_counter()
    arch = target.arch_info()
    cfg = default_config(arch, head_dim)
    result = {"ok": False, "instructions": [], "arch": arch.arch, "family": arch.family,
              "config": cfg.as_dict(), "head_dim": head_dim, "triton": ".".join(map(str, TRITON_VERSION))}
    try:
        specs = (specs_for(cfg, head_dim) if specs_for else
                 compile_specs(cfg, head_dim) + rope_specs(head_dim) + sparse_specs(cfg, head_dim, target.backend))
        found: set = set()
        for spec in specs:
            try:
                out = _compile_one(spec, target)
            except Exception as e:  # noqa: BLE001 - report which kernel failed, keep the others' results
                raise _KernelFailed(f"{spec.get('name', spec['fn'].__name__)}: {root_cause(e)}") from e
            mine = matrix_instructions(out["asm"], target.backend)
            found.update(mine)
            result.setdefault("kernels", {})[spec.get("name") or spec["fn"].__name__] = mine
            if spec.get("name") in _ATTENTION_KERNELS:
                use = {k: out[k] for k in ("registers", "spills", "spill_stores", "shared") if k in out}
                key = _ATTENTION_KERNELS[spec["name"]]
                result.update({key: use} if key else use)
        result["instructions"] = sorted(found)
        want = expected_instructions(target, cfg)
        result["expected"] = want
        missing = [label for label, rx in want.items() if not any(re.search(rx, i) for i in found)]
        result["missing"] = missing
        result["ok"] = not missing
        if missing:
            result["error"] = "compiled, but no " + " / ".join(missing) + " matrix instruction in the assembly"
    except Exception as e:  # noqa: BLE001 - one target failing must not hide the others
        result["error"] = str(e) if isinstance(e, _KernelFailed) else root_cause(e)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


class _KernelFailed(Exception):
    """One kernel of a target did not build; the message names it and the root cause."""


@cache
def _cached_compile(name: str, head_dim: int) -> str:
    return json.dumps(compile_target(parse_target(name), head_dim))


def check_targets(targets=DEFAULT_TARGETS, head_dim: int = 128, progress: bool = False) -> dict:
    """Cross-compile for each target in this process (results cached per process)."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: cross-compile in a clean process (check_targets_in_child)")
    names = [t.name if isinstance(t, Target) else parse_target(t).name for t in targets]
    bar = progress_bar(len(names), "cross-compile", unit="target") if progress else None
    results = {}
    for n in names:
        if bar:
            bar.set_postfix_str(n)
        results[n] = json.loads(_cached_compile(n, head_dim))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return results


def check_targets_in_child(targets=DEFAULT_TARGETS, head_dim: int = 128, timeout: float = 900.0) -> dict:
    """``check_targets`` through ``install.py --check-targets --json`` in a child without the interpreter."""
    names = [t.name if isinstance(t, Target) else parse_target(t).name for t in targets]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(PACK_DIR / "install.py"), "--check-targets", ",".join(names),
           "--head-dim", str(head_dim), "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, errors="replace")
        return json.loads(proc.stdout)
    except subprocess.TimeoutExpired:
        err = f"cross-compile timed out after {timeout:.0f} s"
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        err = f"cross-compile child failed (exit {proc.returncode}): {tail}"
    return {n: {"ok": False, "instructions": [], "error": err} for n in names}


def format_table(results: dict) -> str:
    lines = []
    for name, r in results.items():
        mark = "[ OK ]" if r.get("ok") else "[FAIL]"
        pv = (r.get("config") or {}).get("pv_precision", "?")
        short = sorted({_short(i) for i in r.get("instructions", [])})
        text = f"{mark} {name:<8} P·V {pv:<4} {', '.join(short) or '-'}"
        if "registers" in r:
            unit = "VGPRs" if name.startswith("gfx") else "local loads/stores"
            spills = f"{r['spills']} {unit} spilled" if r.get("spills") else "no spills"
            text += f"  ({r['registers']} registers, {spills})"
        if not r.get("ok"):
            text += f"\n         {r.get('error', '')[:300]}"
        lines.append(text)
    return "\n".join(lines)


def _short(instr: str) -> str:
    """``mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32`` -> ``mma.sync s8`` (for the table)."""
    if instr.startswith("v_"):
        return instr
    head = "wgmma" if instr.startswith("wgmma") else instr.split(".")[0] + (".sync" if ".sync" in instr else "")
    for t in ("e4m3", "e5m2", "s8", "bf16", "f16", "tf32"):
        if f".{t}" in instr:
            return f"{head} {t}"
    if "kind::" in instr:
        return f"{head} {instr.rsplit('kind::', 1)[1]}"
    return head
