"""The install/self-test report: written by install.py (or the first start), read by the runtime.

One JSON file per (pack, kernel sources, torch, triton, GPU) key, so any upgrade or a different
GPU makes the old report invisible and the build + self-test is redone. The files live in the
pack folder (``.sagetriton/``) when it is writable, else in the user's cache folder;
``SAGETRITON_REPORT_DIR`` overrides both (tests, read-only installs).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from ..kernels.arch import PV_PRECISIONS, ArchInfo, residual_crossover_factor
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
    """Where reports are written: the pack folder when writable, else the user's cache folder."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    local = PACK_DIR / ".sagetriton"
    return local if _writable(local) else _user_cache_dir()


def report_dirs() -> list:
    """Where reports are read from, in order: the pack folder is read even when read-only (install.py may have
    written it as another user), then the user's cache folder."""
    if os.environ.get(ENV_DIR):
        return [Path(os.environ[ENV_DIR])]
    return [PACK_DIR / ".sagetriton", _user_cache_dir()]


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", s)


def _report_name(key: dict) -> str:
    return f"report-{_safe(key['arch'])}-{key_id(key)}.json"


def report_path(key: dict) -> Path:
    return report_dir() / _report_name(key)


def report_location(key: dict) -> Optional[Path]:
    """Where the report for ``key`` is read from: the first folder of ``report_dirs`` that has it."""
    return next((d / _report_name(key) for d in report_dirs() if (d / _report_name(key)).is_file()), None)


SHARED_KEY = ("arch", "torch", "triton", "pack")  # installs differing in these keep their reports side by side


def new_report(key: dict) -> dict:
    return {"schema": SCHEMA, "key": key, "key_id": key_id(key), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "variants": {}, "disabled_variants": [], "crossover": None, "sdpa_default_safe": None}


