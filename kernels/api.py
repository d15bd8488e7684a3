"""``sageattn``: the public entry point, call-compatible with ``sageattention.sageattn``.

The public API: options resolved per GPU (``arch``), then the host pipeline (``host``: plan, quantization
launches in ``host_quant``, the attention launch, Hopper's long-sequence kernel in ``hopper_host``), directly
or through the custom op ``sagetriton::attention`` (``custom_op``) that ``torch.compile(fullgraph=True)``
traces. Argument checks live in ``checks``, the one launch path in ``launch``.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .arch import KernelConfig, arch_for_device, resolve_config
from .checks import GRID_Y_LIMIT, _as_bhld, _check_inputs, _check_scale, _out_shape, argument_error, check_config
from .custom_op import _op_config, attention_op
from .devices import sm_count, wrapped
from .hopper_host import shared_kv_error, uses_long_sequence_kernel
from .host import _run, attention_forward, attention_forward_taking
from .host_quant import _prepare_v, _quantize_qk, _rotation_signs, _v_range, _v_stats_needed
from .launch import _launch, set_launch_hook
from .log import logger

# ``sageattn`` and the names the nodes, the installer, the sparse host and the benchmarks reach through ``api``;
# each lives in the module it is imported from.
__all__ = ["sageattn", "attention_forward", "attention_forward_taking", "argument_error", "check_config",
           "GRID_Y_LIMIT", "sm_count", "shared_kv_error", "uses_long_sequence_kernel", "set_launch_hook",
           "attention_op", "_launch", "_as_bhld", "_out_shape", "_prepare_v", "_quantize_qk", "_rotation_signs",
           "_v_range", "_v_stats_needed", "_resolved_config"]
_warned: set = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        logger.warning("[SageTriton] %s", msg)


@functools.lru_cache(maxsize=256)
def _resolved_config(arch, head_dim: int, qk_quant_gran, pv_precision, pv_accum_dtype,
                     qk_rotation=None) -> KernelConfig:
    """The config for one (GPU, head size, options): resolved once, its downgrade notes logged once."""
    cfg, notes = resolve_config(arch, head_dim, qk_quant_gran, pv_precision, pv_accum_dtype, qk_rotation)
    for note in notes:
        _warn_once(note)
    return cfg


def sageattn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensor_layout: str = "HND",
             is_causal: bool = False, sm_scale: Optional[float] = None,
             attn_mask: Optional[torch.Tensor] = None, return_lse: bool = False, *,
             qk_quant_gran: Optional[str] = None, pv_precision: Optional[str] = None,
             pv_accum_dtype: Optional[str] = None, smooth_k: bool = True, smooth_v: bool = False,
             out_layout: Optional[str] = None, config: Optional[KernelConfig] = None,
             qk_rotation: Optional[bool] = None):
    """Quantized scaled-dot-product attention.

    q: (B, Hq, Lq, D) for ``tensor_layout="HND"`` or (B, Lq, Hq, D) for ``"NHD"``; k, v likewise
    with Hkv heads (Hq a multiple of Hkv) and Lk tokens. fp16/bf16 in, same dtype out; fp32 inputs
    are quantized straight from fp32, P·V runs in bf16, and the output is fp32. ``attn_mask`` is a
    boolean (True = attend) or additive float mask broadcastable to (B, Hq, Lq, Lk), with torch SDPA
    semantics. Options left as ``None`` take this GPU's defaults (``kernels.arch``). ``out_layout``
    ("HND" or "NHD", default ``tensor_layout``): the output is written in that layout directly, so a
    caller that wants the other one (ComfyUI's (B, L, H·D) from (B, H, L, D) inputs) needs no
    transposing copy. ``config``: a config the caller already resolved (the nodes' dispatcher, with
    its downgrades, install self-test results and arch override); it is run as given, and the option
    names must then be left as ``None``. ``qk_rotation``: multiply Q and K by a block Hadamard matrix
    before INT8 rounding (exact for Q·Kᵀ; spreads outlier channels); ``None``: this GPU's default (on).

    Returns ``out`` or, with ``return_lse``, ``(out, lse)`` where lse is the natural-log
    log-sum-exp per (B, Hq, Lq) in fp32.
    """
    _check_inputs(q, k, v, tensor_layout, attn_mask, is_causal)
    for name, opt in (("qk_quant_gran", qk_quant_gran), ("pv_precision", pv_precision),
                      ("pv_accum_dtype", pv_accum_dtype)):
        if opt is not None and not isinstance(opt, str):
            raise TypeError(f"{name} must be a string or None, got {type(opt).__name__} {opt!r}")
    if qk_rotation is not None and not isinstance(qk_rotation, bool):
        raise TypeError(f"qk_rotation must be True, False or None, got {type(qk_rotation).__name__} {qk_rotation!r}")
    B, H = q.shape[0], q.shape[1 if tensor_layout == "HND" else 2]
    if B * H > GRID_Y_LIMIT:  # every launch has B·H programs on grid y (65,535 at most on CUDA): split the batch
        if H > GRID_Y_LIMIT:
            raise ValueError(f"H = {H} query heads exceed {GRID_Y_LIMIT} (the GPU's grid limit); split the heads")
        step = GRID_Y_LIMIT // H
        parts = [sageattn(q[i:i + step], k[i:i + step], v[i:i + step], tensor_layout, is_causal, sm_scale,
                          attn_mask[i:i + step] if attn_mask is not None and attn_mask.dim() == 4
                          and attn_mask.shape[0] == B else attn_mask, return_lse, qk_quant_gran=qk_quant_gran,
                          pv_precision=pv_precision, pv_accum_dtype=pv_accum_dtype, smooth_k=smooth_k,
                          smooth_v=smooth_v, out_layout=out_layout, config=config, qk_rotation=qk_rotation)
                 for i in range(0, B, step)]
        if not return_lse:
            return torch.cat(parts)
        return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])
    if config is None:
        cfg = check_config(_resolved_config(arch_for_device(q.device), q.shape[-1], qk_quant_gran, pv_precision,
                                            pv_accum_dtype, qk_rotation))
    elif qk_quant_gran is None and pv_precision is None and pv_accum_dtype is None and qk_rotation is None:
        cfg = check_config(config)
    else:
        raise ValueError("pass either config or qk_quant_gran / pv_precision / pv_accum_dtype / qk_rotation, "
                         "not both")
    sm_scale = _check_scale(sm_scale, q.shape[-1])
    # The custom op is what torch.compile traces (and what refuses autograd); plain eager calls skip
    # its dispatcher layers, host time that short sequences pay on every call.
    # Wrapper subclasses (AsyncCollectiveTensor) too: the op's dispatch waits on and unwraps them.
    # Checked above, once: the pipeline checks only the shapes; a traced graph's op checks at each run.
    compiling = torch.compiler.is_compiling()
    if compiling or q.requires_grad or k.requires_grad or v.requires_grad or wrapped(q, k, v, attn_mask):
        out, lse = attention_op(q, k, v, tensor_layout, bool(is_causal), float(sm_scale), attn_mask,
                                bool(return_lse), *_op_config(cfg), bool(smooth_k), bool(smooth_v),
                                out_layout or tensor_layout, not compiling)
    else:
        out, lse = _run([q, k, v], tensor_layout, bool(is_causal), sm_scale, attn_mask, bool(return_lse), cfg,
                        bool(smooth_k), bool(smooth_v), out_layout, release=False, checked=True)
    return (out, lse) if return_lse else out
