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


def probe_environment() -> Environment:
    """Gather the real environment. Never raises: problems end up as fields the checks report."""
    env = Environment(system=platform.system(), python=platform.python_version())
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
    want = env.triton_required
    want_mm = _major_minor(re.sub(r"^[^\d]*", "", want.split(",")[0])) if want else None
    have_mm = _major_minor(env.triton_version)
    if want_mm and have_mm and want_mm != have_mm:
        pkg = re.match(r"^[A-Za-z0-9_.-]+", want).group(0)
        if env.system == "Windows":  # torch's metadata names Linux triton; Windows gets the same release line
            fix = f"pip install \"triton-windows>={want_mm[0]}.{want_mm[1]},<{want_mm[0]}.{want_mm[1] + 1}\""
        else:
            fix = f"pip install \"{pkg}=={want_mm[0]}.{want_mm[1]}.*\" (or reinstall torch, which brings it)"
        return Check("triton", FAIL,
                     f"{env.triton_version}, but this torch expects {want}: kernels may fail to compile or crash", fix)
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
        if not a.known:
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


def check_triton_cache(env: Environment) -> list:
    if env.triton_cache_writable:
        return []
    return [Check("triton cache", FAIL, "Triton's cache folder is not writable: kernels cannot be built",
                  "set TRITON_CACHE_DIR to a writable folder, or fix the permissions of ~/.triton")]


def run_checks(env: Environment) -> list:
    checks = [check_python(env), check_torch(env), check_triton(env)]
    checks += check_triton_cache(env)
    checks += check_gpu(env)
    checks += check_amd_device_access(env)
    checks += check_wsl(env)
    checks += check_env_vars(env)
    return checks


def has_failures(checks: list) -> bool:
    return any(c.status == FAIL for c in checks)


def format_checks(checks: list) -> str:
    return "\n".join(c.line() for c in checks)
