"""Build + self-test once per (pack, torch, triton, GPU), from install.py or lazily on first start.

The GPU work runs in a worker child process (``install.py --worker``): a driver fault or a
GPU-side assertion in a freshly built kernel kills the worker, not install.py or ComfyUI. The
worker writes its progress to a JSON file after every step; when it dies, the supervisor marks
the step it was on as crashed (that variant is turned off) and starts a new worker that resumes
after it. The compiled kernels land in Triton's disk cache, so the runtime's first call is fast.

Inside ComfyUI, ``start_background_setup()`` does the same from a daemon thread, after start-up and
off the request path; it never raises and never blocks.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ..kernels.arch import CPU_ARCH, ArchInfo
from ..kernels.log import logger
from .childproc import ChildResult
from .leftovers import clean_stale_workers
from .progress import progress_bar
from .report import ENV_DIR, load_report, new_report, report_key, save_report, writable_report_dir
from .setup_lock import WORKER_TIMEOUT, lock_holder, release_lock, try_lock

PACK_DIR = Path(__file__).resolve().parent.parent
MAX_RESTARTS = 3
MAX_SETUP_ATTEMPTS = 3  # starts that retry an incomplete report (the worker died, e.g. OOM-killed) before giving up
STEP_TIMEOUT = 600.0  # one variant (two head dims) or the speed test; a GPU hang is stopped after this
LONG_SEQUENCE_STEP = "long-sequence kernel"  # the worker step that builds and checks it (GPU only)
ROPE_STEP = "RoPE kernel"  # the worker step that builds and checks it (GPU only)
PV_CHOICE_STEP = "P·V path timing"  # the worker step that times fp8 against int8 P·V (GPU only)
ENV_NO_AUTOSETUP = "SAGETRITON_NO_AUTOSETUP"
ENV_SETUP_DELAY = "SAGETRITON_SETUP_DELAY"  # seconds after start-up before the background self-test (default 10)
DEFAULT_SETUP_DELAY, MAX_SETUP_DELAY = 10.0, 600.0  # longer leaves the browser waiting for nothing
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_flag(name: str, default: bool = False) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); anything else keeps ``default``, said in one log line."""
    raw = os.environ.get(name)
    value = (raw or "").strip().lower()
    if raw is None or value not in _TRUE + _FALSE:
        if raw is not None:
            logger.warning("[SageTriton] ignoring %s=%r (expected 1/true/yes/on or 0/false/no/off)", name, raw)
        return default
    return value in _TRUE


def clamp_delay(value, name: str = ENV_SETUP_DELAY) -> float:
    """Seconds in [0, MAX_SETUP_DELAY]; not a number (or NaN) gives the default, each said in one log line."""
    try:
        delay = float(value)
    except (TypeError, ValueError):
        delay = math.nan
    if math.isnan(delay):
        logger.warning("[SageTriton] ignoring %s=%r (not a number of seconds); using %g", name, value,
                       DEFAULT_SETUP_DELAY)
        return DEFAULT_SETUP_DELAY
    if not 0 <= delay <= MAX_SETUP_DELAY:
        clamped = min(max(delay, 0.0), MAX_SETUP_DELAY)
        logger.warning("[SageTriton] %s=%r is outside 0-%g seconds; using %g", name, value, MAX_SETUP_DELAY, clamped)
        return clamped
    return delay


