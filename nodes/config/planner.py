"""Which kernel config a patched model runs per (GPU, head size), and from which call size.

One ``KernelPlan`` per (arch, head_dim): the user's choices resolved against the arch table, replaced
where install.py's self-test turned a variant or the long-sequence kernel off, and the key length and
work per call from which the kernel takes a call. ``/sage/status`` shows the same plan, so the
crossover rule lives here only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ...kernels.arch import ArchInfo, KernelConfig, resolve_config, sparse_default_pv
from ...kernels.log import logger
from .install_report import CROSSOVER_BATCH, CROSSOVER_HEADS, NoReport
from .settings import DEFAULT_SETTINGS, MIN_SEQ_LEN_MEASURED, SageSettings

# The crossover is where the kernel beat SDPA at this many batch x heads; calls with less work are
# outside what was measured (SDXL's 2 x 10 heads at 4,096 tokens ran 10 % slower, bench/NOTES.md).
CROSSOVER_CALL_HEADS = CROSSOVER_BATCH * CROSSOVER_HEADS


@dataclass(frozen=True)
class KernelPlan:
    arch: ArchInfo
    head_dim: int
    config: Optional[KernelConfig]  # None: no variant passed the install self-test
    min_seq_len: int  # key length from which the kernel takes a call
    # Lq x Lk x batch x heads from which it does (0: any); only for the measured crossover.
    min_work: int = 0
    # Where the P·V precision came from, when install.py's timing picked it (shown on the node).
    pv_source: str = ""

    @property
    def min_work_text(self) -> str:
        return f"{CROSSOVER_CALL_HEADS} x {self.min_seq_len}²"


class KernelPlanner:
    """Resolves and caches a ``KernelPlan`` per (arch, head_dim); logs each downgrade once."""

    def __init__(self, settings: SageSettings = DEFAULT_SETTINGS, report: Optional[NoReport] = None) -> None:
        self.settings = settings
        self.report = report or NoReport()
        self.notes: list[str] = []  # downgrades, shown once and in every run summary
        self._plans: dict[tuple, KernelPlan] = {}
        self._generation: Optional[int] = None  # of the report the plans were made from (``fresh_plan``)

    def fresh_plan(self, arch: ArchInfo, head_dim: int) -> KernelPlan:
        """``plan``, made again if install.py's report changed since (the dispatcher does this check inline,
        with its call cache's)."""
        generation = self.report.generation()
        if generation != self._generation:
            self._generation = generation
            self.forget()
        return self.plan(arch, head_dim)

    def plan(self, arch: ArchInfo, head_dim: int) -> KernelPlan:
        key = (arch, head_dim)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._resolve(arch, head_dim)
        return plan

    def sparse_plan(self, arch: ArchInfo, head_dim: int) -> KernelPlan:
        """The plan a sparse call runs: the dense plan, with the P·V precision sparse calls
        default to on this GPU (``arch.sparse_default_pv``) where the user left P·V on auto and that variant
        passed install.py's self-test."""
        plan = self.plan(arch, head_dim)
        choices = self.settings.explicit_kernel_choices()
        pv = sparse_default_pv(arch) if choices["pv_precision"] is None else None
        if pv is None or plan.config is None or plan.config.pv_choice() == pv:
            return plan
        key = (arch, head_dim, "sparse", pv)
        sparse = self._plans.get(key)
        if sparse is None:
            cfg, notes = resolve_config(arch, head_dim, **{**choices, "pv_precision": pv})
            usable = cfg is not None and not notes and not self.report.variant_failed(arch, cfg)
            sparse = self._plans[key] = dataclasses.replace(plan, config=cfg, pv_source="") if usable else plan
        return sparse

    def forget(self) -> None:
        """Resolve plans again on their next use (install.py's report changed); notes stay, logged once."""
        self._plans.clear()

    def _resolve(self, arch: ArchInfo, head_dim: int) -> KernelPlan:
        choices = self.settings.explicit_kernel_choices()
        cfg, notes = resolve_config(arch, head_dim, **choices)
        pv_source = ""
        measured = self.report.pv_choice(arch, head_dim) if choices["pv_precision"] is None else None
        if measured is not None and measured[0] != cfg.pv_choice():
            timed, notes_pv = resolve_config(arch, head_dim, **{**choices, "pv_precision": measured[0]})
            if not notes_pv and not self.report.variant_failed(arch, timed):
                cfg = timed
        if measured is not None and cfg.pv_choice() == measured[0]:
            pv_source = "P·V timed by install.py: " + ", ".join(f"{pv} {ms:.2f} ms" for pv, ms in measured[1].items())
        if self.report.variant_failed(arch, cfg):
            cfg, note = self._working_variant(arch, cfg)
            notes.append(note)
        if cfg is not None and cfg.shared_kv_min_len and self.report.long_sequence_kernel_failed(arch):
            cfg = cfg.replace(shared_kv_min_len=0)
            notes.append(f"the long-sequence (Gluon) kernel failed the install self-test on {arch.arch}; "
                         "the portable kernel serves every call")
        for note in notes:
            self._note(note)
        if cfg is None:
            return KernelPlan(arch, head_dim, None, 0)
        if self.settings.min_seq_len != MIN_SEQ_LEN_MEASURED:  # the user's length, taken as given
            return KernelPlan(arch, head_dim, cfg, self.settings.min_seq_len, pv_source=pv_source)
        cross = self.report.crossover(arch, cfg, head_dim)
        min_len = cfg.min_seq_len if cross is None else int(cross)
        return KernelPlan(arch, head_dim, cfg, min_len, CROSSOVER_CALL_HEADS * min_len * min_len, pv_source)

    def _working_variant(self, arch: ArchInfo, cfg: KernelConfig) -> tuple[Optional[KernelConfig], str]:
        """The closest variant that passed the install self-test, safest choices first."""
        name = f"{cfg.qk_quant_gran}/{cfg.pv_choice()}/{cfg.pv_accum_dtype}"
        failed = f"kernel variant {name} failed the install self-test on {arch.arch}"
        for gran in dict.fromkeys((cfg.qk_quant_gran, "per_warp", "per_thread", "per_block")):
            for pv in dict.fromkeys((cfg.pv_choice(), "fp16")):
                for acc in dict.fromkeys((cfg.pv_accum_dtype, "fp32")):
                    alt = cfg.with_pv_choice(pv).replace(qk_quant_gran=gran, pv_accum_dtype=acc)
                    if alt != cfg and not self.report.variant_failed(arch, alt):
                        return alt, f"{failed}; using {gran}/{pv}/{acc}"
        return None, f"{failed}, and so did every fallback variant"

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)
            logger.warning("[SageTriton] %s.", note)


_unconfigured: Optional[KernelPlanner] = None


def unconfigured_plan(arch: ArchInfo, head_dim: int = 128) -> KernelPlan:
    """What a Patch node without Sage Settings runs (``/sage/status``): one planner for every request, so a
    downgrade is logged once, not per GET."""
    global _unconfigured
    if _unconfigured is None:
        from .install_report import InstallReport

        _unconfigured = KernelPlanner(report=InstallReport())
    return _unconfigured.fresh_plan(arch, head_dim)
