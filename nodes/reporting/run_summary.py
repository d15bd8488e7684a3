"""Per-run summary: reset the tally when sampling starts, report it when sampling ends.

The report is one log line, ``stats.last_run()`` (read by the /sage/status route and the UI) and a
RUN_EVENT to the browser, whose panel on the patch node then shows it.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Optional

from ...kernels import replay
from ...kernels.log import logger
from ..backends.preferred_attention import describe
from .panel_text import fallback_line, run_alerts, run_lines
from .reasons import TOO_SHORT, reason_of
from .sparse_summary import outer_text, sparse_and_outer, sparse_text
from .stats import RunTally, set_last_run

if TYPE_CHECKING:  # annotations only: routing imports reporting (stats), not the other way round
    from ..config.planner import KernelPlan
    from ..routing.dispatch import PatchState

WRAPPER_KEY = "sagetriton_run_summary"


def describe_plan(plan: Optional[KernelPlan]) -> str:
    if plan is None or plan.config is None:
        return "kernel config not resolved (no call reached the kernel checks)"
    cfg = plan.config
    pv = cfg.pv_choice() + (f"({cfg.fp8_format})" if cfg.pv_precision == "fp8" else "")
    qk = cfg.qk_quant_gran + (" rotated" if cfg.qk_rotation else "")
    text = f"{qk} QK, {pv} PV, {cfg.pv_accum_dtype} accum, min_seq_len {plan.min_seq_len} on {plan.arch.arch}"
    return f"{text} ({plan.pv_source})" if plan.pv_source else text


def build_summary(state: PatchState, run: RunTally) -> dict:
    plan = state.last_plan
    cfg, arch = (plan.config, plan.arch) if plan is not None else (None, None)
    return {
        "kernel": run.kernel,
        "fallback": dict(run.fallback.most_common()),
        "fallback_total": run.fallback_total,
        "passed_through": run.passed_through,
        "rope": run.rope,
        "rope_off": rope_off(state, run),
        "arch": arch.arch if arch is not None else None,
        "config": cfg.as_dict() if cfg is not None else None,
        "config_text": describe_plan(plan),
        "settings": state.settings.as_dict(),
        "notes": [*state.composition.get("notes", []), *state.planner.notes],  # an unavailable backend first
        "node_id": state.node_id,
        "replaced": state.composition.get("replaced"),
        "fallback_backend": state.composition.get("fallback"),
        "backend": state.composition.get("backend", "SageTriton"),
        "preferred_overridden": state.composition.get("preferred") or {},
        **sparse_and_outer(state, run),
    }


ROPE_COMPILED = ("ComfyUI's, compiled with the model by torch.compile (SageTriton's RoPE kernel runs in "
                 "uncompiled forwards)")


def rope_off(state: PatchState, run: RunTally) -> Optional[str]:
    """Why a run with fast_rope on had no RoPE call on the kernel, where that is not the model's doing."""
    if run.rope or not state.settings.fast_rope or not state.rope_compiled:
        return None
    return ROPE_COMPILED


UNPATCH_HINT = ("no call was long enough for the kernel: this model gains nothing from the patch (after the "
                "first forward of each shape its forwards run on ComfyUI's attention untouched)")


def unpatch_hint(summary: dict) -> Optional[str]:
    """A hint to leave the model unpatched, when every call of the run was too short for the kernel."""
    reasons = summary["fallback"]
    if summary["kernel"] or not reasons or summary.get("backend", "SageTriton") != "SageTriton":
        return None
    return UNPATCH_HINT if all(reason_of(r) in TOO_SHORT for r in reasons) else None


def fallback_text(replaced: str, fallback_backend: Optional[str]) -> str:
    """The log line's words for what runs the fallbacks; the panel's line is the same with " · "."""
    return fallback_line(replaced, fallback_backend, sep=", ")