# ---------------------------------------------------------------------------------------------
# The worker (runs in the child)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # per writer: supervisor and worker never share a temp file
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def worker_main(out_path: str, mode: str, show_progress: bool = True) -> int:
    """Build and self-test every variant, then (GPU) measure the crossover; progress goes to ``out_path``."""
    import torch

    from ..kernels.arch import detect_arch
    from . import selftest

    _end_with_supervisor()
    path = Path(out_path)
    state = _read_json(path) or {"variants": {}}
    state.update(mode=mode, current=None, complete=False, pid=os.getpid())
    if mode == "gpu":
        arch, device = detect_arch(), torch.device("cuda", torch.cuda.current_device())
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        head_dims, shapes, tokens = selftest.BUILD_HEAD_DIMS, selftest.GPU_ACCURACY_SHAPES, 256
    else:  # the interpreter compiles nothing: keep the "build" run tiny
        arch, device, dtype = CPU_ARCH, torch.device("cpu"), torch.float16
        head_dims, shapes, tokens = (64,), selftest.CPU_ACCURACY_SHAPES, 64
    # quick: only the default variant (what an unconfigured Patch node runs), e.g. for a short GPU session
    variants = [selftest.default_variant(arch)] if state.get("quick") else selftest.variants_for(arch)
    state["total"] = len(variants) + (1 if mode == "gpu" else 0)
    todo = [v for v in variants if selftest.name_of(v) not in state["variants"]]
    bar = None
    if show_progress:
        bar = progress_bar(state["total"], "build + self-test", initial=len(state["variants"]))
    for v in todo:
        name = selftest.name_of(v)
        state["current"] = name
        if bar:
            bar.set_postfix_str(name)
        _write_json(path, state)  # written before the risky part: a crash here is pinned on this variant
        builds = {d: selftest.build_variant(v, d, device, dtype, tokens) for d in head_dims}
        failed = {d: b for d, b in builds.items() if not b["ok"]}
        build = {"ok": not failed, "seconds": round(sum(b["seconds"] for b in builds.values()), 2),
                 "head_dims": list(head_dims)}
        if failed:
            d, b = next(iter(failed.items()))
            build["error"] = f"head_dim {d}: {b.get('error')}"
        entry = {"build": build}
        if build["ok"]:
            entry["selftest"] = selftest.accuracy(v, shapes, device, dtype)
        state["variants"][name] = entry
        state["done"] = len(state["variants"])
        _write_json(path, state)
        if bar:
            bar.update(1)
    if mode == "gpu" and "long_sequence_kernel" not in state:
        state["current"] = LONG_SEQUENCE_STEP
        _write_json(path, state)
        if bar:
            bar.set_postfix_str(LONG_SEQUENCE_STEP)
        state["long_sequence_kernel"] = selftest.long_sequence_kernel(arch, device, dtype)
    if mode == "gpu" and "rope_kernel" not in state:
        state["current"] = ROPE_STEP
        _write_json(path, state)
        if bar:
            bar.set_postfix_str(ROPE_STEP)
        state["rope_kernel"] = selftest.rope_kernel(device, dtype)
    if mode == "gpu" and "pv_choice" not in state:
        state["current"] = PV_CHOICE_STEP
        _write_json(path, state)
        if bar:
            bar.set_postfix_str(PV_CHOICE_STEP)
        passed = frozenset(state["variants"]) - frozenset(disabled_from(state["variants"]))
        state["pv_choice"] = selftest.measure_pv_choice(arch, device, dtype, passed)
    if mode == "gpu" and "crossover" not in state:
        state["current"] = "crossover"
        _write_json(path, state)
        if bar:
            bar.set_postfix_str("speed vs SDPA")
        state["crossover"] = selftest.measure_crossovers(arch, device, dtype, state.get("sdpa_default_safe"),
                                                         pv_choice=state.get("pv_choice"))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    state.update(current=None, complete=True)
    _write_json(path, state)
    return 0


def _end_with_supervisor(poll: float = 0.5) -> None:
    """A killed supervisor leaves the worker orphaned (re-parented): stop then, instead of testing on alone."""
    if os.name == "nt":
        return
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(3)

    threading.Thread(target=watch, name="SageTriton-supervisor-watch", daemon=True).start()



def _worker_cmd(out_path: Path, mode: str, show_progress: bool) -> list:
    cmd = [sys.executable, str(PACK_DIR / "install.py"), "--worker", str(out_path), "--mode", mode]
    return cmd + ([] if show_progress else ["--no-progress"])


