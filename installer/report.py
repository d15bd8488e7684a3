"""The install/self-test report: written by install.py (or the first start), read by the runtime.

One JSON file per (pack, kernel sources, torch, triton, GPU) key, so any upgrade or a different
GPU makes the old report invisible and the build + self-test is redone. The files live in the
pack folder (``.sagetriton/``) when it is writable, else in the user's cache folder;
``SAGETRITON_REPORT_DIR`` overrides both (tests, read-only installs).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from ..kernels.arch import ArchInfo, residual_crossover_factor
from ..kernels.log import logger

SCHEMA = 1
# The crossover is measured for calls of this many batch x heads (cond + uncond, Flux / SD3-like heads):
# the dispatcher sends calls with less work per call to the fallback, whatever their length.
CROSSOVER_BATCH = 2
CROSSOVER_HEADS = 24
ENV_DIR = "SAGETRITON_REPORT_DIR"
PACK_DIR = Path(__file__).resolve().parent.parent
_KERNELS_DIR = PACK_DIR / "kernels"


def pack_version() -> str:
    try:
        text = (PACK_DIR / "pyproject.toml").read_text(encoding="utf-8")
        m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def kernels_digest() -> str:
    """Hash of the kernel library's sources (``kernels/`` only): an edited kernel invalidates reports even
    without a version bump, an edited installer message does not."""
    h = hashlib.sha1()
    for p in sorted(_KERNELS_DIR.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _versions() -> tuple:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - no triton: still a valid key (the report says why nothing built)
        triton_version = None
    return torch.__version__, triton_version


def report_key(arch: ArchInfo, torch_version: Optional[str] = None, triton_version: Optional[str] = None) -> dict:
    if torch_version is None or triton_version is None:
        tv, trv = _versions()
        torch_version = torch_version or tv
        triton_version = triton_version or trv
    return {"pack": pack_version(), "kernels": kernels_digest(), "torch": torch_version, "triton": triton_version,
            "vendor": arch.vendor, "arch": arch.arch, "gpu": arch.name}


def key_id(key: dict) -> str:
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".probe-"):
            pass
        return True
    except OSError:
        return False


def _user_cache_dir() -> Path:
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~\\AppData\\Local")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "sagetriton"


def report_dir() -> Path:
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    local = PACK_DIR / ".sagetriton"
    return local if _writable(local) else _user_cache_dir()


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", s)


def report_path(key: dict) -> Path:
    return report_dir() / f"report-{_safe(key['arch'])}-{key_id(key)}.json"


def new_report(key: dict) -> dict:
    return {"schema": SCHEMA, "key": key, "key_id": key_id(key), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "variants": {}, "disabled_variants": [], "crossover": None, "sdpa_default_safe": None}


def save_report(report: dict) -> Path:
    """Write atomically (a crash mid-write never leaves a half report) and drop stale reports of this GPU."""
    path = report_path(report["key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".report-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    for old in path.parent.glob(f"report-{_safe(report['key']['arch'])}-*.json"):
        if old != path:
            try:
                old.unlink()
            except OSError:
                pass
    invalidate_cache()
    return path


def load_report(key: dict) -> Optional[dict]:
    """The report for exactly this key; None when missing, unreadable, or from another schema/key."""
    path = report_path(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("[SageTriton] ignoring unreadable report %s (%s); it will be redone", path, e)
        return None
    if data.get("schema") != SCHEMA or data.get("key") != key:
        return None
    return data


# ---------------------------------------------------------------------------------------------
# Runtime read API: cheap after the first call (cached per process; save_report refreshes it).

_cache_lock = threading.Lock()
_cached: dict = {}


def invalidate_cache() -> None:
    with _cache_lock:
        _cached.clear()


def current_report(arch: Optional[ArchInfo] = None) -> Optional[dict]:
    """The report for the running GPU (``detect_arch()`` when not given), or None."""
    if arch is None:
        from ..kernels.arch import detect_arch

        arch = detect_arch()
    with _cache_lock:
        if arch.arch in _cached:
            return _cached[arch.arch]
    report = load_report(report_key(arch))
    with _cache_lock:
        _cached[arch.arch] = report
    return report


def variant_name(qk_quant_gran: str, pv_precision: str, pv_accum_dtype: str) -> str:
    return f"{qk_quant_gran}/{pv_precision}/{pv_accum_dtype}"


def measured_crossover(arch: Optional[ArchInfo] = None, head_dim: int = 128) -> Optional[int]:
    """Key length from which the kernel beats SDPA on this GPU at this head size (the nearest measured
    one); None when not measured (use the table default)."""
    r = current_report(arch)
    return crossover_seq_len((r or {}).get("crossover") or {}, head_dim)


def crossover_seq_len(cross: dict, head_dim: int = 128) -> Optional[int]:
    """The dispatcher's key length for ``head_dim`` from a ``selftest.measure_crossovers`` result."""
    by_dim = {int(d): c for d, c in (cross.get("by_head_dim") or {}).items()}
    if cross.get("head_dim") is not None:
        by_dim.setdefault(int(cross["head_dim"]), cross)
    if by_dim:
        cross = by_dim[min(by_dim, key=lambda d: (abs(d - head_dim), -d))]
    if cross.get("kernel_never_faster"):
        # Slower at every measured length: SDPA up to twice the longest one (the kernel may still win beyond).
        longest = max((t["seq_len"] for t in cross.get("timings", []) if "seq_len" in t), default=None)
        return None if longest is None else 2 * longest
    return cross.get("seq_len")


def disabled_variants(arch: Optional[ArchInfo] = None) -> frozenset:
    """Variant names (``variant_name``) that failed to build or self-test here: the runtime must not pick them."""
    r = current_report(arch)
    return frozenset((r or {}).get("disabled_variants", ()))


def sdpa_default_safe(arch: Optional[ArchInfo] = None) -> Optional[bool]:
    """RDNA4: whether torch's default SDPA survived the child-process probe. None: not probed (other GPUs)."""
    r = current_report(arch)
    return (r or {}).get("sdpa_default_safe")


def long_sequence_kernel_failed(arch: Optional[ArchInfo] = None) -> bool:
    """Whether the long-sequence kernel (``KernelConfig.shared_kv_min_len``) failed its self-test here.
    Running out of memory during the test says nothing about the kernel."""
    r = (current_report(arch) or {}).get("long_sequence_kernel") or {}
    return r.get("ok") is False and not r.get("oom")


def is_variant_disabled(cfg, arch: Optional[ArchInfo] = None) -> bool:
    """Whether the variant a ``KernelConfig`` selects failed here (for the dispatcher)."""
    return variant_name(cfg.qk_quant_gran, cfg.pv_choice(), cfg.pv_accum_dtype) in disabled_variants(arch)


def crossover_for(arch: ArchInfo, cfg=None, head_dim: int = 128) -> Optional[int]:
    """Dispatcher hook ``(ArchInfo, KernelConfig, head_dim) -> measured crossover or None``.

    Measured for the default variant per head size; used for every variant of that size (the
    quantization overhead that sets it is the same), scaled for fp8+residual, whose second P·V
    MMA needs longer sequences (``arch.residual_crossover_factor``).
    """
    measured = measured_crossover(arch, head_dim)
    if measured is not None and getattr(cfg, "v_residual", False):
        return measured * residual_crossover_factor(head_dim)
    return measured
