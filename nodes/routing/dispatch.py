"""The attention override: bind ComfyUI's backend arguments, pick kernel or fallback, run it.

No ComfyUI import here: binding and the fallback decision are plain functions, ``PatchState`` runs
them (the kernel config comes from ``planner``, the counting and logging from ``stats``), so the
rules can be tested without ComfyUI. ComfyUI calls ``override(func, *args, **kwargs)`` where ``func`` is the
backend the model wanted and ``args/kwargs`` follow
``(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kwargs)``.
"""
from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ...kernels.arch import ArchInfo, arch_for_device, interpreter_enabled
from ...kernels.build_errors import root_cause
from ...kernels.log import logger
from ..backends import fallback as fb
from ..config.install_report import NoReport
from ..config.planner import KernelPlan, KernelPlanner
from ..config.settings import DEFAULT_SETTINGS, SageSettings
from ..reporting.stats import RunLog, RunTally
from . import call_cache
from .call_cache import BOUND, BOUND_MATH, COMFY, COMFY_MATH, KERNEL, CallCache, Decision, call_signature
from .schedule import is_full_precision_step

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
# kwargs ComfyUI adds that do not change what attention computes.
PASSIVE_KWARGS = call_cache.PASSIVE_KWARGS
# kwargs we understand: scale -> sm_scale, enable_gqa (kernel does GQA), low_precision_attention.
HANDLED_KWARGS = frozenset({"scale", "enable_gqa", "low_precision_attention"})

# Kernel variants that failed to compile or run: disabled until ComfyUI restarts. key -> cause.
_disabled_variants: dict[tuple, str] = {}
VARIANT_DISABLED = "kernel failed (variant disabled until restart)"
# A caller's arguments: the call goes where ComfyUI's attention takes it, nothing is turned off.
BAD_SCALE = "scale not a finite number"
EMPTY_CALL = "empty q or k (no batch or no tokens)"
REFUSED_ARGUMENTS = "arguments the kernel refuses (the caller's; nothing disabled)"
# Autograd through the kernel: it has no backward, ComfyUI's attention has (LoRA training, gradient guidance).
NEEDS_GRAD = "needs gradients (training)"
NOT_SPARSE = object()  # ``sparse_calls.SparseRouter.dispatch``: the call goes on to the dense dispatcher


def _bind_backend_arguments(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False,
                            skip_output_reshape=False, **kwargs):
    """ComfyUI's attention backend signature (comfy/ldm/modules/attention.py): Python binds for us."""
    return q, k, v, heads, mask, attn_precision, skip_reshape, skip_output_reshape, kwargs


