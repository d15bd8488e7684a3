"""The attention override: bind ComfyUI's backend arguments, pick kernel or fallback, run it.

No ComfyUI import here: everything is plain functions and one state object, so the rules can be
tested without ComfyUI. ComfyUI calls ``override(func, *args, **kwargs)`` where ``func`` is the
backend the model wanted and ``args/kwargs`` follow
``(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kwargs)``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..kernels.arch import ArchInfo, KernelConfig, arch_for_device, interpreter_enabled, resolve_config
from ..kernels.log import logger
from ..kernels.selftest import CROSSOVER_BATCH, CROSSOVER_HEADS
from . import fallback as fb
from .install_report import NoReport
from .schedule import is_full_precision_step
from .settings import DEFAULT_SETTINGS, MIN_SEQ_LEN_MEASURED, SageSettings
from .stats import RunTally, record_fallback, record_kernel

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
# kwargs ComfyUI adds that do not change what attention computes.
PASSIVE_KWARGS = frozenset({"transformer_options", "_inside_attn_wrapper"})
# kwargs we understand: scale -> sm_scale, enable_gqa (kernel does GQA), low_precision_attention.
HANDLED_KWARGS = frozenset({"scale", "enable_gqa", "low_precision_attention"})

# Fallback reasons that are routing policy, not problems: logged at INFO, the others at WARNING.
POLICY_REASONS = ("key length <", "work per call <", "full-precision step", "accuracy-critical call")
# The crossover (install.py's measurement, or the arch table's) is where the kernel beat SDPA for
# calls of this many batch x heads: calls with less work per call are outside what was measured. On
# the H200 the kernel won by 2 % at 4,096 tokens and head_dim 64 with 2 x 24 heads, yet SDXL's
# 4,096-token calls (2 x 10 heads) made its forward 10 % slower (bench/NOTES.md, crossover).
CROSSOVER_CALL_HEADS = CROSSOVER_BATCH * CROSSOVER_HEADS

# Kernel variants that failed to compile or run: disabled until ComfyUI restarts. key -> cause.
_disabled_variants: dict[tuple, str] = {}
# Reasons already logged for calls outside a sampling run (no run tally to remember them).
_warned_outside_runs: set[str] = set()


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
    return t if t.ndim == 4 else t.unflatten(-1, (heads, t.shape[-1] // heads))


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
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        return None, f"mask dtype {str(mask.dtype).replace('torch.', '')}"
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


def _variant_key(arch: ArchInfo, cfg: KernelConfig, settings: SageSettings, call: AttentionCall, mask) -> tuple:
    return (arch.arch, cfg.qk_quant_gran, cfg.pv_choice(), cfg.pv_accum_dtype, settings.smooth_k, settings.smooth_v,
            call.q.dtype, call.head_dim, None if mask is None else mask.dtype)


class PatchState:
    """Everything one patched MODEL's override needs, shared by the override and the run wrapper.

    The override is a closure over this object (not an instance with ``__call__``): ComfyUI
    deep-copies model_options on clone, and a function survives that as the same object.
    """

    def __init__(self, settings: SageSettings = DEFAULT_SETTINGS, previous_override: Optional[Callable] = None,
                 arch: Optional[ArchInfo] = None, node_id: Optional[str] = None,
                 score_budget_bytes: int = fb.DEFAULT_SCORE_BUDGET, report: Optional[NoReport] = None):
        self.settings = settings
        self.previous_override = previous_override
        self.arch_override = arch  # injected for tests (simulated GPUs); None = detect from tensors
        self.node_id = node_id
        self.score_budget_bytes = score_budget_bytes
        self.report = report or NoReport()  # install.py's self-test: crossover, failed variants
        self.run: Optional[RunTally] = None
        self.notes: list[str] = []  # downgrades, shown once and in every run summary
        self.last_config: Optional[KernelConfig] = None
        self.last_arch: Optional[ArchInfo] = None
        self.last_min_seq_len: Optional[int] = None
        self._configs: dict[tuple, tuple[Optional[KernelConfig], int]] = {}
        self._step_cache: Optional[tuple[tuple, bool]] = None
        # head_dim -> (min key length, reason): calls known to go to ComfyUI's own attention by length
        # alone skip argument binding (short self- and cross-attention is most calls in a UNet).
        self._short_calls: dict[int, tuple[int, str]] = {}

    # --- configuration -------------------------------------------------------------------------
    def arch_for(self, device: torch.device) -> ArchInfo:
        return self.arch_override if self.arch_override is not None else arch_for_device(device)

    def config_for(self, arch: ArchInfo, head_dim: int) -> tuple[Optional[KernelConfig], int]:
        """Resolved kernel config (None: no variant works here) and the key-length threshold."""
        key = (arch, head_dim)
        if key not in self._configs:
            cfg, notes = resolve_config(arch, head_dim, **self.settings.explicit_kernel_choices())
            if self.report.variant_failed(arch, cfg):
                cfg, note = self._working_variant(arch, cfg)
                notes.append(note)
            if cfg is not None and cfg.shared_kv_min_len and self.report.long_sequence_kernel_failed(arch):
                cfg = cfg.replace(shared_kv_min_len=0)
                notes.append(f"the long-sequence (Gluon) kernel failed the install self-test on {arch.arch}; "
                             "the portable kernel serves every call")
            for note in notes:
                self._note(note)
            self._configs[key] = (cfg, self._min_seq_len(arch, cfg, head_dim) if cfg is not None else 0)
        cfg, min_len = self._configs[key]
        if cfg is not None:
            self.last_config, self.last_arch, self.last_min_seq_len = cfg, arch, min_len
        return cfg, min_len

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

    def _min_seq_len(self, arch: ArchInfo, cfg: KernelConfig, head_dim: int) -> int:
        if self.settings.min_seq_len != MIN_SEQ_LEN_MEASURED:
            return self.settings.min_seq_len
        measured = self.report.crossover(arch, cfg, head_dim)
        return cfg.min_seq_len if measured is None else int(measured)

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

    # --- run bookkeeping -------------------------------------------------------------------------
    def begin_run(self) -> None:
        self.run = RunTally()
        self._step_cache = None

    def end_run(self) -> Optional[RunTally]:
        run, self.run = self.run, None
        return run

    def count_fallback(self, reason: str, detail: str = "") -> None:
        if record_fallback(reason, self.run) or self.run is None:
            self._log_fallback(reason, detail)

    def _log_fallback(self, reason: str, detail: str = "") -> None:
        """Once per run (the first time ``reason`` is counted in it), or once per process outside runs."""
        if self.run is None and reason in _warned_outside_runs:
            return
        _warned_outside_runs.add(reason)
        policy = reason.startswith(POLICY_REASONS)
        log = logger.info if policy else logger.warning
        log("[SageTriton] attention falls back (%s)%s.", reason, f": {detail}" if detail else "")

    # --- the decision ------------------------------------------------------------------------------
    def fallback_reason(self, call: AttentionCall) -> tuple[Optional[str], Any]:
        """None and the kernel plan when the kernel takes the call; else the reason to fall back."""
        extra = call.semantic_kwargs
        if extra.get("low_precision_attention", True) is False:
            return "accuracy-critical call (low_precision_attention=False)", None
        unknown = sorted(set(extra) - HANDLED_KWARGS)
        if unknown:
            return f"unsupported argument {unknown[0]!r}", None
        q, k, v = call.q, call.k, call.v
        if not device_supported(q.device):
            return f"{q.device.type} device is not a CUDA/ROCm GPU", None
        if q.dtype not in KERNEL_DTYPES:
            return f"dtype {str(q.dtype).replace('torch.', '')}", None
        if k.dtype != q.dtype or v.dtype != q.dtype:
            return "q, k, v dtypes differ", None
        if call.attn_precision == torch.float32:
            return "fp32 attn_precision requested", None
        if not (1 <= call.head_dim <= MAX_HEAD_DIM) or call.q_len == 0 or call.k_len == 0:
            return f"head_dim {call.head_dim} outside 1..{MAX_HEAD_DIM}", None
        if call.kv_heads < 1 or call.heads % call.kv_heads:
            return "query heads not a multiple of key heads", None
        if call.v_head_dim != call.head_dim:
            return "v head size differs from q/k", None
        mask, why = normalize_mask(call)
        if why:
            return why, None
        if self._full_precision_step(call.transformer_options):
            return "full-precision step", None
        arch = self.arch_for(q.device)
        cfg, min_len = self.config_for(arch, call.head_dim)
        if cfg is None:
            return "no kernel variant passed the install self-test", None
        if call.k_len < min_len:
            reason = f"key length < {min_len}"
            if fb.resolve_fallback_kind(self.settings.fallback, arch) == "comfy":
                self._short_calls[call.head_dim] = (min_len, reason)
            return reason, None
        if (self.settings.min_seq_len == MIN_SEQ_LEN_MEASURED
                and call.batch * call.heads * call.q_len * call.k_len < CROSSOVER_CALL_HEADS * min_len * min_len):
            return f"work per call < {CROSSOVER_CALL_HEADS} x {min_len}² (batch x heads x Lq x Lk)", None
        key = _variant_key(arch, cfg, self.settings, call, mask)
        if key in _disabled_variants:
            return "kernel failed (variant disabled until restart)", None
        return None, (arch, cfg, mask, key)

    # --- running -----------------------------------------------------------------------------------
    def run_kernel(self, call: AttentionCall, cfg: KernelConfig, mask) -> torch.Tensor:
        from ..kernels import sageattn  # imported on first use: keeps node import cheap

        q, k, v, layout = kernel_inputs(call)
        # Written straight in the memory order ComfyUI returns, so comfy_output is a view: Flux's
        # (B, H, L, D) inputs would otherwise pay a transposing copy of the output per call.
        out_layout = "HND" if call.skip_output_reshape else "NHD"
        out = sageattn(q, k, v, tensor_layout=layout, is_causal=False, sm_scale=call.extra.get("scale"),
                       attn_mask=mask, qk_quant_gran=cfg.qk_quant_gran, pv_precision=cfg.pv_choice(),
                       pv_accum_dtype=cfg.pv_accum_dtype, smooth_k=self.settings.smooth_k,
                       smooth_v=self.settings.smooth_v, out_layout=out_layout)
        return comfy_output(out, out_layout, call)

    def run_fallback(self, func: Callable, args: tuple, kwargs: dict, call: Optional[AttentionCall]) -> torch.Tensor:
        first = call.q if call is not None else (args[0] if args else None)
        arch = self.arch_for(first.device) if isinstance(first, torch.Tensor) else self.arch_override
        kind = fb.resolve_fallback_kind(self.settings.fallback, arch,
                                        self.report.sdpa_default_safe(arch) if fb.is_rdna4(arch) else None)
        if call is None or kind == "comfy":
            return self._call_comfy_side(func, args, kwargs, math_only=kind == "math")
        if kind == "math" and self.previous_override is not None and self.settings.fallback == "auto":
            # RDNA4 with an earlier override: it stays our fallback, but never reaches SDPA's flash path.
            return self._call_comfy_side(func, args, kwargs, math_only=True)
        mask, _ = normalize_mask(call)
        q, k, v = hnd_inputs(call)
        upcast = call.attn_precision == torch.float32
        scale = call.extra.get("scale")
        if kind == "math":
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

    def short_call_reason(self, args: tuple, kwargs: dict) -> Optional[str]:
        """The fallback reason for a call that is too short for the kernel, from shapes alone, once a
        call of the same head size has been fully checked; None when the full check must run."""
        if not self._short_calls or len(args) < 2 or "low_precision_attention" in kwargs:
            return None
        q, k = args[0], args[1]
        heads = args[3] if len(args) > 3 else kwargs.get("heads")
        if not isinstance(heads, int) or not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            return None
        if kwargs.get("skip_reshape", False):
            head_dim, k_len = q.shape[-1], k.shape[2]
        else:
            head_dim, k_len = q.shape[-1] // heads, k.shape[1]
        entry = self._short_calls.get(head_dim)
        return entry[1] if entry is not None and k_len < entry[0] else None

    def dispatch(self, func: Callable, args: tuple, kwargs: dict) -> torch.Tensor:
        reason = self.short_call_reason(args, kwargs)
        if reason is not None:  # no binding, no checks
            self.count_fallback(reason)
            return self._call_comfy_side(func, args, kwargs, math_only=False)
        try:
            call = bind_call(args, kwargs)
        except (TypeError, ValueError, AttributeError) as e:
            self.count_fallback("unrecognised call signature", str(e))
            return self.run_fallback(func, args, kwargs, None)
        reason, plan = self.fallback_reason(call)
        if reason is None:
            arch, cfg, mask, key = plan
            try:
                out = self.run_kernel(call, cfg, mask)
            except torch.OutOfMemoryError:
                raise  # the fallback would need the memory too; let ComfyUI report it
            except Exception as e:  # compile or launch failure: never fail the run
                _disabled_variants[key] = f"{type(e).__name__}: {e}"
                logger.warning("[SageTriton] kernel %s failed on %s (%s); this variant is disabled until ComfyUI "
                               "restarts, the fallback runs instead.", cfg, arch.arch, _disabled_variants[key])
                reason = "kernel failed (variant disabled until restart)"
            else:
                record_kernel(self.run)
                return out
        self.count_fallback(reason)
        return self.run_fallback(func, args, kwargs, call)


def make_attention_override(state: PatchState) -> Callable:
    """The function ComfyUI calls as ``optimized_attention_override(func, *args, **kwargs)``."""

    def sagetriton_attention_override(func, *args, **kwargs):
        return state.dispatch(func, args, kwargs)

    sagetriton_attention_override.sagetriton_state = state  # lets a second patch node replace, not stack
    return sagetriton_attention_override


def disabled_variants() -> dict[tuple, str]:
    """Kernel variants disabled in this process after a failure, with the cause."""
    return dict(_disabled_variants)
