"""The Q/K rotation on every head (before issue 42) against only where it pays (the heads whose keys have
outlier channels or tokens, ``quant.rotate_head``), against no rotation and SDPA; one GPU, one run.

    python bench/rotation_ab.py [--rounds 3] [--out bench/results/<arch>_rotation_ab.json]

Speed: the full call (quantization included) on random bf16 inputs at 8K / 16K / 32K tokens, head_dim
128, the methods interleaved round by round (median of each round's do_bench, then the median over
rounds). Issue 42's targets with the defaults (detection): >= 1.47x SDPA at 2x24x8192x128, >= 1.55x at
16K. Accuracy: ``accuracy_cases`` at 1x4x8192x128 against fp32 math attention; targets: massive
channels and the outlier key token cosine >= 0.9995 with detection, randn unchanged.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing
from accuracy_cases import CASES, make_case
from common import RESULTS, cosine, environment, import_pack, rel_l1, write_json

import_pack()
from sagetriton.kernels import api, reference, replay, rotation  # noqa: E402
from sagetriton.kernels.arch import default_config, detect_arch  # noqa: E402

SHAPES = [(2, 24, 8192, 128), (1, 24, 16384, 128), (1, 12, 32768, 128)]


def method(cfg, detect: bool, sampled: bool = False):
    def run(q, k, v):
        rotation.DETECT, rotation.RANGE_SAMPLED = detect, sampled
        return api.attention_forward(q, k, v, "HND", False, None, None, False, cfg, True, False)[0]
    return run


def methods(arch, D):
    cfg = default_config(arch, D)
    return {"sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
            "no rotation": method(cfg.replace(qk_rotation=False), True),
            "rotation, every head (before)": method(cfg.replace(qk_rotation=True), False),
            "rotation where it pays (default)": method(cfg.replace(qk_rotation=True), True),
            "where it pays, K range sampled": method(cfg.replace(qk_rotation=True), True, True)}


def speed(rounds: int) -> list:
    rows = []
    arch = detect_arch(torch.device("cuda"))
    for shape in SHAPES:
        B, H, L, D = shape
        qkv = tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fns = methods(arch, D)
        times = {name: [] for name in fns}
        for r in range(rounds):
            names = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
            for name in names:
                replay.clear()
                times[name].append(triton.testing.do_bench(lambda f=fns[name], x=qkv: f(*x), warmup=50, rep=300,
                                                           return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        row = dict(shape="x".join(map(str, shape)), ms=ms, per_round=times,
                   x_sdpa={name: ms["sdpa"] / m for name, m in ms.items()},
                   tops={name: 4 * B * H * L * L * D / (m * 1e-3) / 1e12 for name, m in ms.items()},
                   rotated_heads=int(reference.rotated_heads(qkv[1].float()).sum()), heads=B * H)
        rows.append(row)
        print(row["shape"], {n: round(x, 3) for n, x in row["x_sdpa"].items()}, "rotated heads",
              row["rotated_heads"], "of", row["heads"], flush=True)
        del qkv
    rotation.DETECT, rotation.RANGE_SAMPLED = True, False
    return rows


def accuracy() -> list:
    rows = []
    arch = detect_arch(torch.device("cuda"))
    fns = {n: f for n, f in methods(arch, 128).items() if n != "sdpa"}
    for case in CASES:
        q, k, v = make_case(case, device="cuda")
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        row = dict(case=case, rotated_heads=int(reference.rotated_heads(k.float()).sum()), heads=k.shape[1])
        rotation.RANGE_SAMPLED = True
        row["rotated_heads_sampled"] = int(reference.rotated_heads(k.float()).sum())
        rotation.RANGE_SAMPLED = False
        for name, fn in fns.items():
            out = fn(q, k, v).float()
            row[name] = dict(cosine=cosine(out, exact), rel_l1=rel_l1(out, exact))
        rows.append(row)
        print(case, f"rotated {row['rotated_heads']}/{row['heads']}",
              {n: f"{row[n]['cosine']:.5f} / {row[n]['rel_l1']:.4f}" for n in fns}, flush=True)
    rotation.DETECT, rotation.RANGE_SAMPLED = True, False
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    payload = {"env": environment()}
    print(payload["env"], flush=True)
    payload["accuracy"] = accuracy()
    payload["speed"] = speed(args.rounds)
    arch = detect_arch(torch.device("cuda")).arch
    write_json(Path(args.out) if args.out else RESULTS / f"{arch}_rotation_ab.json", payload)


if __name__ == "__main__":
    main()