@dataclass
class AttentionCall:
    """One attention call, bound to names, with head counts and lengths worked out."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    heads: int
    mask: Optional[torch.Tensor]
    attn_precision: Any
    skip_reshape: bool
    skip_output_reshape: bool
    extra: dict = field(default_factory=dict)  # every other keyword
    batch: int = 0
    head_dim: int = 0
    kv_heads: int = 0
    q_len: int = 0
    k_len: int = 0
    v_head_dim: int = 0

    @property
    def transformer_options(self) -> dict:
        return self.extra.get("transformer_options") or {}

    @property
    def semantic_kwargs(self) -> dict:
        return {k: v for k, v in self.extra.items() if k not in PASSIVE_KWARGS}


def bind_call(args: tuple, kwargs: dict) -> AttentionCall:
    """Bind positional/keyword arguments the way ComfyUI's backends do; raise TypeError if they don't fit."""
    q, k, v, heads, mask, attn_precision, skip_reshape, skip_output_reshape, extra = \
        _bind_backend_arguments(*args, **kwargs)
    call = AttentionCall(q, k, v, int(heads), mask, attn_precision, bool(skip_reshape), bool(skip_output_reshape),
                         extra)
    if call.heads < 1:
        raise ValueError(f"heads is {call.heads}, not >= 1")
    q, k, v = call.q, call.k, call.v
    if call.skip_reshape:  # (B, H, L, D)
        call.batch, _, call.q_len, call.head_dim = q.shape
        call.kv_heads, call.k_len = k.shape[1], k.shape[2]
        call.v_head_dim = v.shape[-1]
    else:  # q (B, L, H*D); k and v (B, L, H*D) or already (B, L, H, D) (SD3 passes v that way)
        call.batch, call.q_len, width = q.shape
        call.head_dim = width // call.heads
        call.k_len = k.shape[1]
        call.kv_heads = k.shape[2] if k.ndim == 4 else k.shape[-1] // max(1, call.head_dim)
        call.v_head_dim = v.shape[-1] if v.ndim == 4 else v.shape[-1] // max(1, call.kv_heads)
    return call


def kernel_inputs(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """q, k, v as strided views for the kernel, and their layout ("HND" or "NHD"); no copies."""
    if call.skip_reshape:
        return call.q, call.k, call.v, "HND"
    return (_split_heads(call.q, call.heads), _split_heads(call.k, call.kv_heads), _split_heads(call.v, call.kv_heads),
            "NHD")


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, H*D) -> (B, L, H, D) as a view; 4-D tensors are already split."""
    # view(), not unflatten(): the same view without unflatten's Python wrapper, on every kernel call
    return t if t.ndim == 4 else t.view(t.shape[0], t.shape[1], heads, t.shape[2] // heads)


def hnd_inputs(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (B, H, L, D) views (what torch SDPA takes)."""
    q, k, v, layout = kernel_inputs(call)
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return q, k, v


def comfy_output(out: torch.Tensor, layout: str, call: AttentionCall) -> torch.Tensor:
    """Kernel/SDPA output in ``layout`` -> what ComfyUI's backend would have returned."""
    if layout == "NHD":  # (B, Lq, H, D)
        if call.skip_output_reshape:
            return out.transpose(1, 2)
        return out.reshape(call.batch, call.q_len, -1)
    if call.skip_output_reshape:  # (B, H, Lq, D)
        return out
    return out.transpose(1, 2).reshape(call.batch, call.q_len, -1)


def normalize_mask(call: AttentionCall) -> tuple[Optional[torch.Tensor], Optional[str]]:
    """ComfyUI's mask as a 4-D tensor broadcastable to (B, H, Lq, Lk), or a fallback reason.

    Backends add a batch dimension to 2-D masks and a heads dimension to 3-D masks.
    """
    mask = call.mask
    if mask is None:
        return None, None
    if not isinstance(mask, torch.Tensor):
        return None, "mask is not a tensor"
    if mask.dtype.is_complex:
        return None, f"mask dtype {str(mask.dtype).replace('torch.', '')}"
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        # An integer mask (Lumina 2's raw caption mask on ComfyUI 0.3.75) is a bias added to the scores,
        # as ComfyUI's own backends add it and as SDPA treats a float mask: the same values as q's dtype.
        mask = mask.to(call.q.dtype)
    if mask.ndim == 2:
        mask = mask.unsqueeze(0)
    if mask.ndim == 3:
        mask = mask.unsqueeze(1)
    if mask.ndim != 4:
        return None, f"mask with {call.mask.ndim} dimensions"
    for have, want in zip(mask.shape, (call.batch, call.heads, call.q_len, call.k_len), strict=True):
        if have not in (1, want):
            return None, "mask shape not broadcastable to (B, H, Lq, Lk)"
    if mask.device != call.q.device:
        return None, "mask on another device"
    return mask, None


def device_supported(device: torch.device) -> bool:
    """CUDA and ROCm GPUs; CPU only in the Triton-interpreter test mode."""
    return device.type == "cuda" or (device.type == "cpu" and interpreter_enabled())


def call_fallback_reason(call: AttentionCall) -> Optional[str]:
    """Why the kernel cannot take this call whatever the GPU and settings; None when it can."""
    extra = call.semantic_kwargs
    if extra.get("low_precision_attention", True) is False:
        return "accuracy-critical call (low_precision_attention=False)"
    unknown = sorted(set(extra) - HANDLED_KWARGS)
    if unknown:
        return f"unsupported argument {unknown[0]!r}"
    q, k, v = call.q, call.k, call.v
    if not device_supported(q.device):
        return f"{q.device.type} device is not a CUDA/ROCm GPU"
    if q.dtype not in KERNEL_DTYPES:
        return f"dtype {str(q.dtype).replace('torch.', '')}"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return "q, k, v dtypes differ"
    if call.attn_precision == torch.float32:
        return "fp32 attn_precision requested"
    if not (1 <= call.head_dim <= MAX_HEAD_DIM):
        return f"head_dim {call.head_dim} outside 1..{MAX_HEAD_DIM}"
    if call.batch == 0 or call.q_len == 0 or call.k_len == 0:
        return EMPTY_CALL
    if not _finite_scale(extra.get("scale")):
        return BAD_SCALE
    problem = _shape_problem(call)
    if problem is not None:
        return problem
    if call.kv_heads < 1 or call.heads % call.kv_heads:
        return "query heads not a multiple of key heads"
    if call.v_head_dim != call.head_dim:
        return "v head size differs from q/k"
    return normalize_mask(call)[1]


def _finite_scale(scale) -> bool:
    """Whether the kernel takes ``scale`` (``kernels.api._check_scale``'s rule): None or a finite real number."""
    if scale is None:
        return True
    return not isinstance(scale, bool) and isinstance(scale, numbers.Real) and math.isfinite(scale)


def _shape_problem(call: AttentionCall) -> Optional[str]:
    """A caller's malformed shapes (the kernel would fail on them, which is not a kernel fault), or None."""
    q, k, v = call.q, call.k, call.v
    if call.skip_reshape:
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            return "q, k, v not (B, H, L, D)"
        k_len_v = v.shape[2]
    else:
        if q.shape[-1] != call.heads * call.head_dim:
            return "q width not a multiple of heads"
        if (k.ndim == 3 and k.shape[-1] != call.kv_heads * call.head_dim) or (
                v.ndim == 3 and v.shape[-1] != call.kv_heads * call.v_head_dim):
            return "k or v width not a multiple of heads"
        if k.ndim not in (3, 4) or v.ndim not in (3, 4):
            return "k or v neither (B, L, H*D) nor (B, L, H, D)"
        k_len_v = v.shape[1]
    if k.shape[0] != call.batch or v.shape[0] != call.batch:
        return "q, k, v batch sizes differ"
    if k.device != q.device or v.device != q.device:
        return "q, k, v on different devices"
    if k_len_v != call.k_len:
        return "k and v lengths differ"
    return None


def fallback_reason(call: AttentionCall, plan: KernelPlan) -> Optional[str]:
    """Why the kernel plan for this GPU and head size does not take the call (a call that passed
    ``call_fallback_reason``); None when it does."""
    if plan.config is None:
        return "no kernel variant passed the install self-test"
    if call.k_len < plan.min_seq_len:
        return f"key length < {plan.min_seq_len}"
    if call.batch * call.heads * call.q_len * call.k_len < plan.min_work:
        return f"work per call < {plan.min_work_text} (batch x heads x Lq x Lk)"
    return None


def _variant_key(plan: KernelPlan, settings: SageSettings, call: AttentionCall, mask) -> tuple:
    cfg = plan.config
    # With the shape class (powers of two of batch x heads, Lq, Lk): a launch that fails for one size
    # (e.g. a grid limit) turns the variant off for that size only, not for every call.
    shape_class = tuple(n.bit_length() for n in (call.batch * call.heads, call.q_len, call.k_len))
    return (plan.arch.arch, cfg.qk_quant_gran, cfg.pv_choice(), cfg.pv_accum_dtype, cfg.qk_rotation,
            settings.smooth_k, settings.smooth_v, call.q.dtype, call.head_dim, None if mask is None else mask.dtype,
            shape_class)


class _PerThread(threading.local):
    """A patched model's state that belongs to one forward, so to the thread running it."""

    reason: Optional[str] = None  # set by the non-finite guard: every call of the forward it redoes


class PatchState:
    """One patched MODEL's override: decides per call, runs the kernel or a fallback, counts.

    The override is a closure over this object (not an instance with ``__call__``): ComfyUI
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
        self.redo = _PerThread()  # .reason: set by the non-finite guard for the forward it redoes on this thread
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

    def _full_precision_step(self, transformer_options: dict) -> bool:
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
        """(None, plan) when the kernel takes the call, else (the reason to fall back, None)."""
        reason, plan = self._decide(call)
        return (None, plan) if reason is None else (reason, None)

    def _decide(self, call: AttentionCall) -> tuple[Optional[str], Optional[KernelPlan]]:
        """(fallback reason or None, the plan the call reached or None)."""
        reason = call_fallback_reason(call)
        if reason is None and self._full_precision_step(call.transformer_options):
            reason = "full-precision step"
        if reason is not None:
            return reason, None
        plan = self.planner.plan(self.arch_for(call.q.device), call.head_dim)
        if plan.config is not None:
            self.last_plan = plan
        return fallback_reason(call, plan), plan

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

    def _fallback_route(self, arch: Optional[ArchInfo]) -> int:
        """Where a call the kernel does not take goes on ``arch`` (``call_cache`` routes)."""
        kind = fb.resolve_fallback_kind(self.settings.fallback, arch,
                                        self.report.sdpa_default_safe(arch) if fb.is_rdna4(arch) else None)
        if kind == "comfy":
            return COMFY
        if kind == "math" and self.previous_override is not None and self.settings.fallback == "auto":
            return COMFY_MATH  # RDNA4 with an earlier override: it stays our fallback, never on SDPA's flash path
        return BOUND_MATH if kind == "math" else BOUND

    def run_fallback(self, func: Callable, args: tuple, kwargs: dict, call: Optional[AttentionCall]) -> torch.Tensor:
        first = call.q if call is not None else (args[0] if args else None)
        route = self._fallback_route(self.arch_for(first.device) if isinstance(first, torch.Tensor)
                                     else self.arch_override)
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

    @property
    def redo_reason(self) -> Optional[str]:
        """Why this thread's forward runs on ComfyUI's attention (the non-finite guard), or None."""
        return self.redo.reason

    def dispatch(self, func: Callable, args: tuple, kwargs: dict) -> torch.Tensor:
        if self.redo.reason is not None:  # the non-finite guard redoes this forward on ComfyUI's attention
            self.runs.fallback(self.redo.reason)
            return self.run_fallback(func, args, kwargs, None)
        if torch.is_grad_enabled() and needs_grad(args):  # False while ComfyUI samples (inference mode)
            self.runs.fallback(NEEDS_GRAD)
            return self.run_fallback(func, args, kwargs, None)
        if self.sparse is not None:
            out = self.sparse.dispatch(self, args, kwargs)
            if out is not NOT_SPARSE:
                return out
        key = call_signature(args, kwargs)
        if key is not None:
            s, calls = self.settings, self._calls
            if s.full_precision_first_steps > 0 or s.full_precision_last_steps > 0:
                key = (key, self._full_precision_step(kwargs.get("transformer_options") or {}))
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
                if route == COMFY:
                    self.runs.fallback(decision.reason)
                    return func(*args, **kwargs) if previous is None else previous(func, *args, **kwargs)
                if route == COMFY_MATH:
                    self.runs.fallback(decision.reason)
                    return self._call_comfy_side(func, args, kwargs, math_only=True)
                if route == KERNEL and decision.variant not in _disabled_variants:
                    call = bind_call(args, kwargs)
                    return self._kernel_or_fallback(func, args, kwargs, call, decision.plan,
                                                    normalize_mask(call)[0], decision.variant)
        return self._dispatch_checked(func, args, kwargs, key)

    def _dispatch_checked(self, func: Callable, args: tuple, kwargs: dict, key: Optional[tuple]) -> torch.Tensor:
        """The full checks; their decision is remembered under ``key`` (``call_cache``)."""
        try:
            call = bind_call(args, kwargs)
        except (TypeError, ValueError, AttributeError) as e:
            self.runs.fallback("unrecognised call signature", str(e))
            return self.run_fallback(func, args, kwargs, None)
        reason, plan = self._decide(call)
        reached = plan if plan is not None and plan.config is not None else None
        if reason is None:
            mask = normalize_mask(call)[0]
            variant = _variant_key(plan, self.settings, call, mask)
            if key is not None:
                self._calls.put(key, Decision(None, KERNEL, reached, variant))
            if variant not in _disabled_variants:
                return self._kernel_or_fallback(func, args, kwargs, call, plan, mask, variant)
            reason = VARIANT_DISABLED
        elif key is not None:
            self._calls.put(key, Decision(reason, self._fallback_route(self.arch_for(call.q.device)), reached, None))
        self.runs.fallback(reason)
        return self.run_fallback(func, args, kwargs, call)

    def _kernel_or_fallback(self, func: Callable, args: tuple, kwargs: dict, call: AttentionCall,
                            plan: KernelPlan, mask, variant: tuple) -> torch.Tensor:
        """The kernel's output (counted); after a kernel failure the fallback's, and ``variant`` is turned off."""
        try:
            out = self.run_kernel(call, plan, mask)
        except torch.OutOfMemoryError:
            raise  # the fallback would need the memory too; let ComfyUI report it
        except Exception as e:  # compile or launch failure: never fail the run
            # A call ComfyUI's attention refuses too was the caller's fault: its error goes up, the variant stays on.
            out = self.run_fallback(func, args, kwargs, call)
            refused = caller_error(call, mask)
            if refused is not None:  # arguments the checks above let by: still the caller's, not a kernel fault
                self.runs.fallback(REFUSED_ARGUMENTS, refused)
                return out
            disable_variant(variant, plan, e)
            self.runs.fallback(VARIANT_DISABLED)
            return out
        self.runs.kernel()
        return out


def needs_grad(args: tuple) -> bool:
    """Whether q, k or v (tensors or containers) takes part in autograd: the kernel has no backward."""
    for t in args[:3]:
        if not isinstance(t, torch.Tensor):
            peek = getattr(t, "peek", None)
            t = peek() if callable(peek) else None
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def caller_error(call: AttentionCall, mask) -> Optional[str]:
    """What ``sageattn`` refuses in this call's arguments before any launch (the caller's mistake), or None."""
    from ...kernels.api import argument_error

    q, k, v, layout = kernel_inputs(call)
    error = argument_error(q, k, v, layout, sm_scale=call.extra.get("scale"), attn_mask=mask)
    return None if error is None else f"{type(error).__name__}: {error}"


def disable_variant(variant: tuple, plan: KernelPlan, error: Exception) -> None:
    """Turn ``variant`` off until ComfyUI restarts, after a kernel failure on a well-formed call."""
    _disabled_variants[variant] = root_cause(error)
    logger.warning("[SageTriton] kernel %s failed on %s (%s); this variant is disabled until ComfyUI restarts, "
                   "the fallback runs instead.", plan.config, plan.arch.arch, _disabled_variants[variant])


def disabled_variants() -> dict[tuple, str]:
    """Kernel variants disabled in this process after a failure, with the cause."""
    return dict(_disabled_variants)
