"""Sage Settings' ``backend`` choice on this machine: each installed backend runs one long call through
the Patch node's override, timed and compared with exact attention.

    COMFYUI_PATH=... python bench/backend_check.py [--out ...]   (--tiny: CPU smoke test)
"""
from __future__ import annotations

import sys
import time

import bench_models as bm  # noqa: F401  (sets ComfyUI up, CPU mode with --tiny)
import comfy.model_patcher  # noqa: E402
import torch
from common import RESULTS, cosine, environment, write_json
from sagetriton.nodes.backends.alt_backends import BACKENDS, unavailable_reason  # noqa: E402
from sagetriton.nodes.config.settings import SageSettings  # noqa: E402
from sagetriton.nodes.patching import patch_model, patch_state_of  # noqa: E402
from sagetriton.nodes.reporting.run_summary import finish_run  # noqa: E402


def main(argv=None):
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = "cpu" if args.tiny else "cuda"
    b, h, n, d = (1, 2, 128, 64) if args.tiny else (1, 24, 16384, 128)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn((b, h, n, d), generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
    exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    base = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device(device), torch.device(device))
    rows = []
    for backend in BACKENDS:
        why = unavailable_reason(backend)
        if why is not None:
            rows.append(dict(backend=backend, available=False, why=why))
            print(rows[-1], flush=True)
            continue
        patched = patch_model(base, SageSettings(backend=backend, min_seq_len=0))
        override = patched.model_options["transformer_options"]["optimized_attention_override"]
        state = patch_state_of(patched)
        state.begin_run()

        def call():
            return override(None, q, k, v, h, skip_reshape=True, skip_output_reshape=True,  # noqa: B023
                            transformer_options={}, _inside_attn_wrapper=True)

        for _ in range(3):
            out = call()
        times = []
        for _ in range(1 if args.tiny else 10):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = call()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        summary = finish_run(state)
        rows.append(dict(backend=backend, available=True, shape=[b, h, n, d], ms=1e3 * sorted(times)[len(times) // 2],
                         cosine=cosine(out.float(), exact), summary=summary["text"]))
        print(rows[-1], flush=True)
    default = RESULTS.parent / "out" / "backend_check_tiny.json" if args.tiny else RESULTS / "backend_check.json"
    write_json(Path(args.out) if args.out else default, {"env": environment(), "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
