"""Registers, spills and shared memory of the Q and K quantization launches per rotation method
(``rotation.METHOD``), cross-compiled without a GPU; runs on a CPU-only machine.

    python bench/rotation_cost_xc.py [--targets sm90,sm120,gfx1201] [--out bench/results/rotation_cost_xc.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re

os.environ.pop("TRITON_INTERPRET", None)
from common import import_pack  # noqa: E402

import_pack()
import triton  # noqa: E402
from sagetriton.installer import crosscompile as cc  # noqa: E402
from sagetriton.kernels import replay, rotation  # noqa: E402
from sagetriton.kernels.arch import default_config  # noqa: E402


def quant_launches(target, method: str, rotate: bool) -> list:
    rotation.METHOD = method
    replay.clear()
    cfg = default_config(target.arch_info(), 128).replace(qk_rotation=rotate)
    specs = cc.compile_specs(cfg, 128, seq_len=8192)
    return [s for s in specs if s["name"] == "quantize_int8_kernel"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="sm90,sm120,gfx1201")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for target in cc.parse_targets(args.targets):
        for label, method, rotate in [("no rotation", "dot", False)] + [(m, m, True) for m in rotation.METHODS]:
            for spec, which in zip(quant_launches(target, method, rotate), ("Q", "K"), strict=False):
                compiled = triton.compile(cc.launch_source(spec, target), target=target.gpu_target(),
                                          options=dict(spec.get("options") or {}))
                asm = compiled.asm.get("ptx" if target.backend == "cuda" else "amdgcn", "")
                row = {"target": target.name, "method": label, "launch": which,
                       "block": spec["constexprs"]["BLOCK"], "num_warps": spec["options"]["num_warps"],
                       "split": spec["constexprs"].get("ROTATE_SPLIT", 1), "shared": compiled.metadata.shared,
                       "mma": len(cc.matrix_instructions(asm, target.backend)),
                       "lines": len(re.findall(r"\n", asm)), **cc._resources(compiled, target)}
                rows.append(row)
                print(f"{row['target']:8} {label:12} {which} block {row['block']:3} warps {row['num_warps']} "
                      f"regs {row.get('registers', '?'):>4} spills {row.get('spills', '?'):>3} "
                      f"shared {row['shared']:6} B  mma {row['mma']:3}  asm lines {row['lines']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
