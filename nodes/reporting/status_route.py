"""``GET /sage/status`` (ComfyUI mirrors it as ``/api/sage/status``): what SageTriton does on this machine.

``status_payload()`` is a plain function (tested without a server); ``register_routes()`` attaches
it to ComfyUI's ``PromptServer`` and is a no-op when there is none (tests importing the pack).
"""
from __future__ import annotations

from ...kernels.log import logger


def comfy_device():
    """The device ComfyUI computes on (``--cpu`` makes it the CPU even when a GPU exists)."""
    try:
        import comfy.model_management as mm

        return mm.get_torch_device()
    except Exception:  # noqa: BLE001 - outside ComfyUI: let detect_arch pick
        return None


def _versions() -> dict:
    from ..config.install_report import pack_version

    out = {"pack": pack_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["hip"] = getattr(torch.version, "hip", None)
        out["cuda"] = getattr(torch.version, "cuda", None)
    except Exception:  # noqa: BLE001
        pass
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        out["triton"] = None
    return out


def status_payload(device=None) -> dict:
    from ...kernels.arch import default_config, detect_arch, interpreter_enabled, supported_choices
    from ..backends.alt_backends import backend_choices
    from ..config import install_report as rep
    from ..config.install_report import setup_status
    from ..config.planner import unconfigured_plan
    from . import stats
    from .panel_text import mark_choices, status_panel

    if device is None:
        device = comfy_device()
    arch = detect_arch(device)
    r = rep.current_report(arch)
    kernel_active = arch.vendor != "cpu" or interpreter_enabled()
    plan = unconfigured_plan(arch, 128)  # the same planning the dispatcher does, most models' head size
    where = rep.current_report_path(arch)
    payload = {
        "device": str(device) if device is not None else ("cuda" if arch.vendor != "cpu" else "cpu"),
        "gpu": arch.name,
        "arch": arch.arch,
        "family": arch.family,
        "vendor": arch.vendor,
        "known_arch": arch.known,
        "kernel_active": kernel_active,
        "note": "" if kernel_active else "no GPU: SageTriton leaves ComfyUI's attention in place",
        "defaults": {str(d): default_config(arch, d).as_dict() for d in (64, 128, 256)},
        "supported_choices": mark_choices({k: {c: {"ok": ok, "why": why} for c, (ok, why) in v.items()}
                                           for k, v in supported_choices(arch).items()}),
        "backends": backend_choices(arch.vendor),  # Sage Settings' backend: which can run here, what runs instead
        "variants": (r or {}).get("variants", {}),
        "disabled_variants": (r or {}).get("disabled_variants", []),
        "crossover": (r or {}).get("crossover"),
        "long_sequence_kernel": (r or {}).get("long_sequence_kernel"),  # Hopper's Gluon kernel: self-test
        "pv_choice": (r or {}).get("pv_choice"),  # install.py's fp8 vs int8 P·V timing
        "pv_source": plan.pv_source,
        "min_seq_len_resolved": plan.min_seq_len,
        "sdpa_default_safe": (r or {}).get("sdpa_default_safe"),
        # The file it was read from (pack folder, then user cache), without the absolute install path.
        "report": {"found": r is not None, "created": (r or {}).get("created"),
                   "path": None if where is None else rep.display_path(where),
                   "mode": (r or {}).get("mode"), "key": rep.report_key(arch),
                   # an invalid report is ignored (table defaults) and rewritten by the next start or install.py
                   "invalid": rep.current_report_problem(arch),
                   "complete": (r or {}).get("complete"), "attempts": (r or {}).get("attempts")},
        "setup": setup_status(),
        "versions": _versions(),
        "stats": stats.attention_stats(),
        "last_run": stats.last_run(),
        "runs_by_node": stats.runs_by_node(),
    }
    payload["panel"] = status_panel(payload)  # the lines the nodes show (web/sagetriton.js draws them as sent)
    return payload


SETUP_EVENT = "sagetriton.setup"  # websocket event with ``setup_status()`` while the first-start self-test runs


def notify_setup(state: dict) -> None:
    """Push the background self-test's progress to open browser tabs (called from its thread)."""
    from server import PromptServer

    PromptServer.instance.send_sync(SETUP_EVENT, state)


def attach_to_server() -> None:
    """Inside a running ComfyUI server: serve ``/sage/status`` and start the one-time background self-test."""
    from ..config.install_report import start_background_setup

    if register_routes():  # not when tests import the pack
        start_background_setup(device_fn=comfy_device, notify=notify_setup)


def register_routes() -> bool:
    """Attach ``/sage/status`` to ComfyUI's server. Returns False when there is no server to attach to."""
    try:
        from server import PromptServer
    except ImportError:
        return False
    instance = getattr(PromptServer, "instance", None)
    if instance is None:
        return False
    from aiohttp import web

    @instance.routes.get("/sage/status")
    async def sage_status(request):
        import asyncio

        try:
            # Off the event loop: reading the report is file I/O, which must never stall the server.
            payload = await asyncio.get_running_loop().run_in_executor(None, status_payload)
            return web.json_response(payload, dumps=_dumps)
        except Exception as e:  # noqa: BLE001 - a status page must answer, even about its own failure
            logger.warning("[SageTriton] /sage/status failed: %s: %s", type(e).__name__, e)
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=500)

    return True


def _dumps(obj) -> str:
    from ..config.install_report import dumps

    return dumps(obj)  # strict JSON: no NaN/Infinity, which the browser cannot parse
