"""Shared by the GPU benchmarks: import the pack by path, environment facts, accuracy metrics."""
from __future__ import annotations

import datetime
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


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")


__all__ = ["import_pack", "find_comfyui", "environment", "cosine", "rel_l1", "write_json", "RESULTS"]
