"""What install.py's self-test measured on this GPU, as the dispatcher needs it; the one module of ``nodes/``
that imports ``installer/`` (the installer measures and writes, the runtime reads, and starts the background
setup through ``start_background_setup``).

Reads ``installer.report``; every question has a safe answer without a report (table crossover,
no variant known to fail, SDPA's default path not known to be safe), and a broken report gives those.
"""
from __future__ import annotations

from typing import Optional

from ...installer import report

# Names the planner and ``/sage/status`` read from the installer, through this module only.
from ...installer.report import CROSSOVER_BATCH, CROSSOVER_HEADS, display_path, dumps, pack_version, report_key
from ...kernels.arch import ArchInfo, KernelConfig
from ...kernels.log import logger


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

    def rope_kernel_failed(self, arch: ArchInfo) -> bool:
        return False

    def refresh(self) -> None:
        """Look again for a report replaced or deleted since it was read (once per sampling run)."""

    def generation(self) -> int:
        """Changes when the answers may have changed: decisions made from them are then made again."""
        return 0

    def pv_choice(self, arch: ArchInfo, head_dim: int) -> Optional[tuple]:
        """(P·V precision, {precision: ms}) install.py timed fastest here, or None."""
        return None


def _safely(fn, *args):
    """``fn(*args)``, or None when the report is broken or stale: it must never break sampling."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        logger.debug("[SageTriton] self-test report unusable (%s: %s)", getattr(fn, "__name__", fn), e)
        return None


def _length(value) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**31:
        raise ValueError(f"crossover {value!r} is not a key length")
    return int(value)


class InstallReport(NoReport):
    """The report written by install.py (or the first start) for the running GPU."""

    def crossover(self, arch, cfg, head_dim: int = 128):
        # int() inside the guard: a tampered value must give the table default, not fail every call
        return _safely(lambda: _length(report.crossover_for(arch, cfg, head_dim)))

    def variant_failed(self, arch, cfg):
        return bool(_safely(report.is_variant_disabled, cfg, arch))

    def sdpa_default_safe(self, arch):
        return _safely(report.sdpa_default_safe, arch)

    def long_sequence_kernel_failed(self, arch):
        return bool(_safely(report.long_sequence_kernel_failed, arch))

    def rope_kernel_failed(self, arch):
        return bool(_safely(report.rope_kernel_failed, arch))

    def refresh(self) -> None:
        _safely(report.check_for_changes)

    generation = staticmethod(report.generation)  # read on every attention call: no extra frame

    def pv_choice(self, arch, head_dim):
        return _safely(report.measured_pv_choice, arch, head_dim)


# For ``/sage/status`` (``reporting.status_route``): the running GPU's report as read, and the setup's state.
def current_report(arch: ArchInfo) -> Optional[dict]:
    return report.current_report(arch)


def current_report_path(arch: ArchInfo):
    return report.current_report_path(arch)


def current_report_problem(arch: ArchInfo) -> Optional[str]:
    return report.current_report_problem(arch)


def report_generation() -> int:
    return report.generation()


__all__ = ["CROSSOVER_BATCH", "CROSSOVER_HEADS", "NoReport", "InstallReport", "current_report", "current_report_path",
           "current_report_problem", "report_generation", "report_key", "display_path", "dumps", "pack_version",
           "setup_status", "start_background_setup"]


def setup_status() -> dict:
    """The first-start self-test's state (``installer.firststart``, imported when first asked)."""
    from ...installer.firststart import setup_status as status

    return status()


def start_background_setup(**kwargs) -> None:
    """Start the one-time background self-test (``installer.firststart.start_background_setup``)."""
    from ...installer.firststart import start_background_setup as start

    start(**kwargs)
