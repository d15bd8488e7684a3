"""What the user picked on the Sage Settings node, as plain data (no ComfyUI import).

"auto" means: let the architecture table decide. The resolved kernel configuration for one GPU
comes from ``kernels.arch.resolve_config``; this module only translates the node's choices.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...kernels.arch import PV_ACCUM_DTYPES, PV_PRECISIONS, QK_QUANT_GRANS
from ..backends.alt_backends import BACKENDS, DEFAULT_BACKEND
from .sparse_settings import SPARSE_OFF, SparseSettings

AUTO = "auto"
QK_QUANT_GRAN_CHOICES = (AUTO, *QK_QUANT_GRANS)
PV_PRECISION_CHOICES = (AUTO, *PV_PRECISIONS)
PV_ACCUM_DTYPE_CHOICES = (AUTO, *PV_ACCUM_DTYPES)
QK_ROTATION_CHOICES = (AUTO, "on", "off")
# auto: math-only SDPA on RDNA4, ComfyUI's own attention (or an earlier override) elsewhere.
FALLBACK_CHOICES = (AUTO, "sdpa", "math")

MIN_SEQ_LEN_MEASURED = -1  # use the per-arch crossover (measured by install.py, else the table)


@dataclass(frozen=True)
class SageSettings:
    qk_quant_gran: str = AUTO
    pv_precision: str = AUTO
    pv_accum_dtype: str = AUTO
    smooth_k: bool = True
    smooth_v: bool = False
    min_seq_len: int = MIN_SEQ_LEN_MEASURED
    fallback: str = AUTO
    full_precision_first_steps: int = 0
    full_precision_last_steps: int = 0
    qk_rotation: str = AUTO
    backend: str = DEFAULT_BACKEND  # another installed attention for the kernel's calls, to compare
    fast_rope: bool = True  # ComfyUI's RoPE before attention in the pack's kernel (``routing.rope_hooks``)
    sparse: SparseSettings = SPARSE_OFF  # block-sparse attention for long self-attention (``routing.sparse_calls``)

    def __post_init__(self):
        for name, allowed in (("qk_quant_gran", QK_QUANT_GRAN_CHOICES), ("pv_precision", PV_PRECISION_CHOICES),
                              ("pv_accum_dtype", PV_ACCUM_DTYPE_CHOICES), ("fallback", FALLBACK_CHOICES),
                              ("qk_rotation", QK_ROTATION_CHOICES), ("backend", BACKENDS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"Sage Settings: {name}={value!r} is not one of {', '.join(allowed)}")
        for name in ("smooth_k", "smooth_v", "fast_rope"):  # "false" would read as true
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Sage Settings: {name} must be True or False, got {getattr(self, name)!r}")
        if self.min_seq_len < MIN_SEQ_LEN_MEASURED:
            raise ValueError(f"Sage Settings: min_seq_len must be -1, 0 or a positive length, got {self.min_seq_len}")
        for name in ("full_precision_first_steps", "full_precision_last_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"Sage Settings: {name} must be >= 0, got {getattr(self, name)}")
        if not isinstance(self.sparse, SparseSettings):
            raise ValueError(f"Sage Settings: sparse must be SparseSettings, got {type(self.sparse).__name__}")

    def explicit_kernel_choices(self) -> dict:
        """The kernel options for ``resolve_config``: None where the user left "auto"."""
        choices: dict = {name: (None if getattr(self, name) == AUTO else getattr(self, name))
                         for name in ("qk_quant_gran", "pv_precision", "pv_accum_dtype")}
        choices["qk_rotation"] = None if self.qk_rotation == AUTO else self.qk_rotation == "on"
        return choices

    def replace(self, **kw) -> SageSettings:
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


DEFAULT_SETTINGS = SageSettings()
