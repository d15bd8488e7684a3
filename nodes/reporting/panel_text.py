"""The lines the nodes' info panel shows (web/sagetriton.js draws them as sent; web/sage_format.mjs only picks
which list a node shows): the one place their words live.

``status_panel(status)`` is the /sage/status payload's ``panel``; ``run_lines(summary)`` a run summary's
``lines`` (``run_summary.finish_run``: the RUN_EVENT, ``stats.last_run()``, ``runs_by_node``);
``run_alerts(summary)`` its ``alerts``, the toasts a run is worth. Plain dicts in, strings out.
"""
from __future__ import annotations

from typing import Optional

from .reasons import Reason, reason_of
from .sparse_summary import CORE_SPARSE

WARN = "⚠ "  # a warning line: the panel draws it amber
NOT_RUN = "last run: none yet"  # a Patch node that has not run (never another node's or workflow's run)
NO_KERNEL_LINE = "no GPU: ComfyUI's own attention runs"
TOP_REASONS = 3


def short_reason(value: str, why: str) -> str:
    """The visible part of a reason: "sm80 has no fp8 ...; fp8 → fp16 on this GPU" -> "fp8 → fp16 on this GPU"."""
    arrow = next((s.strip() for s in str(why).split(";") if "→" in s), None)
    return arrow or (f"{value} not supported on this GPU" if value else str(why))


def resolved_defaults(status: dict) -> Optional[dict]:
    """The defaults an unconfigured node runs; keyed by head_dim, most models attend with 128-wide heads."""
    d = status.get("defaults")
    if not isinstance(d, dict) or not d:
        return None
    if "qk_quant_gran" in d:
        return d
    return d.get("128", next(iter(d.values())))


def arch_label(status: dict) -> str:
    parts = ["SageTriton", status.get("arch") or "?"]
    family = status.get("family") or (status.get("defaults") or {}).get("family")
    if family and family != status.get("arch"):
        parts.append(family)
    if status.get("vendor") and status["vendor"] != "cpu":
        parts.append(status["vendor"].upper())
    return " · ".join(parts)


def defaults_line(status: dict) -> str:
    """Short, to keep the nodes narrow: "defaults: QK per_warp · PV fp8 · fp32 acc"."""
    d = resolved_defaults(status)
    if not d:
        return "defaults: not reported yet"
    parts = [f"QK {d.get('qk_quant_gran') or '?'}", f"PV {d.get('pv_precision') or '?'}"]
    if d.get("pv_accum_dtype"):
        parts.append(f"{d['pv_accum_dtype']} acc")
    return "defaults: " + " · ".join(parts)


def seq_line(status: dict) -> Optional[str]:
    """From which key length the kernel runs (shorter keys go to the fallback: quantization overhead wins there)."""
    if status.get("kernel_active") is False:  # no GPU (or --cpu): the patch changes nothing
        return NO_KERNEL_LINE
    n = status.get("crossover")  # measured on this GPU; the table default until measured
    if isinstance(n, dict):
        n = n.get("seq_len", n.get("128"))
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        n = (resolved_defaults(status) or {}).get("min_seq_len")
    if n is None:
        return None
    return "kernel at any sequence length" if float(n) <= 0 else f"kernel from {n} tokens"


def setup_line(status: dict) -> Optional[str]:
    """The first start's build + self-test: a line while it runs or if it failed; nothing otherwise."""
    setup = status.get("setup") or {}
    if setup.get("phase") == "failed":
        return f"{WARN}self-test failed: {setup.get('message') or 'see the server log'}"
    if setup.get("phase") != "running":
        return None
    progress = setup.get("progress") or {}
    if progress.get("total"):
        return f"⏳ building and testing kernels {progress.get('done') or 0}/{progress['total']}"
    return "⏳ building and testing kernels"


def report_line(status: dict) -> Optional[str]:
    """A report the pack ignored as invalid (tampered, half-written): table defaults until it is redone."""
    why = (status.get("report") or {}).get("invalid")
    return f"{WARN}self-test report ignored ({why}); table defaults until it is redone" if why else None


def mark_choices(choices: dict) -> dict:
    """``supported_choices`` with a ``short`` reason on every choice this GPU cannot run (the widget's mark)."""
    return {option: {value: ({**entry, "short": short_reason(value, entry.get("why", ""))}
                             if entry.get("ok") is False else entry) for value, entry in values.items()}
            for option, values in choices.items()}


