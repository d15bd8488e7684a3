"""Environment checks for install.py: one line per check, each failure with a one-line fix.

The environment is gathered once into a plain ``Environment`` value (``probe_environment()``), and
the checks are pure functions of it, so tests can simulate CUDA, ROCm, CPU-only, WSL2 and broken
set-ups without the hardware.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from typing import Optional

from ..kernels.arch import ArchInfo, arch_from_properties

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
MARKS = {OK: "[ OK ]", WARN: "[WARN]", FAIL: "[FAIL]", INFO: "[INFO]"}

# Variables users are told to set by other guides. SageTriton needs none of them.
ROCM_ENV_VARS = ("PYTORCH_ROCM_ARCH", "HIP_PATH", "ROCM_HOME", "ROCM_PATH", "HSA_OVERRIDE_GFX_VERSION",
                 "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HSA_ENABLE_DXG_DETECTION")
# Ubuntu's own (old) ROCm runtime: found first by the loader, it knows neither WSL nor recent GPUs.
DISTRO_HSA_RUNTIME = "/usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1"
LOW_FREE_MEMORY = 1 << 30  # below this the self-test (and most models) will not fit
MIN_NVIDIA_MAJOR = 8  # Triton's NVIDIA back-end: compute capability 8.0+ (Ampere); RTX 20 / GTX 16 are sm75


@dataclass
class GpuInfo:
    """What we need from ``torch.cuda.get_device_properties`` (same attribute names)."""

    name: str
    major: int = 0
    minor: int = 0
    gcnArchName: str = ""  # noqa: N815 - torch's spelling
    total_memory: int = 0
    free_memory: Optional[int] = None


@dataclass
class DevNode:
    exists: bool
    accessible: bool = False  # read+write for the current user


@dataclass
class Environment:
    system: str = "Linux"  # platform.system()
    python: str = "3.11.0"
    torch_version: Optional[str] = None  # None: torch not importable
    torch_error: str = ""
    torch_cuda: Optional[str] = None  # torch.version.cuda
    torch_hip: Optional[str] = None  # torch.version.hip
    triton_version: Optional[str] = None
    triton_error: str = ""
    triton_required: Optional[str] = None  # torch's own requirement, e.g. "triton~=3.8.0"
    triton_cache_writable: bool = True
    gpus: list = field(default_factory=list)  # list[GpuInfo]
    gpu_error: str = ""  # why torch.cuda found no device, when it raised
    wsl: bool = False
    dev_nodes: dict = field(default_factory=dict)  # path -> DevNode
    user_groups: list = field(default_factory=list)
    env_vars: dict = field(default_factory=dict)
    distro_hsa_runtime: bool = False  # DISTRO_HSA_RUNTIME is installed
    python_prefix: str = ""  # the base Python's folder (where Windows keeps include\ and libs\)
    python_embedded: bool = False  # a ._pth file there: Windows' embeddable Python (ComfyUI portable)
    python_missing_dev: list = field(default_factory=list)  # of "include", "libs" (Windows only)

    @property
    def build(self) -> str:
        if self.torch_version is None:
            return "none"
        if self.torch_hip:
            return "rocm"
        if self.torch_cuda:
            return "cuda"
        return "cpu"

    def arch(self, index: int = 0) -> Optional[ArchInfo]:
        if index >= len(self.gpus):
            return None
        return arch_from_properties(self.gpus[index], is_hip=self.build == "rocm")


@dataclass
class Check:
    name: str
    status: str  # OK | WARN | FAIL | INFO
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{MARKS[self.status]} {self.name}: {self.detail}"
        if self.fix and self.status in (WARN, FAIL):
            text += f"\n         fix: {self.fix}"
        return text

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Gathering the real environment


def _dev_node(path: str) -> DevNode:
    if not os.path.exists(path):
        return DevNode(False)
    if os.path.isdir(path):  # /dev/dri: what matters is the render nodes inside
        nodes = [os.path.join(path, n) for n in os.listdir(path) if n.startswith("renderD")]
        return DevNode(True, any(os.access(n, os.R_OK | os.W_OK) for n in nodes))
    return DevNode(True, os.access(path, os.R_OK | os.W_OK))


def _user_groups() -> list:
    try:
        import grp

        return sorted({grp.getgrgid(g).gr_name for g in os.getgroups()})
    except (ImportError, KeyError, OSError):
        return []


def _is_wsl() -> bool:
    if os.path.exists("/dev/dxg"):
        return True
    try:
        with open("/proc/version", encoding="utf-8") as f:
            return "microsoft" in f.read().lower()
    except OSError:
        return False


def _triton_requirement() -> Optional[str]:
    """The triton package torch was built against, from torch's own metadata."""
    try:
        from importlib.metadata import requires

        for req in requires("torch") or []:
            spec = req.split(";")[0].strip()
            if re.match(r"^(pytorch-)?triton", spec):
                return spec
    except Exception:  # noqa: BLE001 - metadata missing or odd: the check just says "unknown"
        pass
    return None


