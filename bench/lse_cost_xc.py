"""What asking for the LSE changes in the sm90 code (issue 52): the Q quantization launch (MEAN_DOT against
MEAN_NONE) and the Gluon kernels (LSE twins against the plain ones), cross-compiled without a GPU from the
launches a call records, compared in their SASS: registers, spills, and per loop (a backward branch) its
instructions, shared-memory and global accesses, barriers and shuffles. Runs on a CPU-only machine.

    python bench/lse_cost_xc.py [--length 8192] [--out bench/results/sm90_lse_cost_xc.json] [--sass DIR]
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import tempfile
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
from common import environment, import_pack  # noqa: E402

import_pack()
import torch  # noqa: E402
import triton  # noqa: E402
from sagetriton.installer import crosscompile as cc  # noqa: E402
from sagetriton.kernels import api, hopper_gluon, replay, rotation, tail_split  # noqa: E402
from sagetriton.kernels.arch import default_config  # noqa: E402

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# SASS opcode classes counted per loop.
CLASSES = {"shared": r"^(LDS|STS|LDSM|STSM)\b", "global": r"^(LDG|STG|LDGSTS|UTMALDG|UTMASTG)\b",
           "local": r"^(LDL|STL)\b", "barrier": r"^(BAR|SYNCS)\b", "shuffle": r"^SHFL\b",
           "mma": r"^(HGMMA|IGMMA|QGMMA)\b", "wait": r"^WARPGROUP\b"}


def record(length: int, return_lse: bool, heads: int = 24) -> list:
    """The launches of HND bf16 calls (head_dim 128) on meta tensors (132 SMs, an H200's): ``heads`` heads
    (the quantization launches as bench/lse_breakdown.py's calls run them: 8 tiles per program at 8K x 24),
    then the heads that make the Gluon path launch both its whole and its split kernel."""
    cfg = default_config(cc.parse_target("sm90").arch_info(), 128)
    split = tail_split.heads_with_split_tail(*hopper_gluon.grid(length, length), api.sm_count(torch.device("meta")))
    specs: list = []
    for h in (heads, split):
        replay.clear()
        q = torch.empty((1, h, length, 128), dtype=torch.bfloat16, device="meta")
        with cc.record_launches() as recorded:
            api.attention_forward(q, q, q, "HND", False, None, None, return_lse, cfg, True, False)
        specs += recorded
    return specs


def sass_of(spec: dict, target) -> tuple[str, dict]:
    gluon = getattr(spec["fn"], "is_gluon", lambda: False)()
    options = dict(spec.get("options") or {})
    if spec["constexprs"].get("ROTATE_TILES"):  # as host_quant launches the tiled rotation on a CUDA device
        options.setdefault("maxnreg", rotation.TILED_MAXNREG)
    with cc.sm90_ptxas_scope() if gluon else nullcontext():
        compiled = triton.compile(cc.launch_source(spec, target), target=target.gpu_target(), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(TOOLS / "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    res = cc._resources(compiled, target)
    res["shared_bytes"] = compiled.metadata.shared
    return sass, res


def instructions(sass: str) -> list:
    """(label or None, opcode text) per line of nvdisasm's output, in order."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"^\s*(\.L_x_\d+):", line)
        if m:
            out.append((m.group(1), None))
            continue
        m = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if m:
            out.append((None, re.sub(r"^@!?U?P\w+\s+", "", m.group(1))))
    return out


def classes(ops: list) -> dict:
    counts = Counter(c for o in ops for c, pat in CLASSES.items() if re.match(pat, o))
    return {c: counts.get(c, 0) for c in CLASSES}


def loop_spans(sass: str) -> tuple:
    """``instructions(sass)``, its label positions, and (label's index, branch's index, label) of each loop: a
    backward branch to an earlier label, with more than the branch in its body (not the trailing self-branch)."""
    ins = instructions(sass)
    where = {lab: i for i, (lab, _) in enumerate(ins) if lab}
    spans = []
    for i, (_, op) in enumerate(ins):
        m = op and re.match(r"^BRA\s+(?:`\()?(\.L_x_\d+)", op)
        if m and where.get(m.group(1), i) < i and sum(1 for _, o in ins[where[m.group(1)]:i + 1] if o) > 1:
            spans.append((where[m.group(1)], i, m.group(1)))
    return ins, where, spans


def loops(sass: str) -> list:
    """Each loop (a backward branch to a label): its instruction count and opcode classes, outermost
    (longest) first."""
    ins, _, spans = loop_spans(sass)
    found = []
    for a, b, label in spans:
        body = [o for _, o in ins[a:b + 1] if o]
        found.append({"label": label, "instructions": len(body), **classes(body)})
    return sorted(found, key=lambda r: -r["instructions"])


# Register moves ptxas encodes either way: one opcode for the order comparison.
_MOVES = re.compile(r"^(MOV|IMAD\.MOV\.U32|IMAD\.U32)$")


def loop_ops(sass: str, label: str) -> list:
    """Opcodes (register moves as one) of the loop that starts at ``label``, in program order."""
    ins = instructions(sass)
    start = next(i for i, (lab, _) in enumerate(ins) if lab == label)
    end = max(i for i, (_, op) in enumerate(ins)
              if op and i > start and re.match(r"^BRA\s+`?\(?" + re.escape(label) + r"\b", op))
    return ["MOV" if _MOVES.match(op.split()[0]) else op.split()[0] for _, op in ins[start:end + 1] if op]


def out_of_order(ops: list, plain: list) -> int:
    """Opcodes of ``ops`` outside its longest common subsequence with ``plain`` (0: the same loop, in order)."""
    blocks = difflib.SequenceMatcher(None, ops, plain, autojunk=False).get_matching_blocks()
    return len(ops) - sum(b.size for b in blocks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--out")
    ap.add_argument("--sass", help="a folder to write each kernel's SASS to")
    args = ap.parse_args()
    target = cc.parse_target("sm90")
    wanted = ("quantize_int8_kernel", "shared_kv_attention_kernel", "shared_kv_split_kernel",
              "shared_kv_attention_lse_kernel", "shared_kv_split_lse_kernel")
    rows = []
    for lse in (False, True):
        for spec in record(args.length, lse):
            if spec["name"] not in wanted:
                continue
            c = spec["constexprs"]
            label = spec["name"]
            if label == "quantize_int8_kernel":
                label += f"[{'Q' if c.get('FINALIZE') else 'K'} mean_mode={c['MEAN_MODE']}]"
            if any(r["kernel"] == label for r in rows):
                continue
            sass, res = sass_of(spec, target)
            if args.sass:
                Path(args.sass).mkdir(parents=True, exist_ok=True)
                name = re.sub(r"[^\w=]+", "_", label)
                (Path(args.sass) / f"{name}.sass").write_text(sass)
            ops = [o for _, o in instructions(sass) if o]
            # The key (or tile) loops: the innermost loops that hold an MMA, one per warpgroup partition.
            mma_loops = sorted((lp for lp in loops(sass) if lp["mma"]), key=lambda lp: lp["instructions"])
            row = {"kernel": label, "lse_call": lse, **res, "instructions": len(ops), **classes(ops),
                   "loops": mma_loops[:3 if label.startswith("shared_kv") else 1]}
            row["loop_ops"] = [loop_ops(sass, lp["label"]) for lp in row["loops"]]
            plain = next((r for r in rows if r["kernel"] == label.replace("_lse_kernel", "_kernel")), None)
            if plain is not None and plain is not row:  # an LSE twin: its loops' order against the plain kernel's
                row["loop_order_vs_plain"] = [out_of_order(x, y) for x, y in
                                              zip(row["loop_ops"], plain["loop_ops"], strict=False)]
            rows.append(row)
            print(f"{label:48} regs {res.get('registers', '?'):>3} spills {res.get('spills', '?'):>3} "
                  f"instr {row['instructions']:5} " + " ".join(f"{k} {row[k]}" for k in CLASSES), flush=True)
            for lp in row["loops"]:
                print("    loop " + " ".join(f"{k} {v}" for k, v in lp.items() if k != "label"), flush=True)
            if "loop_order_vs_plain" in row:
                print(f"    opcodes out of the plain kernel's order, per loop: {row['loop_order_vs_plain']}",
                      flush=True)
    if args.out:
        for row in rows:
            del row["loop_ops"]
        Path(args.out).write_text(json.dumps({"environment": environment(), "target": "sm90", "length": args.length,
                                              "kernels": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
