"""The dispatcher every attention call of a patched model goes through: bind ComfyUI's backend arguments, decide
kernel or fallback (once per call signature: ``call_cache``), run it, count it.

The overrides that reach it (the Patch node's, core's registry entry, their container entries) are made in
``override``; ``containers`` adds what q/k/v holders need, ``sparse_calls`` is asked first where sparse is on,
``forward_plan`` hears each call's decision (``PatchState.count``). No ComfyUI import here: binding and the
fallback decision are plain functions (the call's own checks in ``attention_call``), ``PatchState`` runs them
(the kernel config comes from ``planner``, the counting and logging from ``stats``), so the rules can be
tested without ComfyUI. ComfyUI calls
``override(func, *args, **kwargs)`` where ``func`` is the backend the model wanted and ``args/kwargs`` follow
``(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kwargs)``.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Optional

import torch

from ...kernels import failures
from ...kernels.arch import ArchInfo, arch_for_device
from ...kernels.build_errors import root_cause
from ...kernels.log import logger
from ..backends import fallback as fb
from ..config.install_report import NoReport
from ..config.planner import KernelPlan, KernelPlanner
from ..config.settings import DEFAULT_SETTINGS, SageSettings
from ..reporting.reasons import Reason
from ..reporting.stats import RunLog, RunTally
from .attention_call import (
    BAD_SCALE,
    EMPTY_CALL,
    NEEDS_GRAD,
    AttentionCall,
    bind_call,
    call_fallback_reason,
    caller_error,
    comfy_output,
    hnd_inputs,
    kernel_inputs,
    needs_grad,
    normalize_mask,
)
from .call_cache import BOUND, BOUND_MATH, COMFY, COMFY_MATH, KERNEL, CallCache, Decision, call_signature
from .schedule import is_full_precision_step

# The call's own names, reached through ``dispatch`` by the other routing modules and the tests.
__all__ = ["PatchState", "AttentionCall", "bind_call", "kernel_inputs", "comfy_output", "normalize_mask",
           "needs_grad", "caller_error", "call_fallback_reason", "fallback_reason", "variant_key", "disable_variant",
           "disabled_variants", "BAD_SCALE", "EMPTY_CALL", "NEEDS_GRAD", "REFUSED_ARGUMENTS", "VARIANT_DISABLED",
           "NOT_SPARSE"]

# Kernel variants that failed to compile or run: disabled until ComfyUI restarts (``failures.memory.variants``,
# key -> cause).
_memory = failures.memory
VARIANT_DISABLED = Reason.VARIANT_DISABLED
REFUSED_ARGUMENTS = Reason.REFUSED_ARGUMENTS
NOT_SPARSE = object()  # ``sparse_calls.SparseRouter.dispatch``: the call goes on to the dense dispatcher


def fallback_reason(call: AttentionCall, plan: KernelPlan) -> Optional[str]:
    """Why the kernel plan for this GPU and head size does not take the call (a call that passed
    ``call_fallback_reason``); None when it does."""
    if plan.config is None:
        return Reason.NO_VARIANT
    if call.k_len < plan.min_seq_len:
        return Reason.KEY_TOO_SHORT.of(plan.min_seq_len)
    if call.batch * call.heads * call.q_len * call.k_len < plan.min_work:
        return Reason.WORK_TOO_SMALL.of(plan.min_work_text)
    return None


def variant_key(plan: KernelPlan, settings: SageSettings, call: AttentionCall, mask) -> tuple:
    cfg = plan.config
    # With the shape class (powers of two of batch x heads, Lq, Lk): a launch that fails for one size
    # (e.g. a grid limit) turns the variant off for that size only, not for every call.
    shape_class = tuple(n.bit_length() for n in (call.batch * call.heads, call.q_len, call.k_len))
    return (plan.arch.arch, cfg.qk_quant_gran, cfg.pv_choice(), cfg.pv_accum_dtype, cfg.qk_rotation,
            settings.smooth_k, settings.smooth_v, call.q.dtype, call.head_dim, None if mask is None else mask.dtype,
            shape_class)


class _PerThread(threading.local):
    """A patched model's state that belongs to one forward, so to the thread running it."""

    redo_reason: Optional[str] = None  # set by the non-finite guard: every call of the forward it redoes
    forward = None  # the forward plan's record of the forward in progress (``forward_plan._Forward``)


