"""Which GPU we run on, and the default kernel configuration for it.

The table is data, not scattered constants: one row per architecture family. AMD devices are
identified by ``gcnArchName`` because the HIP-reported compute capability is ambiguous (gfx90a
reports 9.0, like Hopper).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from .log import logger

QK_QUANT_GRANS = ("per_block", "per_warp", "per_thread")
# fp8+residual: fp8 P·V plus a second fp8 MMA with V's rounding error (more accurate, slower).
# int8: P rounded to 0..255 per row and key tile, V to ±127 per channel, an INT8 MMA (every GPU has one).
PV_PRECISIONS = ("fp16", "fp8", "fp8+residual", "int8")
PV_ACCUM_DTYPES = ("fp32", "fp16+fp32", "fp16")


def residual_crossover_factor(head_dim: int) -> int:
    """How much later than the default variant fp8+residual pays off, per head size: its second P·V
    MMA doubles P·V's tensor work and V's traffic (measurements: bench/NOTES.md, "fp8+residual")."""
    return 2 if head_dim > 64 else 16


# Largest finite value of each fp8 flavour, used to scale V and P into range.
FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}


@dataclass(frozen=True)
class ArchInfo:
    vendor: str  # "nvidia" | "amd" | "cpu"
    arch: str  # "sm90", "gfx1201", "cpu", ...
    family: str  # "hopper", "rdna4", ...
    name: str = ""  # marketing name, for humans
    warp_size: int = 32
    fp8: Optional[str] = None  # fp8 matrix format the hardware multiplies, if any
    known: bool = True  # False when the arch is not in the table (safe defaults apply)


@dataclass(frozen=True)
class KernelConfig:
    """Everything that selects one compiled kernel variant."""

    qk_quant_gran: str = "per_warp"
    pv_precision: str = "fp16"
    pv_accum_dtype: str = "fp32"
    fp8_format: Optional[str] = None
    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    # Key length below which torch SDPA beats the kernel (quantization overhead dominates).
    min_seq_len: int = 2048
    # Load K/V tiles through tensor descriptors (TMA). NVIDIA sm90+ only.
    use_tma: bool = False
    # Register cap per thread handed to ptxas (0: the compiler's choice). NVIDIA only.
    max_registers: int = 0
    # Query length from which Hopper's Gluon kernel runs instead (three warpgroups share each K/V
    # tile, ``kernels.hopper_gluon``); 0: never.
    shared_kv_min_len: int = 0
    # FP8 P·V only: also multiply P by V's fp8 rounding residual (the "fp8+residual" choice).
    v_residual: bool = False
    # Programmatic dependent launch (NVIDIA sm90+): each launch of a call may start while the one
    # before it finishes, waiting only before it reads that launch's output.
    pdl: bool = False
    # Multiply Q and K by a block Hadamard matrix before INT8 rounding (exact for Q·Kᵀ): spreads
    # outlier channels and tokens' massive activations over the block.
    qk_rotation: bool = False
    # Rotate with the 16-bit inputs' own tensor-core product over several tiles per program, the next
    # tile's rows loaded while this one is multiplied (``quant._quantize_rotated_tiles``). Needs about
    # 115 KB of shared memory per program and cp.async: Hopper.
    rotation_tiles: bool = False

    def pv_choice(self) -> str:
        """The user-visible P·V precision this config runs (a ``PV_PRECISIONS`` name)."""
        return "fp8+residual" if self.v_residual else self.pv_precision

    def with_pv_choice(self, choice: str) -> KernelConfig:
        """This config with the P·V precision named ``choice`` (a ``PV_PRECISIONS`` name)."""
        if choice == "fp8+residual":
            return self.replace(pv_precision="fp8", v_residual=True)
        return self.replace(pv_precision=choice, v_residual=False)

    def group_sizes(self) -> tuple[int, int]:
        """Tokens sharing one Q scale and one K scale for this granularity."""
        if self.qk_quant_gran == "per_block":
            return self.block_m, self.block_n
        if self.qk_quant_gran == "per_warp":
            return max(self.block_m // self.num_warps, 1), self.block_n
        return 1, 1  # per_thread: per-token scales, finer than any thread's MMA fragment

    def replace(self, **kw) -> KernelConfig:
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# family -> (fp8 format or None, defaults). P·V: INT8 where the datasheets rate it above the FP8 or FP16
# product we would otherwise run (GeForce Ada and Blackwell: FP8 with fp32 accumulation at half rate;
# Ampere: FP16 at a half or a quarter), FP8 where the two are equal (Hopper, measured: INT8's per-tile
# rescale costs 12-16 % there; CDNA3 and RDNA4 assumed alike), FP16 where no 8-bit P·V is faster (RDNA3,
# CDNA2). INT8 P·V is also about twice as accurate as FP8 (docs/RESULTS.md). Only Hopper is measured.
# the others are estimates from the published reference numbers and are re-measured by install.py.
# Non-Hopper tiles were chosen from cross-compiled assembly only (no such GPU was available, nothing
# here is timed): no register spills under Triton 3.6 and 3.8, fewest main-loop instructions per
# logit. Table and reasoning: docs/AMD.md, "Default tiles from compiler output".
_FAMILIES = {
    # NVIDIA. 128x64 with 8 warps (16 query rows per warp, as 64x64 with 4) issues a third fewer
    # loop instructions per logit than 64x64/4 on sm80/86/89/120, spill-free in both versions.
    "ampere": (None, dict(pv_precision="int8", pv_accum_dtype="fp32", block_m=128, block_n=64, num_warps=8,
                          num_stages=3, min_seq_len=2048)),
    "ampere_consumer": (None, dict(pv_precision="int8", pv_accum_dtype="fp32", block_m=128, block_n=64,
                                   num_warps=8, num_stages=2, min_seq_len=1024)),
    "ada": ("e4m3fn", dict(pv_precision="int8", pv_accum_dtype="fp32", block_m=128, block_n=64, num_warps=8,
                           num_stages=2, min_seq_len=1024)),
    # Hopper: tiles and crossover measured on the H200 (bench/results/sm90_sweep.json, sm90_kernels.json).
    # The crossover is 4,608, not 4K, because wins at 4K were inside the host-time noise (bench/NOTES.md).
    "hopper": ("e4m3fn", dict(pv_precision="fp8", pv_accum_dtype="fp32", block_m=64, block_n=128,
                              num_warps=4, num_stages=2, min_seq_len=4608, use_tma=True, pdl=True,
                              rotation_tiles=True)),
    # Tiles checked on sm120 (RTX 50xx); sm100 only checked to compile without spills.
    "blackwell": ("e4m3fn", dict(pv_precision="int8", pv_accum_dtype="fp32", block_m=128, block_n=64, num_warps=8,
                                 num_stages=2, min_seq_len=2048)),
    "turing": (None, dict(pv_precision="fp16", pv_accum_dtype="fp32", num_stages=2, min_seq_len=2048)),
    # AMD. RDNA needs num_stages=1: deeper software pipelines miscompile there in some Triton versions.
    "cdna2": (None, dict(pv_precision="fp16", pv_accum_dtype="fp32", num_stages=1, min_seq_len=2048)),
    # gfx942: 128x64/4 (32 rows per wave64) needs 2.1-2.4x fewer loop instructions per logit than 64x64/4.
    "cdna3": ("e4m3fnuz", dict(pv_precision="fp8", pv_accum_dtype="fp32", block_m=128, block_n=64, num_warps=4,
                               num_stages=1, min_seq_len=2048)),
    "cdna4": ("e4m3fn", dict(pv_precision="fp8", pv_accum_dtype="fp32", num_stages=1, min_seq_len=2048)),
    # RDNA3 at head_dim 128 gets block_n=32 in default_config (64x64 spills there).
    "rdna3": (None, dict(pv_precision="fp16", pv_accum_dtype="fp32", num_stages=1, min_seq_len=1024)),
    # RDNA4 keeps 64x64/4: spill-free in both versions; 128x64/8 is 6 % leaner under 3.8 but
    # 3 % worse under 3.6, not a clear win.
    "rdna4": ("e4m3fn", dict(pv_precision="fp8", pv_accum_dtype="fp32", num_stages=1, min_seq_len=1024)),
    # Triton interpreter / unknown devices: the most portable choice.
    "cpu": (None, dict(pv_precision="fp16", pv_accum_dtype="fp32", num_stages=1, min_seq_len=0)),
    "unknown": (None, dict(pv_precision="fp16", pv_accum_dtype="fp32", num_stages=1, min_seq_len=2048)),
}


def nvidia_family(major: int, minor: int) -> str:
    if major >= 10:
        return "blackwell"
    if major == 9:
        return "hopper"
    if (major, minor) == (8, 9):
        return "ada"
    if (major, minor) == (8, 0):
        return "ampere"
    if major == 8:
        return "ampere_consumer"
    if major == 7 and minor >= 5:
        return "turing"
    return "unknown"


def amd_family(gfx: str) -> str:
    if gfx == "gfx90a":
        return "cdna2"
    if gfx == "gfx942":
        return "cdna3"
    if gfx == "gfx950":
        return "cdna4"
    if gfx.startswith("gfx12"):
        return "rdna4"
    if gfx.startswith("gfx11"):
        return "rdna3"
    return "unknown"


def arch_from_properties(props, is_hip: bool) -> ArchInfo:
    """Build an ArchInfo from ``torch.cuda.get_device_properties`` (or anything shaped like it)."""
    name = getattr(props, "name", "")
    if is_hip:
        gfx = str(getattr(props, "gcnArchName", "") or "").split(":")[0]
        family = amd_family(gfx)
        warp = 64 if family.startswith("cdna") else 32
        info = ArchInfo("amd", gfx or "gfx?", family, name, warp, _FAMILIES[family][0], family != "unknown")
    else:
        family = nvidia_family(props.major, props.minor)
        info = ArchInfo("nvidia", f"sm{props.major}{props.minor}", family, name, 32,
                        _FAMILIES[family][0], family != "unknown")
    if not info.known:
        logger.warning("[SageTriton] GPU %s (%s) is not in the architecture table; using safe defaults "
                       "(fp16 P·V, 1 pipeline stage). Please report it.", name, info.arch)
    return info


# The interpreter emulates fp8, so every path can be tested on a CPU.
CPU_ARCH = ArchInfo("cpu", "cpu", "cpu", "CPU (Triton interpreter)", 32, "e4m3fn", True)


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def detect_arch(device=None) -> ArchInfo:
    """ArchInfo for a torch device (default: the current GPU; CPU when there is none)."""
    import torch

    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if dev.type != "cuda":
        return CPU_ARCH
    props = torch.cuda.get_device_properties(dev)
    return arch_from_properties(props, is_hip=torch.version.hip is not None)


_device_archs: dict = {}


def arch_for_device(device) -> ArchInfo:
    """``detect_arch`` once per device for the whole process: the kernel API and every patched model
    ask on each call, and reading device properties is not free."""
    key = (device.type, device.index)
    info = _device_archs.get(key)
    if info is None:
        info = _device_archs[key] = detect_arch(device)
    return info


def tma_available() -> bool:
    """Host-side tensor descriptors exist in triton >= 3.4 (torch >= 2.8)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def pdl_available() -> bool:
    """Grid dependency control from Triton kernels (``gdc_wait``) exists in triton >= 3.4."""
    try:
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:
        return False
    return True


