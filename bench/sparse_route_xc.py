"""What the sparse call runs before its attention kernel, in sm90 SASS (issue 54, routing share): the
launches of one ``sparse_attn`` call and one dense ``sageattn`` call of the same shape, recorded on meta tensors
(132 SMs, an H200's) and cross-compiled without a GPU: per kernel its grid, registers, spills, instructions,
global/shared accesses and tensor-core instructions, and per loop the same. Runs on a CPU-only machine.

    python bench/sparse_route_xc.py [--shape 103950x56] [--tuning '{"route_tiles": [64, 32], "route_warps": 4}']
                                    [--only route,pool] [--out bench/results/sm90_sparse_route_xc.json] [--sass DIR]
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
import torch  # noqa: E402
from lse_cost_xc import loops, sass_of  # noqa: E402
from sagetriton.installer import crosscompile as cc  # noqa: E402
from sagetriton.kernels import api, replay, rotation, sparse_launch  # noqa: E402
from sagetriton.kernels.arch import default_config  # noqa: E402
from sagetriton.kernels.sparse_api import sparse_attn  # noqa: E402

CLASSES = {"ldg": r"^LDG\b", "stg": r"^STG\b", "lds": r"^(LDS|LDSM)\b", "sts": r"^(STS|STSM)\b",
           "local": r"^(LDL|STL)\b", "barrier": r"^(BAR|SYNCS)\b", "shuffle": r"^SHFL\b",
           "mma": r"^(HMMA|IMMA|HGMMA|IGMMA|QGMMA)\b", "ffma": r"^FFMA\b", "fadd": r"^FADD\b"}
SKIP = ("sparse_attention_kernel", "attention_kernel", "shared_kv_attention_kernel", "shared_kv_split_kernel")


def ops_of(sass: str) -> list:
    out = []
    for line in sass.splitlines():
        m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m:
            out.append(re.sub(r"^@!?U?P\w+\s+", "", m.group(1)))
    return out


def counts(ops: list) -> dict:
    c = Counter(k for o in ops for k, pat in CLASSES.items() if re.match(pat, o))
    return {k: c.get(k, 0) for k in CLASSES}


class _Grids:
    """Wraps ``record_launches``' hook to keep each launch's grid too."""

    def __enter__(self):
        self.grids = []
        self.inner = api.set_launch_hook(None)

        def hook(kernel, grid, *rest):
            self.grids.append(tuple(grid))
            self.inner(kernel, grid, *rest)
        api.set_launch_hook(hook)
        return self.grids

    def __exit__(self, *exc):
        api.set_launch_hook(self.inner)


def as_on_cuda(spec: dict) -> dict:
    """The options and constexprs the launch takes on an NVIDIA GPU, where the meta recording differs: the
    router's TF32 products (``sparse_launch.dot_precisions``) and the quantization's register caps."""
    c, o = spec["constexprs"], spec.setdefault("options", {})
    if spec["name"] == "pool_kernel" and sparse_launch.TUNING["pool_stages"] is None:  # NVIDIA's default
        o["num_stages"] = 2
    if spec["name"] == "route_kernel":
        c.update(SCORE_PREC="tf32", TAIL_PREC="tf32")
        if sparse_launch.TUNING.get("route_maxnreg"):  # set only on a CUDA device
            o.setdefault("maxnreg", sparse_launch.TUNING["route_maxnreg"])
    if spec["name"] in ("sparse_quantize_int8_kernel", "quantize_int8_kernel") and c.get("ROTATE_TILES"):
        if spec["name"] == "sparse_quantize_int8_kernel":
            from sagetriton.kernels import sparse_quant
            caps = getattr(sparse_quant, "maxnreg_for", None)
            o.setdefault("maxnreg", caps(o["num_warps"]) if caps else
                         sparse_quant.TILED_4WARP_MAXNREG if o["num_warps"] == 4 else rotation.TILED_MAXNREG)
        else:
            o.setdefault("maxnreg", rotation.TILED_MAXNREG)
    return spec


def record(T: int, H: int, tau: float = 1.3) -> list:
    cfg = default_config(cc.parse_target("sm90").arch_info(), 128)
    q = torch.empty((1, T, H, 128), dtype=torch.bfloat16, device="meta")
    specs = []
    replay.clear()
    with cc.record_launches() as rec, _Grids() as grids:
        sparse_attn(q, q, q, tau, config=cfg)
    specs += [("sparse", s, g) for s, g in zip(rec, grids, strict=True)]
    qh = q.transpose(1, 2)
    with cc.record_launches() as rec, _Grids() as grids:
        api.attention_forward(qh, qh, qh, "HND", False, None, None, False, cfg, True, False)
    specs += [("dense", s, g) for s, g in zip(rec, grids, strict=True)]
    return [(p, as_on_cuda(s), g) for p, s, g in specs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="103950x56")
    ap.add_argument("--out")
    ap.add_argument("--sass")
    ap.add_argument("--tuning", default="{}", help="JSON: sparse_launch.TUNING entries to set first")
    ap.add_argument("--only", default="", help="comma-separated substrings of the kernels to build")
    args = ap.parse_args()
    sparse_launch.TUNING.update(json.loads(args.tuning))
    T, H = (int(x) for x in args.shape.split("x"))
    target = cc.parse_target("sm90")
    rows = []
    for path, spec, grid in record(T, H):
        name = spec["name"]
        if name in SKIP or "convert_v" in name or (args.only and not any(o in name for o in args.only.split(","))):
            continue
        c = spec["constexprs"]
        label = f"{path}:{name}"
        if "quantize" in name:
            label += "[" + ",".join(f"{k}={c[k]}" for k in ("SUBTRACT", "ROW_DOTS", "MEAN_MODE", "FINALIZE",
                                                                 "BLOCK_ROWS", "BLOCK", "ROTATE_TILES", "SAMPLE")
                                    if k in c) + "]"
        sass, res = sass_of(spec, target)
        if args.sass:
            Path(args.sass).mkdir(parents=True, exist_ok=True)
            (Path(args.sass) / (re.sub(r"[^\w=]+", "_", label) + ".sass")).write_text(sass)
        ops = ops_of(sass)
        lps = loops(sass)
        inner = [{"instructions": lp["instructions"], **counts(
            [o for o in ops_of_loop(sass, lp["label"])])} for lp in lps[:2]]
        row = {"kernel": label, "grid": grid, "options": spec.get("options"), **res, "instructions": len(ops),
               **counts(ops), "loops": inner}
        rows.append(row)
        print(f"{label:90} grid {grid} warps {spec['options']['num_warps']}\n"
              f"    regs {res.get('registers', '?'):>3} spills {res.get('spills', '?'):>3} "
              f"smem {res.get('shared_bytes', 0):>6} instr {len(ops):5} "
              + " ".join(f"{k} {row[k]}" for k in CLASSES), flush=True)
        for lp in inner:
            print("    loop " + " ".join(f"{k} {v}" for k, v in lp.items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": environment(), "target": "sm90", "shape": args.shape,
                                              "tuning": dict(sparse_launch.TUNING), "kernels": rows}, indent=1)
                                  + "\n")


def ops_of_loop(sass: str, label: str) -> list:
    lines = sass.splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(r"^\s*" + re.escape(label) + ":", ln))
    end = max(i for i, ln in enumerate(lines) if i > start and re.search(r"BRA\s+`?\(?" + re.escape(label) + r"\b", ln))
    return ops_of("\n".join(lines[start:end + 1]))


if __name__ == "__main__":
    main()
