"""How close to exact attention FP8 P·V can be at all, independent of any kernel (CPU, fp64).

    python bench/fp8_accuracy_floor.py

Exact softmax in fp64, then only the two FP8 roundings the method makes: P scaled so each row's
largest weight is 448 (as the kernel's exp2 does) and V scaled per channel, both rounded to e4m3.
No INT8 Q·Kᵀ error, no accumulation error. On random-normal inputs (the benchmark's) this alone
gives cosine ≈ 0.9993 vs exact: the e4m3 mantissa (3 bits) costs ~2.6% rms per weight and per
value, so cos ≈ 1 - (εp² + εv²) / 2. A kernel with FP8 P·V cannot reach 0.9995 on these inputs;
FP16 P·V can (0.9999 measured).

Then INT8 P·V, which runs at the FP8 rate on Hopper (u8 P × s8 V into exact s32 sums): P scaled so
the row max is 255, V per channel (or per channel and 128-key tile) to ±127, outputs normalized by
the rounded P's row sums as the kernels do. On three inputs: the benchmark's (random normal, a flat
softmax), a sharper softmax (logits × 4, closer to real attention maps) and V with heavy-tailed
token norms (log-normal), so that a format is not chosen for how well it fits one distribution.
"""
from __future__ import annotations

import torch
from common import RESULTS, cosine, environment, rel_l1, write_json
from sagetriton.kernels.arch import FP8_MAX

E4M3_MAX = FP8_MAX["e4m3fn"]


def fp8_round(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3 after dividing by ``scale`` (which maps the largest |x| to E4M3_MAX)."""
    return (x / scale).float().to(torch.float8_e4m3fn).double() * scale


def floor_for(L: int, D: int = 128, H: int = 4, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, L, D, dtype=torch.float64, generator=g) for _ in range(3))
    p = torch.softmax(q @ k.transpose(-1, -2) / D**0.5, dim=-1)
    exact = p @ v
    p8 = fp8_round(p, p.amax(-1, keepdim=True) / E4M3_MAX)
    v8 = fp8_round(v, v.abs().amax(-2, keepdim=True) / E4M3_MAX)
    return {"L": L, "D": D, "P rounded": cosine(p8 @ v, exact), "V rounded": cosine(p @ v8, exact),
            "P and V rounded": cosine(p8 @ v8, exact)}


def int8_round(x: torch.Tensor, scale: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return torch.clamp(torch.round(x / scale), lo, hi) * scale


def pv_formats(L: int = 4096, D: int = 128, H: int = 4, sharpness: float = 1.0, heavy_v: bool = False,
               tile: int = 128, seed: int = 0) -> dict:
    """Cosine and relative L1 against exact attention of FP8 and INT8 P·V (P·V roundings only)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, L, D, dtype=torch.float64, generator=g) for _ in range(3))
    if heavy_v:
        v = v * torch.exp(torch.randn(1, H, L, 1, dtype=torch.float64, generator=g))
    s = sharpness * (q @ k.transpose(-1, -2)) / D**0.5
    exact = torch.softmax(s, dim=-1) @ v
    e = torch.exp(s - s.amax(-1, keepdim=True))  # the row max is 1
    p8, pu8 = fp8_round(e, torch.tensor(1 / E4M3_MAX)), int8_round(e, torch.tensor(1 / 255), 0, 255)
    v8 = fp8_round(v, v.abs().amax(-2, keepdim=True) / E4M3_MAX)
    vs8 = int8_round(v, v.abs().amax(-2, keepdim=True) / 127, -127, 127)
    vt = v.view(1, H, L // tile, tile, D)
    vs8_tile = int8_round(vt, vt.abs().amax(-2, keepdim=True) / 127, -127, 127).view_as(v)
    out = {}
    for name, p_r, v_r in (("fp8 P, fp8 V", p8, v8), ("u8 P, s8 V per channel", pu8, vs8),
                           ("u8 P, s8 V per channel and tile", pu8, vs8_tile)):
        o = (p_r @ v_r) / p_r.sum(-1, keepdim=True)
        out[name] = {"cosine": cosine(o, exact), "rel_l1": rel_l1(o, exact)}
    return {"L": L, "D": D, "sharpness": sharpness, "heavy_tailed_v": heavy_v, "formats": out}


def main():
    rows = [floor_for(L, D) for L in (1024, 4096) for D in (64, 128)]
    for r in rows:
        print(r)
    formats = [pv_formats(sharpness=sh, heavy_v=hv) for sh in (1.0, 4.0) for hv in (False, True)]
    for r in formats:
        print(f"softmax x{r['sharpness']:.0f}, {'heavy-tailed' if r['heavy_tailed_v'] else 'normal'} V: " + ", ".join(
            f"{n} {m['cosine']:.5f} / {m['rel_l1']:.4f}" for n, m in r["formats"].items()))
    write_json(RESULTS / "fp8_accuracy_floor.json", {"env": environment(), "inputs": "randn, fp64 softmax",
                                                      "rows": rows, "pv_formats": formats})


if __name__ == "__main__":
    main()