def default_config(arch: ArchInfo, head_dim: int = 128) -> KernelConfig:
    fp8, row = _FAMILIES.get(arch.family, _FAMILIES["unknown"])
    # The Q/K rotation on every GPU (2-6 % on the H200, outlier and massive-channel inputs 1.6-2.6x closer to
    # exact); not in the interpreter, whose tests compare against references built without it.
    cfg = KernelConfig(fp8_format=fp8, qk_rotation=arch.family != "cpu", **row)
    if cfg.use_tma and not tma_available():
        cfg = cfg.replace(use_tma=False)
    if cfg.pdl and not pdl_available():
        cfg = cfg.replace(pdl=False)
    if arch.family == "hopper" and head_dim <= 64:
        # No cap: ptxas picks 128 registers by itself (4 CTAs per SM). Half the matrix work per exp2,
        # so cuDNN wins up to longer sequences.
        cfg = cfg.replace(num_stages=3, min_seq_len=8192)
    elif arch.family == "hopper" and head_dim <= 128:
        # 168 registers = 3 CTAs of 4 warps per SM, the occupancy measured fastest on the H200; one
        # register more and only 2 CTAs fit, so the cap guards against other Triton versions' choices.
        # From 4,608 query tokens (Flux at 1024²) the Gluon kernel is faster (bench/NOTES.md, "Gluon
        # kernel length").
        cfg = cfg.replace(max_registers=168, shared_kv_min_len=4608)
    if arch.family in ("ada", "blackwell") and head_dim <= 64:
        # At head_dim 64 the 128x64/8 tile saves only 2-3 % of loop instructions on sm89/sm120 and
        # spills 8 bytes on sm89 under Triton 3.6 (ptxas aims at 128 registers): keep 64x64/4.
        cfg = cfg.replace(block_m=64, num_warps=4)
    if arch.family == "rdna3" and 64 < head_dim <= 128:
        # gfx1100, fp16 P·V: 64x64 spills 38-72 VGPRs at head_dim 128 (Triton 3.6 / 3.8), 64x32 none.
        cfg = cfg.replace(block_n=32)
    if head_dim > 128:
        # Keep the fp32 accumulator of a 256-wide head in registers.
        cfg = cfg.replace(block_m=64, block_n=32 if arch.vendor == "amd" else 64, num_warps=4,
                          num_stages=min(cfg.num_stages, 2))
    return cfg


