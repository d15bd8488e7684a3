"""Issue 40 on a real GPU: a call that needs gradients goes to ComfyUI-style attention and backpropagates,
inference still runs the kernel, a malformed call turns no variant off, and a report planted as a FIFO or a
link to /dev/zero is refused without blocking.

    python bench/robust_check.py          (GPU)
    TRITON_INTERPRET=1 python bench/robust_check.py --tiny   (CPU smoke test)

Prints one JSON object; every "ok_*" must be true.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SAGETRITON_REPORT_DIR", tempfile.mkdtemp(prefix="sagetriton-robust-"))
from sagetriton_import import import_pack  # noqa: E402

import_pack(run_init=False)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from sagetriton.installer import report as rep  # noqa: E402
from sagetriton.kernels.arch import detect_arch  # noqa: E402
from sagetriton.nodes.config.settings import SageSettings  # noqa: E402
from sagetriton.nodes.routing import dispatch  # noqa: E402
from sagetriton.nodes.routing.dispatch import NEEDS_GRAD, PatchState  # noqa: E402


def comfy_attention(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                    **kwargs):
    """ComfyUI's backend contract for (B, L, H*D) inputs, on torch SDPA (differentiable)."""
    b, n, width = q.shape
    q, k, v = (t.view(b, -1, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1)


def main() -> int:
    tiny = "--tiny" in sys.argv
    device = "cpu" if tiny else "cuda"
    b, h, n, d = (1, 2, 128, 64) if tiny else (1, 24, 8192, 128)
    out = {"device": device, "gpu": detect_arch(torch.device(device)).name}
    state = PatchState(SageSettings(min_seq_len=0))
    state.begin_run()
    q, k, v = (torch.randn(b, n, h * d, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o = state.dispatch(comfy_attention, (q, k, v, h), {})
    o.float().square().mean().backward()
    out["ok_backward"] = q.grad is not None and bool(torch.isfinite(q.grad).all())
    out["ok_counted_as_training"] = state.run.fallback.get(NEEDS_GRAD) == 1 and state.run.kernel == 0
    with torch.inference_mode():
        qi, ki, vi = (t.detach() for t in (q, k, v))
        o = state.dispatch(comfy_attention, (qi, ki, vi, h), {})
        ref = comfy_attention(qi, ki, vi, h)
        out["cosine_vs_sdpa"] = float(F.cosine_similarity(o.float().flatten(), ref.float().flatten(), dim=0))
        out["ok_inference_on_kernel"] = state.run.kernel == 1 and out["cosine_vs_sdpa"] > 0.99
        bad = [torch.cat([t, t[..., :1]], -1) for t in (qi, ki, vi)]
        try:
            state.dispatch(comfy_attention, (*bad, h), {})
        except RuntimeError:
            pass  # what the unpatched attention raises for it
        out["ok_malformed_keeps_kernel_on"] = dispatch.disabled_variants() == {}
        state.dispatch(comfy_attention, (qi, ki, vi, h), {})
        out["ok_kernel_after_malformed"] = state.run.kernel == 2
    arch = detect_arch(torch.device(device))
    path = Path(os.environ["SAGETRITON_REPORT_DIR"]) / rep.report_path(rep.report_key(arch)).name
    for kind in ("fifo", "dev_zero"):
        if path.exists() or path.is_symlink():
            path.unlink()
        os.mkfifo(path) if kind == "fifo" else os.symlink("/dev/zero", path)
        rep.invalidate_cache()
        out[f"ok_{kind}_refused"] = rep.current_report(arch) is None and "regular" in (rep.current_report_problem(arch)
                                                                                       or "")
    path.unlink()
    print(json.dumps(out, indent=1))
    return 0 if all(v for k, v in out.items() if k.startswith("ok_")) else 1


if __name__ == "__main__":
    sys.exit(main())
