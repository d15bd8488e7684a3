"""Where ``sparse_attn``'s INT8 and FP8 P·V errors come from, on the CPU: the sparse kernel's arithmetic simulated
in fp64 on sampled query blocks of bench/sparse_inputs.py's families, one rounding at a time, against the fp64
method (``kernels.sparse_reference``: the same routing and pooled tail, no rounding).

    python bench/sparse_int8_sim.py [--tokens 16384] [--heads 4] [--families video,local_sinks] [--tau 1.3]
                                    [--stride 8]

Simulated as the kernel does it (Hopper's INT8 P·V config): Q rotated by the 128-wide Hadamard block and rounded
with one scale per 16 rows, K centred by its mean, rotated and rounded with one scale per 64-key block or per
token; P rounded to 0..255 against the row max of each step (two listed key blocks per step, the pairs, or one)
and at most 20 (base 2) below the running max; V rounded per channel (its max |v| / 127), or minus its channel
mean first. FP8 P·V as that path does it: P = 2^(x - running max) · 448 in e4m3 (the row sums of the unrounded
P), V in e4m3 per channel (max |v| / 448), optionally with its rounding residual in e4m3 too (``fp8+residual``),
and a P in two e4m3 parts (hi + the rounding of P - hi), which no kernel has yet. The pooled tail stays fp64 here
(the router's TF32 on the GPU). Prints, per variant, the relative L2 of its output against the method's, i.e. the
quantization error alone (bench/NOTES.md, "Sparse INT8 error" and "Sparse FP8 P·V error").
"""
from __future__ import annotations

import argparse
import math

import sparse_inputs as si
import torch
from common import import_pack

import_pack()
from sagetriton.kernels.rotation import hadamard_block  # noqa: E402
from sagetriton.kernels.sparse_reference import LOG2E, route_reference  # noqa: E402

VARIANTS = {
    "Q·Kᵀ only, K per block (old)": dict(qk="block"),
    "Q·Kᵀ only, K per token": dict(qk="token"),
    "Q only": dict(qk="q"),
    "P only, pairs": dict(p=2),
    "P only, one block per step": dict(p=1),
    "V only": dict(v="int8"),
    "V only, minus its mean": dict(v="mean"),
    "all, K per block (old)": dict(qk="block", p=2, v="int8"),
    "all, K per token (new)": dict(qk="token", p=2, v="int8"),
    "fp8: P only": dict(p=2, pf="fp8"),
    "fp8: V only": dict(v="fp8"),
    "fp8: all, K per block (fp8 now)": dict(qk="block", p=2, pf="fp8", v="fp8"),
    "fp8: all, K per token": dict(qk="token", p=2, pf="fp8", v="fp8"),
    "fp8: K per token, V + residual": dict(qk="token", p=2, pf="fp8", v="fp8res"),
    "fp8: K per token, V + residual, P in 2 parts": dict(qk="token", p=2, pf="fp8x2", v="fp8res"),
}


