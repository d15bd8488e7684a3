"""Shared by the GPU benchmarks: import the pack by path, environment facts, accuracy metrics."""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # appended: ComfyUI's nodes.py must win over ours
from sagetriton_import import find_comfyui, import_pack  # noqa: E402

import_pack()
from sagetriton.kernels.reference import cosine, rel_l1  # noqa: E402  one definition, shared with the tests

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict:
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {"date": datetime.date.today().isoformat(), "gpu": gpu, "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version()}


def kitchen_attention():
    """(label, fn(q, k, v)) for ComfyUI's built-in INT8 attention (comfy-kitchen) when it is importable
    and runs on this GPU, else None (with the reason printed)."""
    try:
        import comfy_kitchen

        fn = comfy_kitchen.int8_attention
    except Exception as e:  # noqa: BLE001 - not installed, or no build for this GPU
        print(f"comfy-kitchen unavailable: {type(e).__name__}: {e}")
        return None
    try:
        version = importlib.metadata.version("comfy-kitchen")
    except importlib.metadata.PackageNotFoundError:  # unpacked on PYTHONPATH without its metadata
        version = getattr(comfy_kitchen, "__version__", "")
    return f"comfy-kitchen {version} int8_attention".replace("  ", " "), lambda q, k, v: fn(q, k, v)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")


def kernel_self_times(fn, calls: int = 1, warm: int = 1, total: bool = False) -> dict:
    """{profiler event: GPU milliseconds per call} of ``fn`` from the profiler's self device time (after ``warm``
    calls, over ``calls``), the longest first. ``total``: each event's total device time instead, so that an
    operator's entry also counts the kernels it launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    field = "device_time_total" if total else "self_device_time_total"
    times = {}
    for e in prof.key_averages():
        t = getattr(e, field, None)
        t = getattr(e, field.replace("device", "cuda"), 0) if t is None else t
        if t:
            times[e.key] = times.get(e.key, 0.0) + t / 1000.0 / calls
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


__all__ = ["import_pack", "find_comfyui", "environment", "cosine", "rel_l1", "write_json", "kitchen_attention",
           "kernel_self_times", "RESULTS"]
