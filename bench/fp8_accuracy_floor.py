"""How close to exact attention FP8 P·V can be at all, independent of any kernel (CPU, fp64).

    python bench/fp8_accuracy_floor.py

Exact softmax in fp64, then only the two FP8 roundings the method makes: P scaled so each row's
largest weight is 448 (as the kernel's exp2 does) and V scaled per channel, both rounded to e4m3.
No INT8 Q·Kᵀ error, no accumulation error. On random-normal inputs (the benchmark's) this alone
gives cosine ≈ 0.9993 vs exact: the e4m3 mantissa (3 bits) costs ~2.6% rms per weight and per
value, so cos ≈ 1 - (εp² + εv²) / 2. A kernel with FP8 P·V cannot reach 0.9995 on these inputs;
FP16 P·V can (0.9999 measured).
"""
from __future__ import annotations

import torch
from common import RESULTS, cosine, environment, write_json
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


def main():
    rows = [floor_for(L, D) for L in (1024, 4096) for D in (64, 128)]
    for r in rows:
        print(r)
    write_json(RESULTS / "fp8_accuracy_floor.json", {"env": environment(), "inputs": "randn, fp64 softmax",
                                                      "rows": rows})


if __name__ == "__main__":
    main()
