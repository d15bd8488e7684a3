"""The sm90 SASS of Hopper's Gluon kernel per K-scale layout (issue 52 item 6), cross-compiled without a GPU:
per_warp (one K scale per 128-key tile), per_thread with a scale per key (``K_COLS``) and per_thread with
SageAttention's sm90 groups (one scale per tile and MMA column group, ``K_GROUPS``; ``hopper_logits``). Per
kernel: registers, spill instructions inside and outside the key loops, and per key loop (the innermost loops
that hold an MMA, one per warpgroup) its instructions and the per-logit opcodes that differ between layouts.

    python bench/kcols_xc.py [--length 8192] [--pv fp8] [--out bench/results/sm90_kcols_xc.json] [--sass DIR]
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
from lse_cost_xc import instructions, loops, sass_of  # noqa: E402
from sagetriton.installer import crosscompile as cc  # noqa: E402
from sagetriton.kernels import api, hopper_gluon, hopper_host, replay, tail_split  # noqa: E402
from sagetriton.kernels.arch import resolve_config  # noqa: E402

# Opcodes counted per key loop (a 128-key tile: 64 logits per thread).
OPS = {"FMUL": r"^FMUL\b", "FFMA": r"^FFMA\b", "FMNMX": r"^FMNMX\b", "VIMNMX": r"^VIMNMX3?\b", "I2F": r"^I2FP?\b",
       "MUFU": r"^MUFU\b", "LDG": r"^LDG\b", "SHFL": r"^SHFL\b", "local": r"^(LDL|STL)\b"}


def record(gran: str, length: int, return_lse: bool, pv: str = "fp8") -> list:
    """The Gluon launches (whole and split kernels) of a bf16 HND call on meta tensors, 132 SMs (an H200's)."""
    cfg = resolve_config(cc.parse_target("sm90").arch_info(), 128, gran, pv_precision=pv)[0]
    heads = tail_split.heads_with_split_tail(*hopper_gluon.grid(length, length), api.sm_count(torch.device("meta")))
    replay.clear()
    q = torch.empty((1, heads, length, 128), dtype=torch.bfloat16, device="meta")
    with cc.record_launches() as recorded:
        api.attention_forward(q, q, q, "HND", False, None, None, return_lse, cfg, True, False)
    return [s for s in recorded if s["name"].startswith("shared_kv")]


def analyse(sass: str) -> dict:
    """Spills in and out of the key loops, and each key loop's counts (warpgroups 0, 1, 2 by size)."""
    ops = [o for _, o in instructions(sass) if o]
    key_loops = sorted((lp for lp in loops(sass) if lp["mma"]), key=lambda lp: lp["instructions"])[:3]
    ins = instructions(sass)
    where = {lab: i for i, (lab, _) in enumerate(ins) if lab}
    per_loop = []
    for lp in key_loops:
        start = where[lp["label"]]
        end = max(i for i, (_, op) in enumerate(ins) if op and i > start
                  and re.match(r"^BRA\s+`?\(?" + re.escape(lp["label"]) + r"\b", op))
        body = [op for _, op in ins[start:end + 1] if op]
        counts = Counter(k for op in body for k, pat in OPS.items() if re.match(pat, op))
        per_loop.append({"instructions": len(body), **{k: counts.get(k, 0) for k in OPS}})
    local = sum(1 for o in ops if re.match(OPS["local"], o))
    in_loops = sum(lp["local"] for lp in per_loop)
    return {"instructions": len(ops), "local_total": local, "local_in_key_loops": in_loops, "loops": per_loop}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--grans", default="per_warp,per_thread")
    ap.add_argument("--pv", default="fp8")
    ap.add_argument("--out")
    ap.add_argument("--sass", help="a folder to write each kernel's SASS to")
    args = ap.parse_args()
    target = cc.parse_target("sm90")
    rows = []
    runs = [(g, ks) for g in args.grans.split(",") for ks in ((True, False) if g == "per_thread" else (True,))]
    for gran, groups in runs:
        hopper_host.TUNING["k_groups"] = groups  # per_thread: SageAttention's sm90 groups, then per key
        for lse in (False, True):
            for spec in record(gran, args.length, lse, args.pv):
                c = spec["constexprs"]
                label = f"{gran}/{args.pv} {spec['name']} K_COLS={c.get('K_COLS')}"
                sass, res = sass_of(spec, target)
                if args.sass:
                    Path(args.sass).mkdir(parents=True, exist_ok=True)
                    (Path(args.sass) / (re.sub(r"[^\w=]+", "_", label) + ".sass")).write_text(sass)
                row = {"kernel": label, "registers": res.get("registers"), "spills": res.get("spills", 0),
                       **analyse(sass)}
                rows.append(row)
                print(f"{label:72} regs {row['registers']} spills {row['spills']} local {row['local_total']} "
                      f"(in key loops {row['local_in_key_loops']})", flush=True)
                for lp in row["loops"]:
                    print("    loop " + " ".join(f"{k} {v}" for k, v in lp.items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": environment(), "target": "sm90", "length": args.length,
                                              "kernels": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
