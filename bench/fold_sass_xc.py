"""Does a refactor of shared kernel code change what is compiled? The launches of dense and sparse calls over a
grid of configs (targets, head dims, dtypes, rotation, granularity, P·V precision, LSE), recorded on meta tensors
and cross-compiled without a GPU; per launch its normalized SASS (instruction text, addresses and the kernel's
name dropped) as a hash, the instruction count, registers and spills. Run it on the commit before and the one
after (under each Triton: ``PYTHONPATH=/tmp/t36lib`` for 3.6) and ``--compare`` the two files.

    python bench/fold_sass_xc.py --out /tmp/before.json [--only quantize,attention] [--targets sm90,sm80]
    python bench/fold_sass_xc.py --compare /tmp/before.json /tmp/after.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
from common import environment, import_pack  # noqa: E402

import_pack()
import torch  # noqa: E402
from lse_cost_xc import sass_of  # noqa: E402
from sagetriton.installer import crosscompile as cc  # noqa: E402
from sagetriton.kernels import api, replay, sparse_launch  # noqa: E402
from sagetriton.kernels.arch import default_config  # noqa: E402
from sagetriton.kernels.sparse_api import sparse_attn  # noqa: E402
from sparse_route_xc import as_on_cuda  # noqa: E402


def normalized(sass: str) -> list:
    """The instructions' text in order (no addresses, encodings or headers that name the kernel)."""
    return [m.group(1) for m in (re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", ln) for ln in sass.splitlines()) if m]


def variants(target: str, hd: int) -> list:
    """(label, config) pairs: the default and one change at a time."""
    base = default_config(cc.parse_target(target).arch_info(), hd)
    out = [("default", base), ("norot", base.replace(qk_rotation=False)),
           ("per_thread", base.replace(qk_quant_gran="per_thread")),
           ("per_block", base.replace(qk_quant_gran="per_block"))]
    if base.rotation_tiles:
        out.append(("dotrot", base.replace(rotation_tiles=False)))
    for pv in ("int8", "fp8") if target == "sm90" else ("int8", "fp16"):
        if pv != base.pv_precision:
            out.append((f"pv_{pv}", base.with_pv_choice(pv)))
            out.append((f"pv_{pv}_per_thread", base.with_pv_choice(pv).replace(qk_quant_gran="per_thread")))
    return out


def record(target: str, hd: int, dtype, path: str, only_variants=()) -> list:
    """(label, spec) of the launches of the dense (``path`` "dense") or sparse calls of each variant."""
    out = []
    for name, cfg in variants(target, hd):
        if only_variants and name not in only_variants:
            continue
        for lse in (False, True):
            for mma_sums in ((True, False) if path == "sparse" and dtype != torch.float32 else (None,)):
                if mma_sums is not None:
                    sparse_launch.TUNING["quant_mma_sums"] = mma_sums
                replay.clear()
                q = torch.empty((1, 1000, 2, hd), dtype=dtype, device="meta")
                with cc.record_launches() as rec:
                    if path == "dense":
                        qh = q.transpose(1, 2)
                        api.attention_forward(qh, qh, qh, "HND", False, None, None, lse, cfg, True, False)
                    else:
                        sparse_attn(q, q, q, 1.3, config=cfg, return_lse=lse)
                sparse_launch.TUNING["quant_mma_sums"] = True
                tag = f"{target}:{path}:hd{hd}:{str(dtype)[6:]}:{name}:lse{int(lse)}" + (
                    "" if mma_sums is None else f":mma{int(mma_sums)}")
                out += [(f"{tag}:{i}:{s['name']}", as_on_cuda(s)) for i, s in enumerate(rec)]
    return out


def build(args) -> None:
    only = [o for o in args.only.split(",") if o]
    rows, cache = {}, {}
    for target in args.targets.split(","):
        tgt = cc.parse_target(target)
        for hd in (64, 128):
            for dtype in (getattr(torch, t) for t in args.dtypes.split(",")):
                for path in ("dense", "sparse"):
                    for label, spec in record(target, hd, dtype, path, [v for v in args.variants.split(",") if v]):
                        if only and not any(o in spec["name"] for o in only):
                            continue
                        src = cc.launch_source(spec, tgt)
                        key = (target, src.hash(), json.dumps(spec.get("options") or {}, sort_keys=True))
                        if key not in cache:
                            sass, res = sass_of(spec, tgt)
                            ops = normalized(sass)
                            cache[key] = {"sass": hashlib.sha256("\n".join(ops).encode()).hexdigest()[:16],
                                          "instructions": len(ops), "registers": res.get("registers"),
                                          "spills": res.get("spills")}
                            if args.sass:
                                os.makedirs(args.sass, exist_ok=True)
                                with open(os.path.join(args.sass, cache[key]["sass"] + ".sass"), "w") as f:
                                    f.write("\n".join(ops) + "\n")
                            print(label, cache[key], flush=True)
                        rows[label] = cache[key]
    with open(args.out, "w") as f:
        json.dump({"environment": environment(), "kernels": rows}, f, indent=1)
        f.write("\n")
    print(f"{len(rows)} launches, {len(cache)} distinct builds")


def compare(a_path: str, b_path: str, verbose: bool = False) -> None:
    """Per target and kernel: launches whose SASS is the same, and for the others the spread of the instruction
    and register changes (each differing launch with ``verbose``)."""
    a, b = (json.load(open(p))["kernels"] for p in (a_path, b_path))
    groups: dict = {}
    for label in sorted(set(a) & set(b)):
        target, path, *_, name = label.split(":")
        g = groups.setdefault(f"{target} {path} {name}", {"same": 0, "differ": 0, "instr": [], "regs": [],
                                                          "spills": []})
        x, y = a[label], b[label]
        if x["sass"] == y["sass"]:
            g["same"] += 1
            continue
        g["differ"] += 1
        g["instr"].append(y["instructions"] - x["instructions"])
        g["regs"].append((y["registers"] or 0) - (x["registers"] or 0))
        g["spills"].append((y["spills"] or 0) - (x["spills"] or 0))
        if verbose:
            print(f"  {label}: {x['instructions']} -> {y['instructions']} instructions, "
                  f"{x['registers']} -> {y['registers']} registers, spills {x['spills']} -> {y['spills']}")
    for key, g in sorted(groups.items()):
        spread = "".join(f", {k} {min(g[k]):+d}..{max(g[k]):+d}" for k in ("instr", "regs", "spills") if g[k])
        print(f"{key}: identical {g['same']}, different {g['differ']}{spread}")
    missing = sorted(set(a) ^ set(b))
    if missing:
        print(f"{len(missing)} launches in one file only, e.g. {missing[:3]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--only", default="quantize,attention_kernel", help="substrings of the kernels to build")
    ap.add_argument("--targets", default="sm90,sm80")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--variants", default="", help="comma-separated variant names (``variants``); all by default")
    ap.add_argument("--sass", help="folder for the normalized SASS, one file per distinct build")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--verbose", action="store_true", help="with --compare: every launch that differs")
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare, args.verbose)
    else:
        build(args)


if __name__ == "__main__":
    sys.exit(main())