def _triton_cache_writable() -> bool:
    cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    probe = cache
    while not os.path.exists(probe):  # Triton creates it on first compile: check the first existing parent
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    return os.access(probe, os.W_OK)


def python_dev_files(prefix: str, version: str) -> tuple:
    """(embedded, missing) for a Windows Python at ``prefix``: Triton's launcher is compiled by TinyCC
    against ``include\\Python.h`` and linked with ``libs\\python3XX.lib``, which the embeddable Python
    (ComfyUI portable's python_embeded) does not ship."""
    names = os.listdir(prefix) if os.path.isdir(prefix) else []
    lower = {n.lower() for n in names}
    embedded = any(n.endswith("._pth") for n in lower)
    mm = _major_minor(version) or (3, 0)
    missing = []
    if not _has_file(prefix, "include", "Python.h"):
        missing.append("include")
    if not _has_file(prefix, "libs", f"python{mm[0]}{mm[1]}.lib"):
        missing.append("libs")
    return embedded, missing


def _has_file(prefix: str, folder: str, name: str) -> bool:
    """Case-insensitively, as on Windows (``Include`` and ``include`` are the same folder there)."""
    for d in (os.listdir(prefix) if os.path.isdir(prefix) else []):
        path = os.path.join(prefix, d)
        if d.lower() == folder and os.path.isdir(path):
            if any(f.lower() == name.lower() for f in os.listdir(path)):
                return True
    return False


def probe_environment(system: Optional[str] = None, python_prefix: Optional[str] = None) -> Environment:
    """Gather the real environment. Never raises: problems end up as fields the checks report.
    ``system`` and ``python_prefix`` replace ``platform.system()`` and the base Python's folder (tests
    simulate a Windows portable install on any machine)."""
    env = Environment(system=system or platform.system(), python=platform.python_version())
    if env.system == "Windows":
        env.python_prefix = python_prefix or sys.base_prefix
        try:
            env.python_embedded, env.python_missing_dev = python_dev_files(env.python_prefix, env.python)
        except OSError:
            pass
    env.wsl = env.system == "Linux" and _is_wsl()
    env.env_vars = {k: os.environ[k] for k in ROCM_ENV_VARS if k in os.environ}
    env.user_groups = _user_groups()
    env.triton_cache_writable = _triton_cache_writable()
    if env.system == "Linux":
        env.dev_nodes = {p: _dev_node(p) for p in ("/dev/kfd", "/dev/dri", "/dev/dxg")}
        env.distro_hsa_runtime = os.path.exists(DISTRO_HSA_RUNTIME)
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        env.torch_error = f"{type(e).__name__}: {e}"
        return env
    env.torch_version = torch.__version__.split("+")[0]
    env.torch_cuda = getattr(torch.version, "cuda", None)
    env.torch_hip = getattr(torch.version, "hip", None)
    env.triton_required = _triton_requirement()
    try:
        import triton

        env.triton_version = triton.__version__
    except Exception as e:  # noqa: BLE001
        env.triton_error = f"{type(e).__name__}: {e}"
    try:
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
            p = torch.cuda.get_device_properties(i)
            free = None
            try:
                free = torch.cuda.mem_get_info(i)[0]
            except Exception:  # noqa: BLE001 - some drivers do not report it
                pass
            env.gpus.append(GpuInfo(p.name, p.major, p.minor, getattr(p, "gcnArchName", "") or "",
                                    p.total_memory, free))
    except Exception as e:  # noqa: BLE001 - a broken driver must become a FAIL line, not a traceback
        env.gpu_error = f"{type(e).__name__}: {e}"
    return env