def run_worker_stage(mode: str, out_path: Path, echo: bool = True, sdpa_default_safe: Optional[bool] = None,
                     on_progress: Optional[Callable[[dict], None]] = None, timeout: float = WORKER_TIMEOUT,
                     cmd_for: Optional[Callable] = None, quick: bool = False,
                     step_timeout: float = STEP_TIMEOUT) -> dict:
    """Run the worker until it completes, restarting after crashes; returns its final state."""
    cmd_for = cmd_for or _worker_cmd
    env = dict(os.environ)
    if mode == "interpreter":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    state = {"variants": {}, "sdpa_default_safe": sdpa_default_safe, "quick": quick}
    _write_json(out_path, state)
    crashes = []
    for _restart in range(MAX_RESTARTS + 1):
        try:
            proc = subprocess.Popen(cmd_for(out_path, mode, echo), env=env,
                                    stdout=None if echo else subprocess.DEVNULL,
                                    stderr=None if echo else subprocess.PIPE, text=True, errors="replace",
                                    # its own process group: a Ctrl-C or a signal to ComfyUI's group reaches the
                                    # supervisor, which ends it (below); no console window on Windows
                                    start_new_session=os.name != "nt",
                                    creationflags=0 if echo else getattr(subprocess, "CREATE_NO_WINDOW", 0))
        except OSError as e:  # no interpreter at sys.executable, out of processes: a restart would not help
            state = _read_json(out_path)
            state["error"] = f"the self-test worker could not be started ({type(e).__name__}: {e})"
            logger.warning("[SageTriton] %s", state["error"])
            break
        stderr, timed_out, t0 = "", False, time.monotonic()
        step, step_t0 = None, t0
        try:
            while True:
                try:
                    _, stderr = proc.communicate(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    now, seen = time.monotonic(), _read_json(out_path)
                    if on_progress:
                        on_progress(seen)
                    if (seen.get("current"), seen.get("done")) != step:
                        step, step_t0 = (seen.get("current"), seen.get("done")), now
                    if now - step_t0 > step_timeout or now - t0 > timeout:
                        proc.kill()
                        _, stderr = proc.communicate()
                        timed_out = True
                        break
        finally:
            if proc.poll() is None:  # the supervisor is leaving (exception, Ctrl-C): the worker goes with it
                proc.kill()
                proc.wait()
        state = _read_json(out_path)
        if state.get("complete"):
            break
        how = ChildResult(None if timed_out else proc.returncode, "", stderr or "", timed_out=timed_out,
                          payload={}).describe()
        if how == "ok":  # exit code 0 without "complete" (e.g. its file was clobbered): not a success to show
            how = "the worker exited without finishing the self-test"
        current = state.get("current")
        crashes.append({"step": current, "how": how})
        logger.warning("[SageTriton] self-test worker stopped at %s: %s", current or "start-up", how)
        if current is None:  # died before any step (import error, no driver): nothing to skip, give up
            state["error"] = how
            break
        if current == "crossover":
            state["crossover"] = {"seq_len": None, "error": f"speed measurement crashed: {how}"}
        elif current == LONG_SEQUENCE_STEP:
            state["long_sequence_kernel"] = {"ok": False, "error": f"crashed the process: {how}"}
        elif current == ROPE_STEP:
            state["rope_kernel"] = {"ok": False, "error": f"crashed the process: {how}"}
        elif current == PV_CHOICE_STEP:  # nothing chosen: the arch table's default stays
            state["pv_choice"] = None
        else:
            state.setdefault("variants", {})[current] = {"build": {"ok": False, "error": f"crashed the process: {how}"}}
        state["current"] = None
        _write_json(out_path, state)
    else:
        state["error"] = f"the worker crashed {len(crashes)} times; giving up"
    state["crashes"] = crashes
    return state


def incomplete_what(report: dict) -> str:
    """What an incomplete report is missing, in a few words (for the node and /sage/status)."""
    crashed = [c.get("step") or "start-up" for c in report.get("worker_crashes") or []]
    missing = [] if report.get("crossover") else ["speed measurement (crossover)"]
    return "; ".join(filter(None, [report.get("error") or "", f"crashed on {', '.join(crashed)}" if crashed else "",
                                   f"missing {', '.join(missing)}" if missing else ""])) or "unknown"


def disabled_from(variants: dict) -> list:
    """Variants that failed to build or self-test; running out of memory is not a failure of the kernel."""
    def failed(step: dict) -> bool:
        return not step.get("ok", False) and not step.get("oom")

    return sorted(n for n, r in variants.items()
                  if failed(r.get("build", {})) or (r.get("build", {}).get("ok") and failed(r.get("selftest", {}))))


def run_setup(arch: ArchInfo, mode: str, echo: bool = True, on_progress=None, doctor: Optional[list] = None,
              cross_compile: Optional[dict] = None, probe_sdpa: bool = True, quick: bool = False) -> dict:
    """The full job for ``arch``: (RDNA4) SDPA probe, worker stage, report. Returns the saved report."""
    from .sdpa_probe import needs_probe, probe_sdpa_default

    key = report_key(arch)
    report = new_report(key)
    report.update(mode=mode, device={"vendor": arch.vendor, "arch": arch.arch, "family": arch.family,
                                     "name": arch.name})
    if doctor is not None:
        report["doctor"] = doctor
    if cross_compile is not None:
        report["cross_compile"] = cross_compile
    safe = None
    if mode == "gpu" and probe_sdpa and needs_probe(arch):
        if echo:
            print("Probing torch's default SDPA in a child process (RDNA4)...", flush=True)
        probe = probe_sdpa_default("cuda")
        report["sdpa_probe"] = probe
        safe = probe["safe"]
        report["sdpa_default_safe"] = safe
    d, why = writable_report_dir()
    if d is None:  # nothing to save the result to, nor to lock and hand progress over in: say so, don't run
        report["error"] = (f"no self-test report could be written, {why}; set {ENV_DIR} to a writable folder "
                           "and run install.py again (until then the table defaults are used)")
        logger.warning("[SageTriton] %s", report["error"])
        return report
    lock = d / f".lock-{report['key_id']}"
    waited = False
    while not try_lock(lock):  # another process is testing this key: wait for its report, not redo it
        if not waited and echo:
            print(f"Another self-test for this GPU is running (pid {lock_holder(lock)}); waiting for it...", flush=True)
        if on_progress:
            on_progress({"current": f"waiting for another self-test (pid {lock_holder(lock)})"})
        waited = True
        time.sleep(1.0)
    try:
        done = load_report(key) if waited else None
        if done is not None and done.get("complete"):
            return done
        return _run_setup_locked(report, key, d, mode, echo, safe, on_progress, quick)
    finally:
        release_lock(lock)


def _run_setup_locked(report, key, d, mode, echo, safe, on_progress, quick) -> dict:
    previous = load_report(key)
    # incomplete reports are retried on later starts, up to MAX_SETUP_ATTEMPTS (counted here)
    report["attempts"] = (previous.get("attempts") or 1) + 1 if previous and not previous.get("complete") else 1
    clean_stale_workers(d)
    partial = d / f".worker-{report['key_id']}-{os.getpid()}.json"  # per process: never shared
    try:
        state = run_worker_stage(mode, partial, echo=echo, sdpa_default_safe=safe, on_progress=on_progress,
                                 quick=quick)
    finally:
        for f in (partial, *d.glob(partial.name.replace(".json", ".*.tmp"))):
            try:
                f.unlink()
            except OSError:
                pass
    report["quick"] = quick
    report["variants"] = state.get("variants", {})
    report["disabled_variants"] = disabled_from(report["variants"])
    report["crossover"] = state.get("crossover")
    report["long_sequence_kernel"] = state.get("long_sequence_kernel")
    report["rope_kernel"] = state.get("rope_kernel")
    report["pv_choice"] = state.get("pv_choice")
    if state.get("crashes"):
        report["worker_crashes"] = state["crashes"]
    if state.get("error"):
        report["error"] = state["error"]
    report["complete"] = bool(state.get("complete"))
    # A worker that never started (broken torch) must not be cached as "done": the next start retries.
    if report["variants"] or report["complete"]:
        try:
            report["path"] = str(save_report(report))
        except OSError as e:  # the folder turned read-only (or full) while the worker ran
            report["error"] = f"the self-test report could not be written to {d} ({e.strerror or e}); none was saved"
            logger.warning("[SageTriton] %s", report["error"])
    return report


# ---------------------------------------------------------------------------------------------
# Lazy first start inside ComfyUI


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phase = "idle"  # idle | waiting | running | done | skipped | failed
        self.message = ""
        self.progress: dict = {}
        self.thread: Optional[threading.Thread] = None
        self.notify: Optional[Callable[[dict], None]] = None  # e.g. a websocket push to the browser

    def set(self, phase: str, message: str = "", **progress) -> None:
        with self.lock:
            changed = (phase, message, progress or self.progress) != (self.phase, self.message, self.progress)
            self.phase, self.message = phase, message
            if progress:
                self.progress = progress
            notify = self.notify if changed else None
        if notify is not None:
            try:
                notify(self.snapshot())
            except Exception as e:  # noqa: BLE001 - a closed browser tab must not stop the self-test
                logger.debug("[SageTriton] setup progress notification failed: %s", e)

    def snapshot(self) -> dict:
        with self.lock:
            return {"phase": self.phase, "message": self.message, "progress": dict(self.progress)}


_state = _State()


def setup_status() -> dict:
    """What the lazy first-start is doing (for /sage/status)."""
    return _state.snapshot()


# The run summary agrees (nodes/reporting/run_summary.py): "0 kernel, N fallback; fallbacks run on ComfyUI's ...".
NO_GPU_LOG = ("[SageTriton] no GPU (or ComfyUI runs with --cpu): the kernel is off; a patched model sends "
              "every attention call to ComfyUI's own attention")


def _background_job(delay: float, device_fn: Optional[Callable]) -> None:
    try:
        time.sleep(delay)  # let ComfyUI finish starting: the worker competes for CPU while it compiles
        from ..kernels.arch import detect_arch
        from .report import current_report, current_report_problem

        arch = detect_arch(device_fn() if device_fn else None)
        if arch.vendor == "cpu":
            logger.info(NO_GPU_LOG)  # said once: this job runs once per start
            _state.set("skipped", "no GPU: every attention call runs on ComfyUI's own attention")
            return
        found = current_report(arch)
        if found is not None and found.get("complete"):
            _state.set("done", "report found (install.py or an earlier start built and tested the kernels)")
            return
        if found is not None and (found.get("attempts") or 1) >= MAX_SETUP_ATTEMPTS:
            _state.set("failed", f"self-test incomplete after {MAX_SETUP_ATTEMPTS} attempts ({incomplete_what(found)});"
                                 " table defaults where it did not finish; `python install.py --force` retries")
            return
        invalid = current_report_problem(arch)
        _state.set("running", f"building and self-testing the kernels for {arch.name} ({arch.arch})"
                   + (f"; the old report was invalid ({invalid})" if invalid else ""))
        logger.info("[SageTriton] first start on %s (%s): building and self-testing the kernels in the background; "
                    "until it finishes, patched models use the table's defaults", arch.name, arch.arch)
        last = [-1]

        def progress(state: dict) -> None:
            done, total = state.get("done", 0), state.get("total", 0)
            _state.set("running", _state.message, done=done, total=total, current=state.get("current"))
            if done != last[0] and total:
                last[0] = done
                logger.info("[SageTriton] self-test %d/%d %s", done, total, state.get("current") or "")

        report = run_setup(arch, "gpu", echo=False, on_progress=progress)
        off = report.get("disabled_variants", [])
        cross = (report.get("crossover") or {}).get("seq_len")
        msg = f"done: {len(report.get('variants', {})) - len(off)} variants ok, {len(off)} off; crossover {cross}"
        _state.set("done" if report.get("complete") else "failed", report.get("error") or msg)
        logger.info("[SageTriton] %s", _state.message)
    except Exception as e:  # noqa: BLE001 - never let the background job take ComfyUI down
        _state.set("failed", f"{type(e).__name__}: {e}")
        logger.warning("[SageTriton] background self-test failed: %s: %s", type(e).__name__, e)


def start_background_setup(delay: Optional[float] = None, device_fn: Optional[Callable] = None,
                           notify: Optional[Callable[[dict], None]] = None) -> bool:
    """Start the one-time build + self-test in a daemon thread if needed. Idempotent, non-blocking.

    ``device_fn()`` gives the device to test (ComfyUI's); ``notify(setup_status())`` is called on every change.
    """
    if notify is not None:
        _state.notify = notify
    # time.sleep() raises on a negative, NaN or infinite delay, which ended the thread "failed" on any machine
    delay = clamp_delay(os.environ.get(ENV_SETUP_DELAY, DEFAULT_SETUP_DELAY) if delay is None else delay)
    if env_flag(ENV_NO_AUTOSETUP):
        _state.set("skipped", f"disabled by {ENV_NO_AUTOSETUP}={os.environ[ENV_NO_AUTOSETUP]}")
        return False
    with _state.lock:
        if _state.thread is not None:
            return False
        _state.phase, _state.message = "waiting", f"starting in {delay:g} s"
        _state.thread = threading.Thread(target=_background_job, args=(delay, device_fn), name="SageTriton-setup",
                                         daemon=True)
        _state.thread.start()
    return True