def rounded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x (L, D) rounded to int8 with one scale (max |x| / 127) per ``rows`` consecutive rows, dequantized."""
    g = x.reshape(-1, rows, x.shape[-1])
    s = (g.abs().amax(dim=(1, 2), keepdim=True) / 127.0).clamp_min(1e-30)
    return (torch.round(g / s).clamp(-127, 127) * s).reshape(x.shape)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.float().to(torch.float8_e4m3fn).double()


def head_operands(qh, kh, vh):
    rot = hadamard_block(128, 128)
    v8s = (vh.abs().amax(0) / 448).clamp_min(1e-30)
    v8 = e4m3(vh / v8s) * v8s
    kc = kh - kh.mean(0)
    vmax = vh.abs().amax(0) / 127
    vmean = vh.mean(0)
    vmax_c = (vh - vmean).abs().amax(0).clamp_min(1e-30) / 127
    return {"kc": kc, "q_rot": qh @ rot, "k_rot": kc @ rot,
            "q": {"block": rounded(qh @ rot, 16), "token": rounded(qh @ rot, 16), "q": rounded(qh @ rot, 16)},
            "k": {"block": rounded(kc @ rot, 64), "token": rounded(kc @ rot, 1)},
            "v": {"none": vh, "int8": torch.round(vh / vmax) * vmax,
                  "mean": torch.round((vh - vmean) / vmax_c) * vmax_c + vmean,
                  "fp8": v8, "fp8res": v8 + e4m3((vh - v8) / v8s) * v8s}}


def block_rows(ops, qh, i, exact_i, scores_i, vsum, log2s, cfg) -> torch.Tensor:
    """Output rows of query block i under ``cfg`` (fp64 elsewhere)."""
    rows = slice(i * 64, (i + 1) * 64)
    qk = cfg.get("qk")
    if qk in ("block", "token"):
        x = ops["q"][qk][rows] @ ops["k"][qk].T * log2s
    elif qk == "q":
        x = ops["q"]["q"][rows] @ ops["k_rot"].T * log2s
    else:
        x = qh[rows] @ ops["kc"].T * log2s
    vv = ops["v"][cfg.get("v", "none")]
    blocks = torch.nonzero(exact_i).flatten().tolist()
    tail = scores_i.masked_fill(exact_i, float("-inf"))
    n = exact_i.shape[0]
    top = torch.maximum(x.reshape(64, n, 64)[:, exact_i].amax(dim=(1, 2)), tail.max().expand(64))
    w_tail = torch.exp2(tail - top[:, None])
    acc, den = w_tail @ vsum, (w_tail * 64.0).sum(1)
    xr = x - top[:, None]
    step = cfg.get("p", 0)
    running = (tail.max() - top).clone()
    for t in range(0, len(blocks), step or len(blocks)):
        cols = torch.cat([torch.arange(b * 64, b * 64 + 64) for b in blocks[t:t + (step or len(blocks))]])
        xt = xr[:, cols]
        p_sum = None
        if step and cfg.get("pf", "int8") != "int8":  # fp8 P against the running max, its sums unrounded
            running = torch.maximum(running, xt.amax(1))
            pe = torch.exp2(xt - running[:, None]) * 448
            p8 = e4m3(pe)
            if cfg["pf"] == "fp8x2":
                p8 = p8 + e4m3(pe - p8)
            p, p_sum = p8 * (torch.exp2(running) / 448)[:, None], torch.exp2(xt).sum(1)
        elif step:
            t_max = xt.amax(1)
            shift = torch.maximum(t_max, running - 20)
            p = torch.round(255 * torch.exp2(xt - shift[:, None])).clamp(0, 255) * (torch.exp2(shift) / 255)[:, None]
            running = torch.maximum(running, t_max)
        else:
            p = torch.exp2(xt)
        acc, den = acc + p @ vv[cols], den + (p.sum(1) if p_sum is None else p_sum)
    return acc / den[:, None]


def simulate(family: str, T: int, H: int, tau: float, stride: int) -> dict:
    q, k, v = si.FAMILIES[family](T, H, device="cpu")
    r = route_reference(q, k, tau)
    n = r["exact"].shape[-1]
    log2s = LOG2E / math.sqrt(q.shape[-1])
    sums = {name: 0.0 for name in VARIANTS}
    norm = 0.0
    for h in range(H):
        qh, kh, vh = (x[0, :, h].double() for x in (q, k, v))
        ops = head_operands(qh, kh, vh)
        vsum = torch.nn.functional.pad(vh, (0, 0, 0, n * 64 - T)).reshape(n, 64, -1).sum(1)
        for i in range(0, n - (T % 64 != 0), stride):  # full query blocks only
            ex, sc = r["exact"][0, h, i], r["scores"][0, h, i]
            base = block_rows(ops, qh, i, ex, sc, vsum, log2s, {})
            norm += float(base.pow(2).sum())
            for name, cfg in VARIANTS.items():
                sums[name] += float((block_rows(ops, qh, i, ex, sc, vsum, log2s, cfg) - base).pow(2).sum())
    return {"density": float(r["exact"].double().mean()), **{k: math.sqrt(s / norm) for k, s in sums.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--families", default="video,local_sinks")
    ap.add_argument("--tau", type=float, default=1.3)
    ap.add_argument("--stride", type=int, default=8, help="every n-th query block")
    a = ap.parse_args()
    torch.set_num_threads(2)
    for fam in a.families.split(","):
        res = simulate(fam, a.tokens, a.heads, a.tau, a.stride)
        print(f"{fam} {a.tokens} x {a.heads}, tau {a.tau}: density {res.pop('density'):.4f}")
        for name, err in res.items():
            print(f"  {name:32s} {err:.5f}")


if __name__ == "__main__":
    main()
