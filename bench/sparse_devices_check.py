"""On a GPU: ``sparse_attn`` with wrapper subclasses (AsyncCollectiveTensor K and V, as diffusers' context
parallelism hands them over) returns the plain tensors' result bit for bit, through the custom op.

    python bench/sparse_devices_check.py
"""
from __future__ import annotations

import sys

import common  # noqa: F401  the pack's import path
import torch
from sagetriton.kernels import sparse_attn
from torch.distributed._functional_collectives import AsyncCollectiveTensor


def main() -> int:
    torch.manual_seed(0)
    fails = 0
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{__import__('triton').__version__}")
    for L, layout in ((4096, "NHD"), (1000, "HND")):
        shape = (1, L, 4, 128) if layout == "NHD" else (1, 4, L, 128)
        q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        with torch.no_grad():
            plain = sparse_attn(q, k, v, 1.0, tensor_layout=layout, return_lse=True)
            wrapped = sparse_attn(q, AsyncCollectiveTensor(k.clone()), AsyncCollectiveTensor(v.clone()), 1.0,
                                  tensor_layout=layout, return_lse=True)
        same = all(type(w) is torch.Tensor and torch.equal(p, w) for p, w in zip(plain, wrapped, strict=True))
        fails += not same
        print(f"{'ok ' if same else 'BAD'} AsyncCollectiveTensor K, V  L {L} {layout}: bitwise equal {same}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
