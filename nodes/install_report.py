"""What install.py's self-test measured on this GPU, as the dispatcher needs it.

Reads ``kernels.report`` when it exists (it may not, in an older or partial install); every
question has a safe answer without a report: table crossover, no variant known to fail, SDPA's
default path not known to be safe.
"""
from __future__ import annotations

from typing import Optional

from ..kernels.arch import ArchInfo, KernelConfig
from ..kernels.log import logger


class NoReport:
    """Answers when there is no self-test report (also the answers the tests start from)."""

    def crossover(self, arch: ArchInfo, cfg: KernelConfig, head_dim: int = 128) -> Optional[int]:
        return None

    def variant_failed(self, arch: ArchInfo, cfg: KernelConfig) -> bool:
        return False

    def sdpa_default_safe(self, arch: ArchInfo) -> Optional[bool]:
        return None

    def long_sequence_kernel_failed(self, arch: ArchInfo) -> bool:
        return False


class InstallReport(NoReport):
    """The report written by install.py (or the first start) for the running GPU."""

    def _ask(self, name: str, *args):
        try:
            from ..kernels import report
        except ImportError:
            return None
        fn = getattr(report, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception as e:  # a broken or stale report must never break sampling
            logger.debug("[SageTriton] self-test report unusable (%s: %s)", name, e)
            return None

    def crossover(self, arch, cfg, head_dim: int = 128):
        value = self._ask("crossover_for", arch, cfg, head_dim)
        return None if value is None else int(value)

    def variant_failed(self, arch, cfg):
        return bool(self._ask("is_variant_disabled", cfg, arch))

    def sdpa_default_safe(self, arch):
        return self._ask("sdpa_default_safe", arch)

    def long_sequence_kernel_failed(self, arch):
        return bool(self._ask("long_sequence_kernel_failed", arch))
