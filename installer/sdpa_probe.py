"""Is torch's default SDPA safe on this GPU? Asked in a child process, because on RDNA4 the answer
can be a GPU-side assertion that kills the process (stock ROCm builds lack Composable Kernel's
flash attention for gfx12, and the dispatch can end in an assert).

The result goes into the report as ``sdpa_default_safe``; the runtime falls back to the
MATH backend when it is False or unknown on RDNA4.
"""
from __future__ import annotations

from typing import Optional

from .childproc import RESULT_MARK, run_python_child

# Runs in the child: default SDPA on shapes diffusion models use, checked against the MATH backend in
# fp32, so a silently wrong result counts as unsafe too (not only a crash).
PROBE_CODE = r"""
import json, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = torch.device(sys.argv[1])
cases = []
for dtype in (torch.float16, torch.bfloat16):
    for (b, h, lq, lk, d, masked) in ((1, 8, 1024, 1024, 64, False), (1, 8, 1024, 1024, 128, False),
                                      (2, 4, 333, 77, 128, False), (1, 4, 256, 256, 128, True)):
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=g).to(dev, dtype) for n in (lq, lk, lk))
        mask = torch.randn(b, 1, lq, lk, generator=g).to(dev, dtype) if masked else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                 attn_mask=None if mask is None else mask.float())
        err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        cases.append({"dtype": str(dtype).replace("torch.", ""), "shape": [b, h, lq, lk, d], "mask": masked,
                      "finite": bool(torch.isfinite(out).all()), "max_rel_err": err})
print("MARK" + json.dumps({"cases": cases}))
""".replace("MARK", RESULT_MARK)

MAX_REL_ERR = 0.05  # 16-bit attention vs fp32 math: a correct backend is ~1e-3


def probe_sdpa_default(device: str = "cuda", timeout: float = 180.0, code: Optional[str] = None) -> dict:
    """``{"safe": bool, "reason": str, "cases": [...]}``. ``code`` replaces the probe (tests)."""
    res = run_python_child(code or PROBE_CODE, timeout=timeout, args=(device,))
    if not res.ok:
        return {"safe": False, "reason": "torch's default SDPA crashed: " + res.describe(), "cases": []}
    cases = res.payload.get("cases", [])
    bad = [c for c in cases if not c.get("finite") or c.get("max_rel_err", 1.0) > MAX_REL_ERR]
    if bad:
        c = bad[0]
        return {"safe": False, "cases": cases,
                "reason": f"torch's default SDPA gave wrong results ({c['dtype']}, shape {c['shape']}, "
                          f"max relative error {c.get('max_rel_err')})"}
    return {"safe": True, "reason": f"{len(cases)} shapes ran and matched the MATH backend", "cases": cases}


def needs_probe(arch) -> bool:
    """Only RDNA4 is known to crash; elsewhere the default SDPA is left alone."""
    return arch.vendor == "amd" and arch.family == "rdna4"
