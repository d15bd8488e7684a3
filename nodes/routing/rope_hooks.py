"""RoPE in the pack's kernel (``kernels.rope``) for the models a Patch node patched.

ComfyUI rotates q and k just before attention inside its model code, where no per-model option reaches:
``comfy.ldm.flux.math``'s ``attention`` (which inlines it up to 0.3.64), ``apply_rope`` and ``apply_rope1``,
and the same functions imported by name into other model modules (Flux, Chroma, HiDream, Wan). Those names
are wrapped once per process. A wrapper does something only while a patched model's forward runs on this
thread (``make_apply_model_wrapper``), and only for inputs the kernel takes; then it computes ComfyUI's fp32
math in one launch instead of five eager passes. Any other call, another model's, a forward redone by the
non-finite guard, a call after the kernel failed once or where install.py's self-test failed it, goes to
ComfyUI's function with its own arguments.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Optional

import torch

from ...kernels import failures
from ...kernels.build_errors import is_oom
from ...kernels.log import logger
from ..reporting import stats
from .dispatch import PatchState

WRAPPER_KEY = "sagetriton_rope"
SOURCE = "comfy.ldm.flux.math"
# The wrapped names and the parameters ComfyUI's functions start with (another signature: left alone).
SIGNATURES = {"attention": ("q", "k", "v", "pe"), "apply_rope": ("xq", "xk", "freqs_cis"),
              "apply_rope1": ("x", "freqs_cis")}

_forward: contextvars.ContextVar[Optional[PatchState]] = contextvars.ContextVar(WRAPPER_KEY, default=None)
_lock = threading.Lock()
_memory = failures.memory  # .rope: why the RoPE kernel failed (ComfyUI's RoPE from then on)
_calls = 0


def calls() -> int:
    """RoPE calls the kernel ran in this process."""
    return _calls


def _freqs_for(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """``freqs`` cut to ``x``'s positions where it holds more, as ComfyUI's ``apply_rope1`` cuts them since
    after 0.3.75 (Flux.2 hands longer ones); older versions would stop on such a call instead."""
    if not isinstance(x, torch.Tensor) or not isinstance(freqs, torch.Tensor) or x.dim() < 3 or freqs.dim() < 3:
        return freqs
    n = (*x.shape[:-1], x.shape[-1] // 2)[2]  # dim 2 of x viewed as pairs: the sequence for (B, H, S, D)
    return freqs[:, :, :n] if n != 1 and freqs.shape[2] not in (1, n) else freqs


def _rope(x, freqs, y=None, fma=True):
    """The kernel's RoPE of ``x`` (and ``y``), or None where ComfyUI's function should run. ``fma``: see
    ``kernels.rope.apply`` (ComfyUI's ``apply_rope1`` rounds that way)."""
    if torch.compiler.is_compiling():
        return _left_to_compiler()
    return _rope_eager(x, freqs, y, fma)


def _left_to_compiler() -> None:
    """A forward torch.compile traces keeps ComfyUI's RoPE: the compiler fuses its passes into its own kernels,
    where ours would be a graph break for no gain. Noted for the run summary (replayed by every compiled run)."""
    state = _forward.get()
    if state is not None:
        state.rope_compiled = True
    return None


@torch.compiler.disable  # eager even where a compiled forward gave this frame up: no tracing of the launch
def _rope_eager(x, freqs, y, fma):
    global _calls
    state = _forward.get()
    if state is None or _memory.rope is not None or getattr(state, "redo_reason", None) is not None:
        return None
    pairs = [(t, _freqs_for(t, freqs)) for t in ((x,) if y is None else (x, y))]
    try:
        from ...kernels import rope  # imports Triton

        if any(rope.unsupported(t, f) for t, f in pairs):
            return None
        if y is None or (y.shape == x.shape and y.device == x.device):
            out = rope.apply(x, pairs[0][1], y, fma=fma)  # one launch for x, and y with it
        else:  # q and k of other lengths (a cache of keys): each with its own positions
            out = tuple(rope.apply(t, f, fma=fma) for t, f in pairs)
    except Exception as exc:  # a build or launch failure must not end the run: ComfyUI's RoPE from now on
        if is_oom(exc):  # says nothing about the kernel: ComfyUI's RoPE this once
            logger.debug("[SageTriton] RoPE kernel out of memory; ComfyUI's RoPE for this call")
            return None
        _memory.rope = f"{type(exc).__name__}: {exc}"
        logger.warning("[SageTriton] the RoPE kernel failed (%s); ComfyUI's own RoPE runs from now on. "
                       "`python install.py` in the SageTriton folder shows what the GPU's Triton build lacks.",
                       _memory.rope.splitlines()[0][:300])
        return None
    stats.record_rope(state.run)
    with _lock:
        if not _calls:
            logger.info("[SageTriton] RoPE of patched models runs in SageTriton's kernel (ComfyUI's fp32 math, "
                        "one launch for q and k)")
        _calls += 1
    return out


def _wrap_attention(original: Callable) -> Callable:
    # ComfyUI up to 0.3.64 inlines its RoPE as a * b + c * d; later versions call apply_rope (addcmul_).
    fma = "apply_rope" in getattr(getattr(original, "__code__", None), "co_names", ())

    @functools.wraps(original)
    def attention(q, k, v, pe, *args, **kwargs):
        same = isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) \
            and q.dtype == k.dtype == v.dtype  # ComfyUI casts the rotated q and k to v's dtype
        out = _rope(q, pe, k, fma) if pe is not None and same else None
        if out is not None:
            return original(out[0], out[1], v, None, *args, **kwargs)  # pe=None: ComfyUI rotates nothing
        return original(q, k, v, pe, *args, **kwargs)

    return attention