def supported_choices(arch: ArchInfo) -> dict:
    """What this GPU can run for each user-visible choice, and why not where it cannot."""
    fp8_ok = arch.fp8 is not None
    return {
        "qk_quant_gran": {g: (True, "") for g in QK_QUANT_GRANS},
        "pv_precision": {
            "fp16": (True, ""),
            "fp8": (fp8_ok, "" if fp8_ok else f"{arch.arch} has no fp8 matrix instructions; fp8 → fp16 on this GPU"),
            "fp8+residual": (fp8_ok, "" if fp8_ok else f"{arch.arch} has no fp8 matrix instructions; "
                             "fp8+residual → fp16 on this GPU"),
            "int8": (True, ""),
        },
        "pv_accum_dtype": {a: (True, "") for a in PV_ACCUM_DTYPES},
        # The nodes' fallback choice: on RDNA4 torch SDPA's default path can abort the process.
        "fallback": {
            "auto": (True, ""),
            "sdpa": (arch.family != "rdna4",
                     "" if arch.family != "rdna4" else "SDPA's default path can hit a Composable Kernel assertion on "
                     "RDNA4; sdpa → math on this GPU unless install.py's probe found it safe"),
            "math": (True, ""),
        },
    }


def resolve_config(arch: ArchInfo, head_dim: int = 128, qk_quant_gran: Optional[str] = None,
                   pv_precision: Optional[str] = None, pv_accum_dtype: Optional[str] = None,
                   qk_rotation: Optional[bool] = None) -> tuple[KernelConfig, list[str]]:
    """Defaults for ``arch`` overridden by the user's choices.

    Returns the config and a list of human-readable downgrades (choices this GPU cannot run).
    Invalid names raise ValueError: that is a caller bug, not a hardware limit.
    """
    cfg = default_config(arch, head_dim)
    notes: list[str] = []
    for value, allowed, what in ((qk_quant_gran, QK_QUANT_GRANS, "qk_quant_gran"),
                                 (pv_precision, PV_PRECISIONS, "pv_precision"),
                                 (pv_accum_dtype, PV_ACCUM_DTYPES, "pv_accum_dtype")):
        if value is not None and value not in allowed:
            raise ValueError(f"{what}={value!r} is not one of {allowed}")
    if qk_quant_gran is not None:
        cfg = cfg.replace(qk_quant_gran=qk_quant_gran)
    if pv_precision is not None:
        ok, why = supported_choices(arch)["pv_precision"][pv_precision]
        if ok:
            cfg = cfg.with_pv_choice(pv_precision)
            if cfg.v_residual:
                cfg = cfg.replace(min_seq_len=cfg.min_seq_len * residual_crossover_factor(head_dim))
                if not cfg.use_tma:
                    # The second V tile lives in registers with mma/wmma/mfma: at 64 keys per tile the
                    # cross-compiled sm89/sm120/gfx1201 kernels spilled (18-58), at 32 none do.
                    cfg = cfg.replace(block_n=min(cfg.block_n, 32))
        else:
            cfg = cfg.replace(pv_precision="fp16")
            notes.append(why)
    if pv_accum_dtype is not None:
        cfg = cfg.replace(pv_accum_dtype=pv_accum_dtype)
    if arch.family == "rdna3" and cfg.pv_precision == "int8" and 64 < head_dim <= 128:
        cfg = cfg.replace(block_m=128, num_warps=8)  # gfx1100, INT8 P·V: spills least (29, 64x32/4: 74)
    if qk_rotation is not None:
        if not isinstance(qk_rotation, bool):
            raise ValueError(f"qk_rotation must be True, False or None, got {qk_rotation!r}")
        cfg = cfg.replace(qk_rotation=qk_rotation)
    if cfg.pv_precision == "fp8" and cfg.fp8_format is None:
        cfg = cfg.replace(fp8_format="e4m3fn")  # interpreter / unknown arch asked for fp8 explicitly
    if cfg.shared_kv_min_len and cfg.pv_precision not in ("fp8", "int8"):
        cfg = cfg.replace(shared_kv_min_len=0)  # the Gluon kernel has 8-bit P·V only (K scales per tile or per key)
    if cfg.pv_precision not in ("fp8", "int8") and cfg.max_registers:
        # The cap buys the fp8 kernel a third CTA per SM. 16-bit P·V tiles take 107 KB of shared
        # memory at head_dim 128, so two CTAs fit whatever the registers: a cap would only spill.
        cfg = cfg.replace(max_registers=0)
    return cfg, notes


# Sparse calls left to this GPU's P·V default run INT8 on Hopper: with it they meet comfy-kitchen's error within
# 0.55-0.61x its time at 32,760-103,950 tokens; FP8 (the dense default, 25 % faster there) does not meet the error
# on concentrated inputs (docs/RESULTS.md, "the sparse table").
def sparse_default_pv(arch: ArchInfo) -> Optional[str]:
    """The P·V precision a sparse call takes when its caller left it to the GPU: "int8" on Hopper, else None
    (the dense default)."""
    return "int8" if arch.family == "hopper" else None