# ---------------------------------------------------------------------------------------------
# The checks


def _major_minor(version: str) -> Optional[tuple]:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _torch_index_hint(env: Environment) -> str:
    amd = env.build == "rocm" or env.dev_nodes.get("/dev/kfd", DevNode(False)).exists
    if amd:
        return "the ROCm build from https://pytorch.org/get-started/locally/ (AMD, Linux/WSL2; see docs/AMD.md)"
    return "the CUDA build from https://pytorch.org/get-started/locally/ (NVIDIA)"


def check_python(env: Environment) -> Check:
    mm = _major_minor(env.python)
    if mm and mm >= (3, 10):
        return Check("python", OK, env.python)
    return Check("python", FAIL, f"{env.python} is too old", "use Python 3.10 or newer (ComfyUI's own requirement)")


def check_torch(env: Environment) -> Check:
    if env.torch_version is None:
        return Check("torch", FAIL, f"not importable ({env.torch_error or 'not installed'})",
                     "install ComfyUI's requirements first; " + _torch_index_hint(env))
    build = {"cuda": f"CUDA {env.torch_cuda}", "rocm": f"ROCm/HIP {env.torch_hip}", "cpu": "CPU-only build"}[env.build]
    if env.build == "cpu":
        return Check("torch", WARN, f"{env.torch_version}, {build}: no GPU kernels possible",
                     "install a GPU build: " + _torch_index_hint(env))
    return Check("torch", OK, f"{env.torch_version}, {build}")


# The Triton release line each torch release is built against (torch's own metadata names it on Linux; on
# Windows torch names none and users install triton-windows themselves, so the doctor needs the table).
TRITON_FOR_TORCH = {(2, 6): (3, 2), (2, 7): (3, 3), (2, 8): (3, 4), (2, 9): (3, 5), (2, 11): (3, 6),
                    (2, 12): (3, 7), (2, 13): (3, 7), (2, 14): (3, 8), (2, 15): (3, 9)}


def _expected_triton(env: Environment) -> Optional[str]:
    if env.triton_required:
        return env.triton_required
    want = TRITON_FOR_TORCH.get(_major_minor(env.torch_version or ""))
    if want is None:
        return None
    pkg = "triton-windows" if env.system == "Windows" else "triton"
    return f"{pkg}~={want[0]}.{want[1]}.0"


def check_triton(env: Environment) -> Check:
    if env.torch_version is None:
        return Check("triton", INFO, "skipped (no torch)")
    if env.triton_version is None:
        if env.system == "Windows" and env.build == "cuda":
            fix = "pip install triton-windows (the release matching your torch), or use WSL2"
        elif env.system == "Windows" and env.build == "rocm":
            fix = "Triton has no AMD back-end for native Windows: run ComfyUI in WSL2 with ROCm torch (docs/AMD.md)"
        elif env.build == "rocm":
            fix = "reinstall torch from the ROCm index: it brings pytorch-triton-rocm"
        else:
            fix = f"pip install \"{env.triton_required or 'triton'}\""
        return Check("triton", FAIL if env.build in ("cuda", "rocm") else WARN,
                     f"not importable ({env.triton_error or 'not installed'})", fix)
    want = _expected_triton(env)
    want_mm = _major_minor(re.sub(r"^[^\d]*", "", want.split(",")[0])) if want else None
    have_mm = _major_minor(env.triton_version)
    if want_mm and have_mm and want_mm != have_mm:
        pkg = re.match(r"^[A-Za-z0-9_.-]+", want).group(0)
        if env.system == "Windows":  # torch's metadata names Linux triton; Windows gets the same release line
            fix = f"pip install \"triton-windows>={want_mm[0]}.{want_mm[1]},<{want_mm[0]}.{want_mm[1] + 1}\""
        else:
            fix = f"pip install \"{pkg}=={want_mm[0]}.{want_mm[1]}.*\" (or reinstall torch, which brings it)"
        return Check("triton", FAIL, f"{env.triton_version}, but torch {env.torch_version} expects {want}: kernels "
                                     "may fail to compile or crash", fix)
    detail = env.triton_version + (f" (torch expects {want})" if want else "")
    return Check("triton", OK, detail)