class PatchState:
    """One patched MODEL's dispatcher: decides per call, runs the kernel or a fallback, counts.

    Both of ComfyUI's entries (tensors, and current ComfyUI's q/k/v containers) come to ``dispatch``:
    one decision (the call cache, else ``_dispatch_checked``'s full checks) and one kernel-or-fallback step
    (``_kernel_or_fallback``); the container entry adds only its strategy (``containers.Holders``). Each
    call's decision is counted and told to the forward in progress on its thread (``count``).
    The overrides are closures over this object (``override``), not an instance with ``__call__``: ComfyUI
    deep-copies model_options on clone, and a function survives that as the same object.
    """

    def __init__(self, settings: SageSettings = DEFAULT_SETTINGS, previous_override: Optional[Callable] = None,
                 arch: Optional[ArchInfo] = None, node_id: Optional[str] = None,
                 score_budget_bytes: int = fb.DEFAULT_SCORE_BUDGET, report: Optional[NoReport] = None):
        self.settings = settings
        self.previous_override = previous_override
        self.arch_override = arch  # simulated GPUs (tests); None = detect from tensors
        self.node_id = node_id
        self.score_budget_bytes = score_budget_bytes
        self.report = report or NoReport()  # install.py's self-test: crossover, failed variants
        self.planner = KernelPlanner(settings, self.report)
        self.runs = RunLog()
        self.local = _PerThread()  # the forward on this thread: the guard's redo, the forward plan's record
        self.last_plan: Optional[KernelPlan] = None  # of the last call that reached the plan (run summary)
        self._step_cache: Optional[tuple[tuple, bool]] = None
        self._calls = CallCache()  # decisions by call signature: a repeated call skips binding and checks
        self.kernel_runner: Optional[Callable] = None  # Sage Settings' backend choice; None: our kernel (sageattn)
        self.composition: dict = {}  # which backend this patch replaced and which serves fallbacks (run summary)
        self.rope_compiled = False  # a forward torch.compile traced kept ComfyUI's RoPE (``rope_hooks``)
        self.sparse = None  # a ``sparse_calls.SparseRouter`` when Sage Settings' sparse is on; asked first

    @property
    def run(self) -> Optional[RunTally]:
        """The tally of the sampling run in progress, if any."""
        return self.runs.current

    def begin_run(self) -> None:
        self.report.refresh()  # a report replaced since the last run is planned from (generation changes)
        self.runs.begin()
        self._step_cache = None

    def arch_for(self, device: torch.device) -> ArchInfo:
        return self.arch_override if self.arch_override is not None else arch_for_device(device)

    def full_precision_step(self, transformer_options: dict) -> bool:
        """Whether this model evaluation is one of Sage Settings' full-precision steps (no kernel)."""
        s = self.settings
        if s.full_precision_first_steps <= 0 and s.full_precision_last_steps <= 0:
            return False
        # Every attention call of one model evaluation shares the same sigma tensors: decide once per
        # evaluation (reading GPU sigmas synchronises with the device).
        key = (transformer_options.get("sigmas"), transformer_options.get("sample_sigmas"))
        cached = self._step_cache
        if cached is not None and cached[0][0] is key[0] and cached[0][1] is key[1]:
            return cached[1]
        result = is_full_precision_step(transformer_options, s.full_precision_first_steps,
                                        s.full_precision_last_steps)
        self._step_cache = (key, result)
        return result

    def decide(self, call: AttentionCall) -> tuple[Optional[str], Optional[KernelPlan]]:
        """The full checks of a bound call: (fallback reason or None, the plan the call reached or None)."""
        reason = call_fallback_reason(call)
        if reason is None and self.full_precision_step(call.transformer_options):
            reason = Reason.FULL_PRECISION_STEP
        if reason is not None:
            return reason, None
        plan = self.planner.plan(self.arch_for(call.q.device), call.head_dim)
        if plan.config is not None:
            self.last_plan = plan
        return fallback_reason(call, plan), plan

    def fallback_route(self, arch: Optional[ArchInfo]) -> int:
        """Where a call the kernel does not take goes on ``arch`` (``call_cache`` routes)."""
        kind = fb.resolve_fallback_kind(self.settings.fallback, arch,
                                        self.report.sdpa_default_safe(arch) if fb.is_rdna4(arch) else None)
        if kind == "comfy":
            return COMFY
        if kind == "math" and self.previous_override is not None and self.settings.fallback == "auto":
            return COMFY_MATH  # RDNA4 with an earlier override: it stays our fallback, never on SDPA's flash path
        return BOUND_MATH if kind == "math" else BOUND

    def fallback_route_for(self, first) -> int:
        """``fallback_route`` for a call whose first tensor (or q's container) is ``first``."""
        if first is not None and not isinstance(first, torch.Tensor):
            peek = getattr(first, "peek", None)
            first = peek() if callable(peek) else None
        return self.fallback_route(self.arch_for(first.device) if isinstance(first, torch.Tensor)
                                   else self.arch_override)

    # --- counting ------------------------------------------------------------------------------------
    def count(self, route: int, reason: Optional[str], detail: str = "") -> None:
        """Count one call's decision (``reason`` None: a kernel took it) and tell the forward in progress on
        this thread (``forward_plan``: what it learns a plan from)."""
        if reason is None:
            self.runs.kernel()
        else:
            self.runs.fallback(reason, detail)
        forward = self.local.forward
        if forward is not None and forward.decisions is not None:
            forward.decisions.append((route, reason))

    @property
    def redo_reason(self) -> Optional[str]:
        """Why this thread's forward runs on ComfyUI's attention (the non-finite guard), or None."""
        return self.local.redo_reason

    # --- the call ------------------------------------------------------------------------------------
    def dispatch(self, func: Callable, args: tuple, kwargs: dict, holders=None) -> torch.Tensor:
        """One attention call: ``override(func, *args, **kwargs)``'s, or with ``holders`` (the container
        entry's ``containers.Holders``) one whose q, k, v in ``args`` are containers (``func`` unused)."""
        local = self.local
        reason = local.redo_reason  # the non-finite guard redoes this forward on ComfyUI's attention
        if reason is None and torch.is_grad_enabled() and needs_grad(args):  # False while ComfyUI samples
            reason = NEEDS_GRAD
        if reason is not None:
            return self._fall_back(func, args, kwargs, None, reason, holders)
        if self.sparse is not None:
            out = self.sparse.dispatch(self, args, kwargs, holders)
            if out is not NOT_SPARSE:
                return out
        key = call_signature(args, kwargs)  # None for containers: decided in full every time
        if key is not None:
            s, calls = self.settings, self._calls
            if s.full_precision_first_steps > 0 or s.full_precision_last_steps > 0:
                key = (key, self.full_precision_step(kwargs.get("transformer_options") or {}))
            # The cache's stamp and lookup inlined: most calls of a UNet end here, and each Python frame
            # is host time of a host-bound forward (SDXL: 140 calls).
            previous, generation = self.previous_override, self.report.generation()
            if calls.settings is not s or calls.previous is not previous or calls.generation != generation:
                calls.reset(s, previous, generation)
                self.planner.settings = s  # settings replaced, or install.py's report changed: plan again
                self.planner.forget()
            try:
                decision = calls.entries.get(key)
            except TypeError:  # an unhashable argument: decided in full every time
                decision = None
            if decision is not None:  # decided before: no binding, no checks
                route = decision.route
                if decision.plan is not None:
                    self.last_plan = decision.plan
                if route == COMFY:  # ``count`` inlined
                    reason = decision.reason
                    self.runs.fallback(reason)
                    forward = local.forward
                    if forward is not None and forward.decisions is not None:
                        forward.decisions.append((COMFY, reason))
                    return func(*args, **kwargs) if previous is None else previous(func, *args, **kwargs)
                if route == COMFY_MATH:
                    self.count(COMFY_MATH, decision.reason)
                    return self._call_comfy_side(func, args, kwargs, math_only=True)
                if route == KERNEL and decision.variant not in _memory.variants:
                    call = bind_call(args, kwargs)
                    return self._kernel_or_fallback(func, args, kwargs, call, decision.plan,
                                                    normalize_mask(call)[0], decision.variant, None)
        return self._dispatch_checked(func, args, kwargs, key, holders)

    def _dispatch_checked(self, func: Callable, args: tuple, kwargs: dict, key: Optional[tuple],
                          holders) -> torch.Tensor:
        """The full checks; their decision is remembered under ``key`` (``call_cache``)."""
        try:
            call = bind_call(args if holders is None else holders.tensors(args), kwargs)
        except (TypeError, ValueError, AttributeError) as e:
            return self._fall_back(func, args, kwargs, None, Reason.UNRECOGNISED_CALL, holders, str(e))
        reason, plan = self.decide(call)
        reached = plan if plan is not None and plan.config is not None else None
        if reason is None:
            mask = normalize_mask(call)[0]
            variant = variant_key(plan, self.settings, call, mask)
            if key is not None:
                self._calls.put(key, Decision(None, KERNEL, reached, variant))
            if variant not in _memory.variants:
                return self._kernel_or_fallback(func, args, kwargs, call, plan, mask, variant, holders)
            return self._fall_back(func, args, kwargs, call, VARIANT_DISABLED, holders)
        route = self.fallback_route(self.arch_for(call.q.device))
        if key is not None:
            self._calls.put(key, Decision(reason, route, reached, None))
        return self._fall_back(func, args, kwargs, call, reason, holders, route=route)

    def _fall_back(self, func: Callable, args: tuple, kwargs: dict, call: Optional[AttentionCall], reason: str,
                   holders, detail: str = "", route: Optional[int] = None) -> torch.Tensor:
        """Count the fallback, then run it."""
        if route is None:
            route = self.fallback_route_for(call.q if call is not None else (args[0] if args else None))
        self.count(route, reason, detail)
        return self._fallback_out(func, args, kwargs, call, route, holders)

    def _fallback_out(self, func: Callable, args: tuple, kwargs: dict, call: Optional[AttentionCall], route: int,
                      holders) -> torch.Tensor:
        """The fallback's output: through the holders' own fallback for a container call, else ``run_fallback``."""
        if holders is not None:
            return holders.fallback(self, args, kwargs, call, route)
        return self.run_fallback(func, args, kwargs, call, route)

    def _kernel_or_fallback(self, func: Callable, args: tuple, kwargs: dict, call: AttentionCall,
                            plan: KernelPlan, mask, variant: tuple, holders) -> torch.Tensor:
        """The kernel's output (counted); after a kernel failure the fallback's, and ``variant`` is turned off
        (a call ComfyUI's attention refuses too was the caller's: its error goes up, the variant stays on)."""
        if holders is not None and self.kernel_runner is None and holders.may_take(call, variant):
            out = holders.run_kernel_taking(self, call, plan, mask, args)  # nothing is left to fall back on
            self.count(KERNEL, None)
            return out
        try:
            out = self.run_kernel(call, plan, mask)
        except torch.OutOfMemoryError:
            raise  # the fallback would need the memory too; let ComfyUI report it
        except Exception as e:  # compile or launch failure: never fail the run
            route = self.fallback_route(self.arch_for(call.q.device))
            out = self._fallback_out(func, args, kwargs, call, route, holders)
            refused = caller_error(call, mask)
            if refused is not None:  # arguments the checks let by: still the caller's, not a kernel fault
                self.count(route, REFUSED_ARGUMENTS, refused)
                return out
            disable_variant(variant, plan, e)
            self.count(route, VARIANT_DISABLED)
            return out
        if holders is not None:
            holders.kernel_ran(args, variant)
        self.runs.kernel()  # ``count`` inlined: a frame less per kernel call
        forward = self.local.forward
        if forward is not None and forward.decisions is not None:
            forward.decisions.append((KERNEL, None))
        return out

    # --- running -----------------------------------------------------------------------------------
    def run_kernel(self, call: AttentionCall, plan: KernelPlan, mask) -> torch.Tensor:
        from ...kernels import sageattn  # imported on first use: keeps node import cheap

        q, k, v, layout = kernel_inputs(call)
        # Written straight in the memory order ComfyUI returns, so comfy_output is a view: Flux's
        # (B, H, L, D) inputs would otherwise pay a transposing copy of the output per call.
        out_layout = "HND" if call.skip_output_reshape else "NHD"
        # The plan's config as resolved here (downgrades, self-test results, arch override): the kernel
        # library must not resolve a second one from the device.
        run = self.kernel_runner or sageattn
        out = run(q, k, v, tensor_layout=layout, is_causal=False, sm_scale=call.extra.get("scale"),
                       attn_mask=mask, smooth_k=self.settings.smooth_k, smooth_v=self.settings.smooth_v,
                       out_layout=out_layout, config=plan.config)
        return comfy_output(out, out_layout, call)

    def run_fallback(self, func: Callable, args: tuple, kwargs: dict, call: Optional[AttentionCall],
                     route: int) -> torch.Tensor:
        """The fallback ``route`` names: ComfyUI's side (also any call not bound), else our own SDPA."""
        if call is None or route in (COMFY, COMFY_MATH):
            return self._call_comfy_side(func, args, kwargs, math_only=route in (COMFY_MATH, BOUND_MATH))
        mask, _ = normalize_mask(call)
        q, k, v = hnd_inputs(call)
        upcast = call.attn_precision == torch.float32
        scale = call.extra.get("scale")
        if route == BOUND_MATH:
            out = fb.math_sdpa_chunked(q, k, v, mask, scale, upcast, self.score_budget_bytes)
        else:
            out = fb.sdpa_attention(q, k, v, mask, scale, upcast)
        return comfy_output(out, "HND", call)

    def _call_comfy_side(self, func: Callable, args: tuple, kwargs: dict, math_only: bool) -> torch.Tensor:
        """The earlier override if there was one, else ComfyUI's own backend. No closure: most calls of a
        UNet come here, and each microsecond is host time of a host-bound forward (SDXL: 140 calls)."""
        if math_only:
            with fb.math_only_sdpa():
                return self._call_comfy_side(func, args, kwargs, math_only=False)
        previous = self.previous_override
        return func(*args, **kwargs) if previous is None else previous(func, *args, **kwargs)


def disable_variant(variant: tuple, plan: KernelPlan, error: Exception) -> None:
    """Turn ``variant`` off until ComfyUI restarts, after a kernel failure on a well-formed call."""
    _memory.variants[variant] = root_cause(error)
    logger.warning("[SageTriton] kernel %s failed on %s (%s); this variant is disabled until ComfyUI restarts, "
                   "the fallback runs instead.", plan.config, plan.arch.arch, _memory.variants[variant])


def disabled_variants() -> dict[tuple, str]:
    """Kernel variants disabled in this process after a failure, with the cause."""
    return dict(_memory.variants)