def _wrap_apply_rope(original: Callable) -> Callable:
    @functools.wraps(original)
    def apply_rope(xq, xk, freqs_cis):
        out = _rope(xq, freqs_cis, xk) if isinstance(xk, torch.Tensor) and xk.dtype == xq.dtype else None
        return out if out is not None else original(xq, xk, freqs_cis)

    return apply_rope


def _wrap_apply_rope1(original: Callable) -> Callable:
    @functools.wraps(original)
    def apply_rope1(x, freqs_cis):
        out = _rope(x, freqs_cis)
        return out if out is not None else original(x, freqs_cis)

    return apply_rope1


_WRAPPERS = {"attention": _wrap_attention, "apply_rope": _wrap_apply_rope, "apply_rope1": _wrap_apply_rope1}


def _starts_with(fn: Callable, names: tuple) -> bool:
    try:
        return tuple(inspect.signature(fn).parameters)[:len(names)] == names
    except (TypeError, ValueError):
        return False


def install() -> list[str]:
    """Wrap ComfyUI's RoPE functions wherever a ``comfy.ldm`` module holds them (once; later calls only add
    modules imported since). Returns the "module.name" places wrapped so far."""
    source = sys.modules.get(SOURCE)
    if source is None:
        return []
    with _lock:
        for name, params in SIGNATURES.items():
            current = getattr(source, name, None)
            original = getattr(current, "sagetriton_original", current)
            if getattr(original, "__module__", None) != SOURCE or not _starts_with(original, params):
                continue  # gone, or replaced by someone else's function: left as it is
            wrapped = current if current is not original else _WRAPPERS[name](original)
            wrapped.sagetriton_original = original
            for mod_name, mod in list(sys.modules.items()):
                if mod_name.startswith("comfy.ldm.") and getattr(mod, name, None) is original:
                    setattr(mod, name, wrapped)
        return sorted(f"{m}.{n}" for m, mod in list(sys.modules.items()) if m.startswith("comfy.ldm.")
                      for n in SIGNATURES if hasattr(getattr(mod, n, None), "sagetriton_original"))


def make_apply_model_wrapper(state: PatchState) -> Callable:
    """Marks this thread's forward as the patched model's, for the wrapped RoPE functions, unless install.py's
    self-test found the kernel wrong on the input's GPU (asked once per forward, not per RoPE call)."""
    def sagetriton_rope(executor, *args, **kwargs):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and state.report.rope_kernel_failed(state.arch_for(x.device)):
            return executor(*args, **kwargs)
        token = _forward.set(state)
        try:
            return executor(*args, **kwargs)
        finally:
            _forward.reset(token)

    return sagetriton_rope