def check_gpu(env: Environment) -> list:
    if env.torch_version is None:
        return [Check("gpu", INFO, "skipped (no torch)")]
    if not env.gpus:
        if env.build == "cpu":
            return [Check("gpu", WARN, "no GPU found (CPU-only torch): SageTriton leaves ComfyUI's attention in place",
                          "install a GPU build: " + _torch_index_hint(env))]
        why = f" ({env.gpu_error})" if env.gpu_error else ""
        if env.build == "rocm":
            fix = ("check `rocminfo` lists your GPU; on Linux see the /dev/kfd and group lines; on WSL2 install "
                   "the AMD WSL driver stack (see docs/AMD.md)")
        else:
            fix = "check `nvidia-smi` works and CUDA_VISIBLE_DEVICES is not empty; update the NVIDIA driver"
        # WARN, not FAIL: without a GPU the pack still loads and leaves ComfyUI's attention in place.
        return [Check("gpu", WARN, f"no GPU found ({env.build.upper()} torch sees no device{why}): SageTriton "
                                   "leaves ComfyUI's attention in place", fix)]
    out = []
    for i, g in enumerate(env.gpus):
        a = env.arch(i)
        label = f"gpu{i}"
        detail = f"{g.name}, {a.arch} ({a.family})"
        if env.build == "cuda" and g.major < MIN_NVIDIA_MAJOR:
            out.append(Check(label, FAIL, detail + ": older than Ampere; Triton supports NVIDIA compute capability "
                                                   "8.0 and newer, so no kernel can be built for it",
                             "nothing to fix on this GPU: ComfyUI's own attention keeps running (SageTriton "
                             "needs an RTX 30 / A100 or newer)"))
        elif not a.known:
            out.append(Check(label, WARN, detail + ": not in the architecture table, safe defaults used",
                             "please report this GPU; it still works with fp16 P·V and 1 pipeline stage"))
        else:
            out.append(Check(label, OK, detail))
        if g.free_memory is not None:
            gib = g.free_memory / (1 << 30)
            if g.free_memory < LOW_FREE_MEMORY:
                out.append(Check(f"{label} memory", WARN, f"{gib:.2f} GiB free",
                                 "close other GPU programs (another ComfyUI, a game, a browser tab with WebGL)"))
            else:
                out.append(Check(f"{label} memory", OK, f"{gib:.1f} GiB free of {g.total_memory / (1 << 30):.1f} GiB"))
    return out


def check_amd_device_access(env: Environment) -> list:
    """ROCm on native Linux needs /dev/kfd and /dev/dri read/write (groups render, video)."""
    if env.system != "Linux" or env.build != "rocm":
        return []
    if env.wsl:
        out = []
        dxg = env.dev_nodes.get("/dev/dxg", DevNode(False))
        if dxg.exists:
            out.append(Check("WSL2", OK, "/dev/dxg present: ROCm goes through the Windows driver (/dev/kfd not used)"))
        else:
            out.append(Check("WSL2", FAIL, "/dev/dxg missing: the Windows GPU driver is not exposed to WSL",
                             "update the AMD Adrenalin driver on Windows and run `wsl --update`"))
        if env.distro_hsa_runtime and not env.gpus:
            out.append(Check("HSA runtime", WARN, f"{DISTRO_HSA_RUNTIME} (Ubuntu's package) may shadow AMD's WSL "
                                                  "runtime (\"ROCk module is NOT loaded\")",
                             "sudo apt remove libhsa-runtime64-1 libhsakmt1 (AMD's ROCm stays in /opt/rocm)"))
        return out
    out = []
    groups_hint = "sudo usermod -aG render,video $USER, then log out and back in"
    kfd = env.dev_nodes.get("/dev/kfd", DevNode(False))
    if not kfd.exists:
        out.append(Check("/dev/kfd", FAIL, "missing: the amdgpu kernel driver is not loaded",
                         "install/load the amdgpu driver (`sudo modprobe amdgpu`; in Docker pass --device=/dev/kfd)"))
    elif not kfd.accessible:
        out.append(Check("/dev/kfd", FAIL, "present but not read/writable by this user", groups_hint))
    else:
        out.append(Check("/dev/kfd", OK, "present and accessible"))
    dri = env.dev_nodes.get("/dev/dri", DevNode(False))
    if not dri.exists:
        out.append(Check("/dev/dri", FAIL, "missing", "load the amdgpu driver (in Docker pass --device=/dev/dri)"))
    elif not dri.accessible:
        out.append(Check("/dev/dri", FAIL, "render nodes not read/writable by this user", groups_hint))
    else:
        out.append(Check("/dev/dri", OK, "render nodes accessible"))
    if env.user_groups:
        missing = [g for g in ("render", "video") if g not in env.user_groups]
        if missing and not (kfd.accessible and dri.accessible):
            out.append(Check("groups", WARN, f"user not in {', '.join(missing)}", groups_hint))
    return out


