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
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from ..kernels.arch import ArchInfo, residual_crossover_factor
from ..kernels.log import logger
from . import report_facts
from .report_validation import SCHEMA, report_problem

# The crossover is measured for calls of this many batch x heads (cond + uncond, Flux / SD3-like heads):
# the dispatcher sends calls with less work per call to the fallback, whatever their length.
CROSSOVER_BATCH = 2
CROSSOVER_HEADS = 24
ENV_DIR = "SAGETRITON_REPORT_DIR"
# What a report may hold is validated in ``report_validation.report_problem``, the one place; a bigger file is
# tampered and is not read.
MAX_REPORT_BYTES = 4 << 20
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


def _write_problem(d: Path) -> Optional[str]:
    """Why no file can be created in ``d`` (None: one can)."""
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".probe-"):
            pass
        return None
    except OSError as e:
        return e.strerror or type(e).__name__


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
    return local if _write_problem(local) is None else _user_cache_dir()


def writable_report_dir() -> tuple[Optional[Path], str]:
    """``(folder, "")`` for the folder reports are written to, or ``(None, why)`` naming each folder tried
    when none is writable ($SAGETRITON_REPORT_DIR alone when set: a report elsewhere would not be read)."""
    tried = [Path(os.environ[ENV_DIR])] if os.environ.get(ENV_DIR) else [PACK_DIR / ".sagetriton", _user_cache_dir()]
    problems = []
    for d in tried:
        why = _write_problem(d)
        if why is None:
            return d, ""
        problems.append(f"{d} ({why})")
    return None, "not writable: " + "; ".join(problems)


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


def display_path(path: Path) -> str:
    """``path`` as a user finds it, without the absolute install path (which holds the user's name): relative
    to $SAGETRITON_REPORT_DIR, the pack folder or the home folder."""
    bases = [(os.environ.get(ENV_DIR), f"${ENV_DIR}"), (str(PACK_DIR), PACK_DIR.name), (os.path.expanduser("~"), "~")]
    for base, shown in bases:
        if base:
            try:
                return f"{shown}/{Path(path).relative_to(base).as_posix()}"
            except ValueError:
                continue
    return Path(path).name


def read_small_file(path: Path, limit: int = MAX_REPORT_BYTES) -> str:
    """The text of ``path``; OSError unless it is a regular file of at most ``limit`` bytes. Opened without
    blocking, so a FIFO or a device planted at the path (``/dev/zero``) is refused, not waited on or read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{Path(path).name} is not a regular file")
        data = f.read(limit + 1)
    if st.st_size > limit or len(data) > limit:
        raise OSError(f"{Path(path).name} is larger than {limit} bytes")
    return data.decode("utf-8")


def parse_json_file(path: Path):
    """The JSON in ``path`` (``read_small_file``); ValueError for anything that is not strict JSON."""
    try:
        return json.loads(read_small_file(path), parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("nested too deep") from None


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
            other = parse_json_file(old).get("key") or {}
            if old != path and all(other.get(f) == key.get(f) for f in SHARED_KEY):
                old.unlink()
        except (OSError, ValueError, AttributeError):
            pass  # unreadable or not a report object: not ours to judge here
    invalidate_cache()
    return path


def _no_constants(name: str):
    raise ValueError(f"{name} in the report (not JSON)")


def read_report(key: dict) -> tuple[Optional[dict], Optional[str]]:
    """``(report, None)`` for a valid report of exactly this key; ``(None, why)`` for an invalid one
    (sampling then uses the table defaults and the next start or install.py rewrites it); ``(None, None)``
    when there is none for this key."""
    return _read(key)[:2]


def _read(key: dict) -> tuple[Optional[dict], Optional[str], Optional[Path]]:
    """``read_report`` and the file the report was read from."""
    problems = []
    for d in report_dirs():  # the first valid one wins
        path = d / _report_name(key)
        try:
            data = parse_json_file(path)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            problems.append((path, f"unreadable ({e})"))
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("key") != key:
            continue  # another install's report under a colliding name: not ours, not broken
        problem = report_problem(data, key)
        if problem is None:
            return data, None, path
        problems.append((path, problem))
    if not problems:
        return None, None, None
    path, problem = problems[0]
    logger.warning("[SageTriton] ignoring invalid report %s: %s; it will be redone", display_path(path), problem)
    return None, problem, None


def load_report(key: dict) -> Optional[dict]:
    """The report for exactly this key; None when missing, invalid, or from another schema/key."""
    return read_report(key)[0]


# ---------------------------------------------------------------------------------------------
# Runtime read API: one stat per folder per call, the file read again only when its stat changed (replaced,
# edited or deleted after the start); ``generation`` changes then, so the dispatcher plans again.

_cache_lock = threading.Lock()
_cached: dict = {}  # arch name -> _Entry
_generation = 0  # bumped whenever the cache is dropped: lets callers keep decisions made from a report


class _Entry:
    __slots__ = ("key", "stamp", "report", "problem", "path", "facts")

    def __init__(self, key, stamp, found) -> None:
        self.key, self.stamp = key, stamp
        self.report, self.problem, self.path = found
        self.facts = report_facts.parse(self.report)  # parsed once per read, so once per file change


def invalidate_cache() -> None:
    global _generation
    with _cache_lock:
        _cached.clear()
        _generation += 1


def generation() -> int:
    """Changes whenever a report may have changed (saved, or the cache dropped)."""
    return _generation


def _stamp(key: dict) -> tuple:
    """What identifies the files a read of ``key`` would see: (mtime_ns, size, inode) per folder."""
    out = []
    for d in report_dirs():
        try:
            st = os.stat(d / _report_name(key))
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def check_for_changes() -> bool:
    """Drop the cached reports whose files changed since they were read; True when one did."""
    with _cache_lock:
        entries = list(_cached.values())
    if any(_stamp(e.key) != e.stamp for e in entries):
        invalidate_cache()
        return True
    return False


def _current(arch: Optional[ArchInfo]) -> _Entry:
    if arch is None:
        from ..kernels.arch import detect_arch

        arch = detect_arch()
    with _cache_lock:
        entry = _cached.get(arch.arch)
    if entry is not None:
        if _stamp(entry.key) == entry.stamp:
            return entry
        invalidate_cache()  # replaced or deleted since it was read
    key = report_key(arch)
    stamp = _stamp(key)  # before the read: a write during it is seen on the next call
    entry = _Entry(key, stamp, _read(key))
    with _cache_lock:
        _cached[arch.arch] = entry
    return entry


def current_report(arch: Optional[ArchInfo] = None) -> Optional[dict]:
    """The valid report for the running GPU (``detect_arch()`` when not given), or None."""
    return _current(arch).report


def current_report_problem(arch: Optional[ArchInfo] = None) -> Optional[str]:
    """Why the running GPU's report was ignored as invalid (None: valid or absent)."""
    return _current(arch).problem


