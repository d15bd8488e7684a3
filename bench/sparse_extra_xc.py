"""The extra-token kernels (``kernels/sparse_extra_route.py``, issue 54) cross-compiled without a GPU: per
target their registers and spills; for the NVIDIA targets also the SASS per loop (instructions, tensor-core
instructions by kind, conversions, shared/global/local accesses), for sm90 whether the scores use wgmma
(HGMMA) or mma.sync (HMMA). The launches are those of one bf16 ``sparse_attn`` call with ``extra_tokens``,
recorded on meta tensors (``installer.crosscompile.sparse_specs``). Runs on a CPU-only machine.

    python bench/sparse_extra_xc.py [--targets sm80,sm89,sm90,sm120,gfx942,gfx1100,gfx1201] [--head-dim 128]
                                    [--out bench/results/xc_sparse_extra.json] [--sass DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
from collections import Counter
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
from common import environment, import_pack  # noqa: E402

import_pack()
import triton  # noqa: E402
from lse_cost_xc import loop_spans  # noqa: E402
from sagetriton.installer import crosscompile as cc  # noqa: E402
from sagetriton.kernels.arch import default_config  # noqa: E402

CLASSES = {"HGMMA": r"^HGMMA\b", "HMMA": r"^HMMA\b", "F2F/cvt": r"^(F2F|F2FP|I2F|F2I)\b",
           "shared": r"^(LDS|STS|LDSM|STSM)\b", "global": r"^(LDG|STG|ATOMG|RED)\b", "atoms": r"^ATOMS\b",
           "vote": r"^VOTE\b", "local": r"^(LDL|STL)\b", "barrier": r"^(BAR|SYNCS)\b"}
NAMES = ("extra_tail_kernel", "extra_merge_kernel")


def loop_table(sass: str) -> list:
    """Each loop (a backward branch to an earlier label), in program order: its instructions and classes."""
    ins, where, spans = loop_spans(sass)
    found = []
    for a, i, _ in spans:
        body = [o for _, o in ins[a:i + 1] if o]
        c = Counter(k for o in body for k, pat in CLASSES.items() if re.match(pat, o))
        found.append({"start": a, "instructions": len(body), "main_path": len(body) - _longest_skip(ins, where, a, i),
                      **{k: c.get(k, 0) for k in CLASSES}})
    return sorted(found, key=lambda r: r["start"])


def _longest_skip(ins, where, a, b) -> int:
    """Instructions jumped over by the longest forward branch inside ``ins[a:b]`` (the extra tokens' compaction,
    run only for key blocks holding some): the loop's main path is the rest."""
    best = 0
    for i in range(a, b):
        m = ins[i][1] and re.match(r"^BRA(?:\.DIV\s+\w+,)?\s+(?:`\()?(\.L_x_\d+)", ins[i][1])
        if m and i < where.get(m.group(1), -1) <= b:
            best = max(best, sum(1 for _, o in ins[i + 1:where[m.group(1)]] if o))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="sm80,sm89,sm90,sm120,gfx942,gfx1100,gfx1201")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--out")
    ap.add_argument("--sass")
    args = ap.parse_args()
    rows = []
    for name in args.targets.split(","):
        target = cc.parse_target(name)
        cfg = default_config(target.arch_info(), args.head_dim)
        for spec in cc.sparse_specs(cfg, args.head_dim, target.backend):
            if spec["name"] not in NAMES:
                continue
            compiled = triton.compile(cc.launch_source(spec, target), target=target.gpu_target(),
                                      options=dict(spec.get("options") or {}))
            res = cc._resources(compiled, target)
            row = {"target": name, "kernel": spec["name"], "num_warps": spec["options"].get("num_warps"),
                   "QB": spec["constexprs"].get("QB"), **res, "shared": compiled.metadata.shared}
            if target.backend == "cuda":
                import subprocess
                import tempfile

                tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(compiled.asm["cubin"])
                    f.flush()
                    sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                                          check=True).stdout
                row["loops"] = loop_table(sass)
                if args.sass:
                    Path(args.sass).mkdir(parents=True, exist_ok=True)
                    (Path(args.sass) / f"{name}_{spec['name']}.sass").write_text(sass)
                    (Path(args.sass) / f"{name}_{spec['name']}.ttgir").write_text(compiled.asm["ttgir"])
            rows.append(row)
            print(f"{name:8} {spec['name']:20} warps {row['num_warps']} QB {row['QB']} regs {res.get('registers')} "
                  f"spills {res.get('spills')} smem {row['shared']}", flush=True)
            for lp in row.get("loops", []):
                print("    loop " + " ".join(f"{k} {v}" for k, v in lp.items() if k != "start"), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": environment(), "head_dim": args.head_dim,
                                              "kernels": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