def check_wsl(env: Environment) -> list:
    if not env.wsl or env.build == "rocm":
        return []  # the ROCm case is covered by check_amd_device_access
    return [Check("WSL2", INFO, "running under WSL2 (GPU through /dev/dxg)")]


def check_env_vars(env: Environment) -> list:
    out = []
    for name, value in sorted(env.env_vars.items()):
        if name == "HSA_OVERRIDE_GFX_VERSION":
            out.append(Check(name, WARN, f"={value}: the GPU pretends to be another arch; kernels are built for the "
                                         "pretended one and may crash or be slow",
                             "unset it (RDNA3/RDNA4 are supported natively by recent ROCm torch)"))
        elif name in ("PYTORCH_ROCM_ARCH", "HIP_PATH", "ROCM_HOME", "ROCM_PATH"):
            out.append(Check(name, INFO, f"={value} (only for compiling C++ extensions; SageTriton does not need it)"))
        elif value.strip() in ("", "-1"):
            out.append(Check(name, WARN, f"={value!r} hides every GPU", f"unset {name}"))
        else:
            out.append(Check(name, INFO, f"={value}"))
    return out


def _embedded_python_fix(env: Environment) -> str:
    mm = _major_minor(env.python) or (3, 0)
    where = env.python_prefix or "the Python folder"
    return (f"copy the include and libs folders of a full Python {mm[0]}.{mm[1]} (python.org installer, or the "
            f"python_{mm[0]}.{mm[1]}_include_libs zip linked in triton-windows' README) into {where}")


def check_python_dev_files(env: Environment) -> list:
    """Windows: Triton builds its launcher with the bundled TinyCC against Python's headers and import
    library; the embeddable Python has neither, and every kernel then fails to build (``-lpython3XX``)."""
    if env.system != "Windows" or env.torch_version is None or env.triton_version is None:
        return []
    kind = "embedded Python" if env.python_embedded else "Python"
    if env.python_missing_dev:
        return [Check("python headers", FAIL,
                      f"{kind} at {env.python_prefix} has no {' or '.join(env.python_missing_dev)} folder: "
                      "TinyCC cannot compile or link Triton's launcher (-lpython3XX)", _embedded_python_fix(env))]
    return [Check("python headers", OK, f"include and libs present in {env.python_prefix}")]



def check_triton_cache(env: Environment) -> list:
    if env.triton_cache_writable:
        return []
    return [Check("triton cache", FAIL, "Triton's cache folder is not writable: kernels cannot be built",
                  "set TRITON_CACHE_DIR to a writable folder, or fix the permissions of ~/.triton")]


def run_checks(env: Environment) -> list:
    checks = [check_python(env), check_torch(env), check_triton(env)]
    checks += check_triton_cache(env)
    checks += check_python_dev_files(env)
    checks += check_gpu(env)
    checks += check_amd_device_access(env)
    checks += check_wsl(env)
    checks += check_env_vars(env)
    return checks


def has_failures(checks: list) -> bool:
    return any(c.status == FAIL for c in checks)


def format_checks(checks: list) -> str:
    return "\n".join(c.line() for c in checks)