def current_report_path(arch: Optional[ArchInfo] = None) -> Optional[Path]:
    """The file the running GPU's valid report was read from (None: no valid report)."""
    return _current(arch).path


def variant_name(qk_quant_gran: str, pv_precision: str, pv_accum_dtype: str) -> str:
    return f"{qk_quant_gran}/{pv_precision}/{pv_accum_dtype}"


def current_facts(arch: Optional[ArchInfo] = None) -> report_facts.ReportFacts:
    """The running GPU's report as typed, frozen answers (``report_facts``; their defaults without a report)."""
    return _current(arch).facts


def measured_crossover(arch: Optional[ArchInfo] = None, head_dim: int = 128) -> Optional[int]:
    """Key length from which the kernel beats SDPA on this GPU at this head size (the nearest measured
    one); None when not measured (use the table default)."""
    return current_facts(arch).crossover_seq_len(head_dim)


def crossover_seq_len(cross: dict, head_dim: int = 128) -> Optional[int]:
    """The dispatcher's key length for ``head_dim`` from a ``selftest.measure_crossovers`` result."""
    entries = report_facts.crossover_entries(cross)
    return report_facts.ReportFacts(crossovers=entries, crossover=None if entries else
                                    report_facts.entry_seq_len(cross)).crossover_seq_len(head_dim)


def measured_pv_choice(arch: Optional[ArchInfo] = None, head_dim: int = 128) -> Optional[tuple]:
    """(P·V precision, {precision: ms}) install.py found fastest here for ``head_dim``, or None. Taken
    from the measured size nearest ``head_dim`` (64 for 40-96, 128 above)."""
    return current_facts(arch).pv_choice(head_dim)


def disabled_variants(arch: Optional[ArchInfo] = None) -> frozenset:
    """Variant names (``variant_name``) that failed to build or self-test here: the runtime must not pick them."""
    return current_facts(arch).disabled_variants


def sdpa_default_safe(arch: Optional[ArchInfo] = None) -> Optional[bool]:
    """RDNA4: whether torch's default SDPA survived the child-process probe. None: not probed (other GPUs)."""
    return current_facts(arch).sdpa_default_safe


def long_sequence_kernel_failed(arch: Optional[ArchInfo] = None) -> bool:
    """Whether the long-sequence kernel (``KernelConfig.shared_kv_min_len``) failed its self-test here."""
    return current_facts(arch).long_sequence_kernel_failed


def rope_kernel_failed(arch: Optional[ArchInfo] = None) -> bool:
    """Whether the RoPE kernel (``kernels.rope``) failed its self-test here: the pack keeps ComfyUI's RoPE."""
    return current_facts(arch).rope_kernel_failed


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