def status_panel(status: dict) -> dict:
    """The /sage/status payload's ``panel``: ``lines`` on every node, ``settings`` under them on Sage Settings
    (choices this GPU cannot run), ``backend`` the line for a selected backend that cannot run here, ``not_run``
    a Patch node's lines until it has run (then the run summary's ``lines``); ``choices_title`` heads the
    reasons in a marked widget's tooltip."""
    lines = [arch_label(status), defaults_line(status)]
    lines += [x for x in (seq_line(status), setup_line(status), report_line(status)) if x]
    settings = [WARN + entry.get("short", short_reason(value, entry.get("why", "")))
                for values in (status.get("supported_choices") or {}).values()
                for value, entry in values.items() if entry.get("ok") is False]
    backend = {name: WARN + b["short"] for name, b in (status.get("backends") or {}).items() if b.get("ok") is False}
    return {"lines": lines, "settings": settings, "backend": backend, "not_run": [NOT_RUN],
            "choices_title": f"On this GPU ({status.get('arch') or '?'}):"}


def fallback_line(replaced: str, fallback_backend: Optional[str], sep: str = " · ") -> str:
    """What runs the calls the kernel does not take (and what the patch took over from, if another).
    Never "replaced": with no GPU every call runs on ComfyUI's own attention, as the start log says."""
    if fallback_backend and fallback_backend != replaced:
        return f"took over from {replaced}{sep}fallbacks on {fallback_backend}"
    return f"fallbacks run on {replaced}"


def sparse_lines(sparse: Optional[dict], top: int = TOP_REASONS) -> list:
    """Sparse attention's part of a run: its calls and density, the calls it left dense by reason, its notes."""
    if not sparse:
        return []
    if sparse.get("off"):
        return [WARN + sparse["off"]]
    density = sparse.get("density")
    exact = f" · {density * 100:.1f} % blocks exact" if isinstance(density, (int, float)) else ""
    lines = [f"sparse {sparse.get('mode')}: {sparse.get('calls') or 0} calls{exact}"]
    dense = sorted((sparse.get("dense") or {}).items(), key=lambda kv: -kv[1])
    if dense:
        shown = " · ".join(f"{n}× {why}" for why, n in dense[:top])
        lines.append(f"left dense: {shown}" + (f" · +{len(dense) - top} more" if len(dense) > top else ""))
    return lines + [WARN + note for note in sparse.get("notes") or ()]


def outer_line(outer: Optional[dict]) -> Optional[str]:
    """Another node's attention override on top of this patch's: who ran the calls; a warning when ours ran none."""
    if not outer:
        return None
    calls = "?" if outer.get("calls") is None else outer["calls"]
    if outer.get("ours_unused"):
        if outer.get("label") == CORE_SPARSE:
            return f"{outer['label']} ran all {calls} calls"
        return f"{WARN}not running: {outer.get('label')} replaced it"
    ran = "?" if outer.get("ran_itself") is None else outer["ran_itself"]
    return f"{outer.get('label')}: {ran} calls · {outer.get('reached')} to SageTriton"


def run_lines(run: Optional[dict], top: int = TOP_REASONS) -> list:
    """["last run: 120 kernel · 8 fallback", "6× key length < 4096", ...]: the top fallback reasons one a line
    (they are sentences), then the downgrade notes."""
    if not run:
        return [NOT_RUN]
    fallback = sorted((run.get("fallback") or {}).items(), key=lambda kv: -kv[1])
    lines = [f"last run: {run.get('kernel') or 0} kernel · {sum(int(n) for _, n in fallback)} fallback"]
    if run.get("backend") and run["backend"] != "SageTriton":
        lines.append(f"kernel calls on {run['backend']} (Sage Settings)")
    if run.get("rope"):
        lines.append(f"RoPE: {run['rope']} calls on SageTriton's kernel")
    elif run.get("rope_off"):
        lines.append("RoPE: ComfyUI's, compiled by torch.compile")
    lines += sparse_lines(run.get("sparse"))
    outer = outer_line(run.get("outer"))
    if outer:
        lines.append(outer)
    if run.get("replaced"):
        lines.append(fallback_line(run["replaced"], run.get("fallback_backend")))
    lines += [f"{n}× {why}" for why, n in fallback[:top]]
    if len(fallback) > top:
        lines.append(f"+{len(fallback) - top} more fallback reasons")
    return lines + [WARN + short_reason("", note) for note in run.get("notes") or ()]


# The reasons worth a toast: a kernel that failed here (ordinary fallbacks show on the node only).
KERNEL_FAULTS = frozenset({Reason.VARIANT_DISABLED, Reason.SPARSE_FAILED})


def run_alerts(run: dict) -> list:
    """The toasts a run is worth, each said once a browser session (``key``): downgraded settings, and kernel
    failures (ordinary fallbacks are shown on the node)."""
    alerts = [{"key": note, "severity": "info", "summary": "SageTriton settings adjusted", "detail": note}
              for note in run.get("notes") or ()]
    return alerts + [{"key": reason, "severity": "warn", "summary": "SageTriton fell back",
                      "detail": f"Attention fell back to ComfyUI's: {reason}. See the server log."}
                     for reason in run.get("fallback") or {} if reason_of(reason) in KERNEL_FAULTS]