def sanitize(obj):
    """``obj`` with non-finite floats as None: strict JSON (a browser's JSON.parse rejects NaN/Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj


def dumps(obj, **kw) -> str:
    return json.dumps(sanitize(obj), allow_nan=False, default=str, **kw)


def save_report(report: dict) -> Path:
    """Write atomically (a crash mid-write never leaves a half report) and drop stale reports of this GPU."""
    path = report_path(report["key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".report-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(dumps(report, indent=2, sort_keys=True))
    os.chmod(tmp, 0o644)  # mkstemp's 0600 hid the report from other accounts (a Docker image built as root)
    os.replace(tmp, path)
    # Drop only reports this one supersedes (same arch, torch, triton and pack: an edited kernel or another
    # GPU name); another torch or triton sharing this folder keeps its own.
    key = report["key"]
    for old in path.parent.glob(f"report-{_safe(key['arch'])}-*.json"):
        try:
            other = json.loads(old.read_text(encoding="utf-8")).get("key") or {}
            if old != path and all(other.get(f) == key.get(f) for f in SHARED_KEY):
                old.unlink()
        except (OSError, ValueError, AttributeError):
            pass  # unreadable or not a report object: not ours to judge here
    invalidate_cache()
    return path


def _is_int(v, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _crossover_problem(c, where: str = "crossover") -> Optional[str]:
    if c is None:
        return None
    if not isinstance(c, dict):
        return f"{where} is {type(c).__name__}, not an object"
    if c.get("seq_len") is not None and not _is_int(c["seq_len"]):
        return f"{where}.seq_len is {c['seq_len']!r}, not a whole number >= 0"
    if c.get("head_dim") is not None and not _is_int(c["head_dim"], 1):
        return f"{where}.head_dim is {c['head_dim']!r}, not a whole number >= 1"
    if not isinstance(c.get("timings", []), list) or any(
            not isinstance(t, dict) or ("seq_len" in t and not _is_int(t["seq_len"])) for t in c.get("timings", [])):
        return f"{where}.timings is not a list of timings with whole-number seq_len"
    by_dim = c.get("by_head_dim")
    if by_dim is None:
        return None
    if not isinstance(by_dim, dict):
        return f"{where}.by_head_dim is {type(by_dim).__name__}, not an object"
    for d, sub in by_dim.items():
        if not (isinstance(d, str) and d.isdigit() and int(d) > 0):
            return f"{where}.by_head_dim has key {d!r}, not a head size"
        problem = _crossover_problem(sub, f"{where}.by_head_dim[{d}]")
        if problem or (sub or {}).get("by_head_dim") is not None:
            return problem or f"{where}.by_head_dim[{d}] nests another by_head_dim"
    return None


def report_problem(data, key: Optional[dict] = None) -> Optional[str]:
    """Why ``data`` is not a usable report (types and ranges of what the runtime reads), or None when it is."""
    if not isinstance(data, dict):
        return f"the report is {type(data).__name__}, not an object"
    if data.get("schema") != SCHEMA:
        return f"schema {data.get('schema')!r}, expected {SCHEMA}"
    if key is not None and data.get("key") != key:
        return "made for another pack, kernel, torch, triton or GPU"
    variants = data.get("variants", {})
    if not isinstance(variants, dict) or any(
            not isinstance(v, dict) or any(not isinstance(v.get(s, {}), dict) for s in ("build", "selftest"))
            for v in variants.values()):
        return "variants is not an object of {build, selftest} objects"
    off = data.get("disabled_variants", [])
    if not isinstance(off, list) or any(not isinstance(v, str) for v in off):
        return "disabled_variants is not a list of names"
    for field in ("sdpa_default_safe", "complete", "quick"):
        if data.get(field) is not None and not isinstance(data[field], bool):
            return f"{field} is {data[field]!r}, not true/false"
    if data.get("attempts") is not None and not _is_int(data["attempts"], 1):
        return f"attempts is {data['attempts']!r}, not a whole number >= 1"
    if data.get("long_sequence_kernel") is not None and not isinstance(data["long_sequence_kernel"], dict):
        return "long_sequence_kernel is not an object"
    problem = _pv_choice_problem(data.get("pv_choice"))
    return problem or _crossover_problem(data.get("crossover"))


def _pv_choice_problem(c) -> Optional[str]:
    if c is None:
        return None
    by = c.get("by_head_dim") if isinstance(c, dict) else None
    if not isinstance(by, dict):
        return "pv_choice is not an object with by_head_dim"
    for d, e in by.items():
        if not str(d).isdigit() or not isinstance(e, dict):
            return f"pv_choice.by_head_dim[{d!r}] is not a head size's entry"
        if e.get("choice") is not None and e["choice"] not in PV_PRECISIONS:
            return f"pv_choice.by_head_dim[{d}].choice is {e['choice']!r}, not one of {', '.join(PV_PRECISIONS)}"
        ms = e.get("ms", {})
        if not isinstance(ms, dict) or any(not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0
                                           for t in ms.values()):
            return f"pv_choice.by_head_dim[{d}].ms is not an object of positive times"
    return None


def _no_constants(name: str):
    raise ValueError(f"{name} in the report (not JSON)")


def read_report(key: dict) -> tuple[Optional[dict], Optional[str]]:
    """``(report, None)`` for a valid report of exactly this key; ``(None, why)`` for an invalid one
    (sampling then uses the table defaults and the next start or install.py rewrites it); ``(None, None)``
    when there is none for this key."""
    problems = []
    for d in report_dirs():  # the first valid one wins
        path = d / _report_name(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constants)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            problems.append((path, f"unreadable ({e})"))
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("key") != key:
            continue  # another install's report under a colliding name: not ours, not broken
        problem = report_problem(data, key)
        if problem is None:
            return data, None
        problems.append((path, problem))
    if not problems:
        return None, None
    path, problem = problems[0]
    logger.warning("[SageTriton] ignoring invalid report %s: %s; it will be redone", path, problem)
    return None, problem


def load_report(key: dict) -> Optional[dict]:
    """The report for exactly this key; None when missing, invalid, or from another schema/key."""
    return read_report(key)[0]


# ---------------------------------------------------------------------------------------------
# Runtime read API: cheap after the first call (cached per process; save_report refreshes it).

_cache_lock = threading.Lock()
_cached: dict = {}  # arch -> (report, problem)
_generation = 0  # bumped whenever the cache is dropped: lets callers keep decisions made from a report


def invalidate_cache() -> None:
    global _generation
    with _cache_lock:
        _cached.clear()
        _generation += 1


def generation() -> int:
    """Changes whenever a report may have changed (saved, or the cache dropped)."""
    return _generation


def _current(arch: Optional[ArchInfo]) -> tuple[Optional[dict], Optional[str]]:
    if arch is None:
        from ..kernels.arch import detect_arch

        arch = detect_arch()
    with _cache_lock:
        if arch.arch in _cached:
            return _cached[arch.arch]
    found = read_report(report_key(arch))
    with _cache_lock:
        _cached[arch.arch] = found
    return found


def current_report(arch: Optional[ArchInfo] = None) -> Optional[dict]:
    """The valid report for the running GPU (``detect_arch()`` when not given), or None."""
    return _current(arch)[0]


def current_report_problem(arch: Optional[ArchInfo] = None) -> Optional[str]:
    """Why the running GPU's report was ignored as invalid (None: valid or absent)."""
    return _current(arch)[1]


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


def measured_pv_choice(arch: Optional[ArchInfo] = None, head_dim: int = 128) -> Optional[tuple]:
    """(P·V precision, {precision: ms}) install.py found fastest here for ``head_dim``, or None. Taken
    from the measured size nearest ``head_dim`` (64 for 40-96, 128 above)."""
    by = ((current_report(arch) or {}).get("pv_choice") or {}).get("by_head_dim") or {}
    sizes = sorted(int(d) for d in by)
    if not sizes:
        return None
    e = by[str(min(sizes, key=lambda s: (abs(s - head_dim), -s)))]
    return (e["choice"], dict(e.get("ms", {}))) if e.get("choice") else None


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