def passed_through_text(summary: dict) -> str:
    """Why forwards ran without the override (``forward_plan``): their calls all went to ComfyUI's attention."""
    n = summary["passed_through"]
    reasons = summary["fallback"]
    why = ("every call shorter than the crossover" if reasons and all(reason_of(r) in TOO_SHORT for r in reasons)
           else "every call went to ComfyUI's attention")
    return f"{n} forward{'s' if n != 1 else ''} passed through whole ({why}; no per-call cost)"


def format_summary(summary: dict) -> str:
    """One human line: kernel vs fallback calls, reasons by count, the resolved configuration."""
    total = summary["kernel"] + summary["fallback_total"]
    reasons = ", ".join(f"{r}: {n}" for r, n in summary["fallback"].items())
    backend = summary.get("backend") or "SageTriton"
    text = (f"attention: {summary['kernel']}/{total} calls on the {backend} kernel, "
            f"{summary['fallback_total']} fallback")
    if reasons:
        text += f" ({reasons})"
    if summary.get("passed_through"):
        text += f"; {passed_through_text(summary)}"
    if summary.get("rope"):
        text += f"; RoPE: {summary['rope']} calls on SageTriton's kernel"
    elif summary.get("rope_off"):
        text += f"; RoPE: {summary['rope_off']}"
    if backend == "SageTriton":  # the kernel config says nothing about another backend's calls
        text += f"; {summary['config_text']}"
    if summary.get("replaced"):
        text += "; " + fallback_text(summary["replaced"], summary.get("fallback_backend"))
    if summary.get("sparse"):
        text += f"; {sparse_text(summary['sparse'])}"
    if summary.get("outer"):
        text += f"; {outer_text(summary['outer'])}"
    if summary.get("preferred_overridden"):
        text += f"; overrode the checkpoint's preferred attention of {describe(summary['preferred_overridden'])}"
    if summary["notes"]:
        text += "; " + "; ".join(summary["notes"])
    hint = unpatch_hint(summary)
    if hint:
        text += f"; {hint}"
    return text


# Tells the browser tab that queued the prompt which Patch node ran; the node's panel then shows that
# run (web/sagetriton.js). Not ComfyUI's progress text: the frontend would show it a second time,
# raw and cut off, in a text box under the panel.
RUN_EVENT = "sagetriton.run"


def notify_browser(node_id: Optional[str], lines: Optional[list] = None) -> bool:
    """Send RUN_EVENT for node ``node_id`` with its panel ``lines``, if a ComfyUI server runs in this process."""
    server = sys.modules.get("server")  # never import it ourselves: no server means nothing to tell
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    if instance is None or node_id is None or not hasattr(instance, "send_sync"):
        return False
    try:
        instance.send_sync(RUN_EVENT, {"node": str(node_id), "lines": list(lines or ())},
                           getattr(instance, "client_id", None))
    except Exception as e:  # a UI message must never fail a run
        logger.debug("[SageTriton] run event not sent: %s", e)
        return False
    return True


def finish_run(state: PatchState) -> Optional[dict]:
    replay.clear(this_thread=True)  # reused buffers live for a sampling run (its thread's), not between runs
    run = state.runs.end()
    if run is None:
        return None
    summary = build_summary(state, run)
    text = format_summary(summary)
    summary["text"] = text
    summary["lines"] = run_lines(summary)  # the panel's (web/sagetriton.js draws them as sent)
    summary["alerts"] = run_alerts(summary)
    set_last_run(summary)
    logger.info("[SageTriton] %s", text)
    notify_browser(state.node_id, summary["lines"])
    return summary


def make_outer_sample_wrapper(state: PatchState) -> Callable:
    """A WrappersMP.OUTER_SAMPLE wrapper: one sampling run between its start and its end."""

    def sagetriton_outer_sample(executor, *args, **kwargs):
        state.begin_run()
        try:
            return executor(*args, **kwargs)
        finally:
            finish_run(state)

    return sagetriton_outer_sample
