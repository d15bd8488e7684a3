"""The host pipeline of one ``sageattn`` call on an already-resolved config: plan (shapes, outputs, kernel
choice), quantization launches (``host_quant``), the attention launch (portable kernel, or Hopper's Gluon
kernel through ``hopper_host``), and the replay of a recorded call (``replay``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import attention as attn
from . import hopper_host, launch, quant, replay, rotation
from .arch import KernelConfig, interpreter_enabled
from .checks import _as_bhld, _check_inputs, _check_scale, _check_shapes, _out_shape, _prepare_mask, check_config
from .devices import device_scope, wrapped
from .footprint import head_dim_padded
from .hopper_logits import K_PER_GROUP
from .host_quant import _kv_stats, _prepare_v, _quantize_qk, _v_range, _v_stats_needed
from .launch import _cdiv, _launch, _pdl_launch
from .rotation import ROTATION_BLOCK


@dataclass
class _CallPlan:
    """One call's shapes, output buffers and kernel choice, before anything is launched."""

    qh: torch.Tensor  # q, k, v as (B, H, L, D) views
    kh: torch.Tensor
    vh: torch.Tensor
    out: torch.Tensor  # in ``out_layout``; ``oh`` is the same memory seen as (B, H, L, D)
    oh: torch.Tensor
    lse: torch.Tensor
    dims: tuple  # (B, H, H_KV, LQ, LK, D)
    d_pad: int
    sm_scale: float
    k_scalar: bool  # one K scale per key tile
    pdl: bool
    shared_kv: Optional[tuple]  # the Gluon kernel's plan (``hopper_host.shared_kv_plan``), None: the portable one
    out_layout: str = "HND"
    dtype: torch.dtype = torch.float16
    mask_view: Optional[torch.Tensor] = None  # the mask as the attention launch got it (``replay`` slot)
    k_layout: int = 0  # how K's scales are laid out (``hopper_host.k_layout``)


@dataclass
class _Quantized:
    """The quantization launches' outputs, the attention kernel's inputs."""

    q8: torch.Tensor
    qs: torch.Tensor
    qbias: Optional[torch.Tensor]
    k8: torch.Tensor
    ks: torch.Tensor
    v_op: torch.Tensor
    v_strides: tuple
    v_scale: Optional[torch.Tensor]
    v_mean: Optional[torch.Tensor]
    pv_mode: int
    p_scale: float
    v_tile_bias: Optional[torch.Tensor]  # INT8 P·V: per key tile (``_prepare_v``)


def attention_forward(q, k, v, layout: str, is_causal: bool, sm_scale: Optional[float], attn_mask,
                      return_lse: bool, cfg: KernelConfig, smooth_k: bool, smooth_v: bool,
                      out_layout: Optional[str] = None):
    """Run the kernels for an already-resolved config. Returns (out in ``out_layout``, default
    ``layout``; lse or empty). A call with the shapes and options of a recent one replays its launches
    (``replay``): no host work but the output's allocation and the launches."""
    check_config(cfg)
    return _run([q, k, v], layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
                release=False)


def attention_forward_taking(inputs: list, layout: str, is_causal: bool, sm_scale: Optional[float], attn_mask,
                             cfg: KernelConfig, smooth_k: bool, smooth_v: bool, out_layout: Optional[str] = None):
    """``attention_forward`` for a caller that hands over its only references to q, k, v in ``inputs``
    (emptied here): each float input is dropped once quantized and the output is allocated after
    that, so the call's peak holds at most one quantized copy beside the floats (ComfyUI's
    single-owner q, k, v containers). Calls small enough to replay (``replay.worth_recording``) keep
    their inputs to the end instead, as a recording needs. Returns the output only."""
    return _run(inputs, layout, is_causal, sm_scale, attn_mask, False, cfg, smooth_k, smooth_v, out_layout,
                release=True)[0]


def _run(inputs: list, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
         release: bool, in_op: bool = False, checked: bool = False):
    """The call on its inputs' device (``devices``); wrapper subclasses through the custom op, which
    waits on and unwraps them (``in_op``: this is that op's implementation). ``checked``: the caller
    (``sageattn``) already ran ``_check_inputs`` and ``_check_scale`` (``sm_scale`` is its float): each call
    is validated once; the shapes (``_check_shapes``) and ``out_layout`` are checked here either way."""
    if wrapped(*inputs, attn_mask):
        if in_op or launch.hook is not None:
            kind = type(next(t for t in (*inputs, attn_mask) if wrapped(t))).__name__
            raise TypeError(f"sageattn cannot read a {kind} by pointer and its dispatch did not unwrap it: "
                            "pass plain tensors")
        from .custom_op import _op_config, attention_op  # the op's implementation is this module's ``_run``

        q, k, v = inputs
        inputs.clear()
        return attention_op(q, k, v, layout, bool(is_causal), float(_check_scale(sm_scale, q.shape[-1])), attn_mask,
                            bool(return_lse), *_op_config(cfg), bool(smooth_k), bool(smooth_v), out_layout or layout,
                            checked)
    with device_scope(inputs[0].device):
        return _run_on_device(inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                              out_layout, release, checked)



def _run_on_device(inputs: list, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                   out_layout, release: bool, checked: bool = False):
    """Replay a recorded call, or work the call out in full (recording it where it may be replayed)."""
    key = None
    # A negative scale quantizes a negated copy of q (``_plan_call``), which a replay would not make.
    if launch.hook is None and replay.worth_recording(*inputs) and not (
            isinstance(sm_scale, (int, float)) and sm_scale < 0):
        key = replay.call_key(*inputs, attn_mask, cfg, (layout, out_layout, is_causal, sm_scale, return_lse,
                                                        smooth_k, smooth_v, hopper_host.TUNING["k_groups"]))
    if key is None or replay.refused(key):
        plan = _forward(inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                        out_layout, release=release, checked=checked)
        return plan.out, plan.lse
    rec = replay.lookup(key, cfg)
    if rec is not None:
        q, k, v = inputs
        inputs.clear()
        return _replay_call(rec, q, k, v, layout, out_layout or layout, attn_mask, return_lse)
    gluon_error = hopper_host.errors()
    replay.start()
    try:
        plan = _forward(inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v,
                        out_layout, release=False, checked=checked)
    finally:
        launches = replay.stop()
    # Not recorded when a Gluon kernel failed and the portable one took over.
    if hopper_host.errors() == gluon_error:
        turns = plan.shared_kv[3] if plan.shared_kv is not None else None
        replay.record(key, cfg, launches, (plan.qh, plan.kh, plan.vh, plan.oh, plan.lse, plan.mask_view),
                      zero=(turns,) if turns is not None else (), lse=None if return_lse else plan.lse)
    return plan.out, plan.lse


def _replay_call(rec, q, k, v, layout: str, out_layout: str, attn_mask, return_lse: bool):
    """A recorded call's launches on these inputs and a new output (``replay``)."""
    qh, kh, vh = _as_bhld(q, layout), _as_bhld(k, layout), _as_bhld(v, layout)
    B, H, LQ, D = qh.shape
    out = torch.empty(_out_shape(B, H, LQ, D, out_layout), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, LQ), dtype=torch.float32, device=q.device) if return_lse else rec.lse
    mask = attn_mask.expand(B, H, LQ, kh.shape[2]) if attn_mask is not None else None
    rec.replay((qh, kh, vh, _as_bhld(out, out_layout), lse, mask))
    return out, lse


def _forward(inputs: list, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
             release: bool, checked: bool = False) -> _CallPlan:
    """The call's host work and launches; its plan holds the output. ``release``: ``inputs`` holds the
    only references to q, k, v (``attention_forward_taking``)."""
    plan = _plan_call(*inputs, layout, is_causal, sm_scale, attn_mask, return_lse, cfg, out_layout,
                      defer_out=release, checked=checked)
    inputs.clear()
    if plan.dims[3] == 0:
        _allocate_out(plan)
        return plan
    qz = _quantize(plan, cfg, smooth_k, smooth_v, return_lse, release)
    _allocate_out(plan)
    if plan.shared_kv is not None:
        B, H, H_KV, LQ, LK, D = plan.dims
        if hopper_host.run_shared_kv(qz.q8, qz.qs, qz.k8, qz.ks, qz.v_op, qz.v_scale, qz.v_mean, qz.v_tile_bias,
                                     plan.oh, (H, H_KV, LQ, LK, D), math.log2(qz.p_scale), cfg.v_residual,
                                     plan.shared_kv, plan.pdl, lse=plan.lse if return_lse else None, qbias=qz.qbias,
                                     k_cols=plan.k_layout):
            return plan
    _launch_attention(plan, qz, cfg, is_causal, attn_mask, return_lse)
    return plan



def _plan_call(q, k, v, layout, is_causal, sm_scale, attn_mask, return_lse, cfg: KernelConfig,
               out_layout, defer_out: bool = False, checked: bool = False) -> _CallPlan:
    """Check the inputs (``checked``: ``sageattn`` checked them, all but the shapes), allocate the outputs and
    choose the attention kernel."""
    if not checked:
        _check_inputs(q, k, v, layout, attn_mask, is_causal)
    out_layout = out_layout or layout
    if out_layout not in ("HND", "NHD"):
        raise ValueError(f"out_layout must be 'HND' or 'NHD', got {out_layout!r}")
    qh, kh, vh = _as_bhld(q, layout), _as_bhld(k, layout), _as_bhld(v, layout)
    _check_shapes(qh, kh, vh)
    B, H, LQ, D = qh.shape
    H_KV, LK = kh.shape[1:3]
    if not checked:
        sm_scale = _check_scale(sm_scale, D)
    if sm_scale < 0:
        # Q·Kᵀ·s = (-Q)·Kᵀ·|s|: the kernels' scales stay positive, as their integer row max needs.
        qh, sm_scale = -qh, -sm_scale

    out = oh = None
    if not defer_out:
        out = torch.empty(_out_shape(B, H, LQ, D, out_layout), dtype=q.dtype, device=q.device)
        oh = _as_bhld(out, out_layout)  # the kernels write through strides: either layout costs the same
    lse = torch.empty((B, H, LQ) if return_lse else (0,), dtype=torch.float32, device=q.device)
    # The Gluon kernel's workspace is allocated here, before the quantization launches, so that no fill
    # runs between them and the kernel (with ``pdl`` each launch may start as the one before it ends).
    shared_kv = None
    errors = hopper_host.errors()
    if LQ and hopper_host.uses_long_sequence_kernel(cfg, LQ, D, attn_mask is not None, is_causal, return_lse) and not (
            return_lse and errors[1] is not None) and not (cfg.group_sizes()[1] == 1 and errors[2] is not None):
        shared_kv = hopper_host.shared_kv_plan(B * H, LQ, LK, q.device)
    return _CallPlan(qh, kh, vh, out, oh, lse, (B, H, H_KV, LQ, LK, D), head_dim_padded(D), sm_scale,
                     cfg.group_sizes()[1] == cfg.block_n, cfg.pdl and not interpreter_enabled(), shared_kv,
                     out_layout, q.dtype, k_layout=hopper_host.k_layout(cfg, shared_kv))


def _allocate_out(plan: _CallPlan) -> None:
    """The output buffer, where ``_plan_call`` deferred it (no fill: nothing is launched)."""
    if plan.out is None:
        B, H, _, LQ, _, D = plan.dims
        plan.out = torch.empty(_out_shape(B, H, LQ, D, plan.out_layout), dtype=plan.dtype, device=plan.lse.device)
        plan.oh = _as_bhld(plan.out, plan.out_layout)


def _quantize(plan: _CallPlan, cfg: KernelConfig, smooth_k: bool, smooth_v: bool, return_lse: bool,
              release: bool = False) -> _Quantized:
    """K/V statistics, then INT8 Q (which finalizes the statistics), INT8 K and the converted V.
    ``release``: the plan holds the only references to the float inputs; each is dropped once its
    launch is queued (the allocator reuses the block only for work queued after it)."""
    qh, kh, vh, d_pad, pdl = plan.qh, plan.kh, plan.vh, plan.d_pad, plan.pdl
    B, H, H_KV, LQ, LK, D = plan.dims
    q_group, k_group = cfg.group_sizes()
    rotate = min(d_pad, ROTATION_BLOCK) if cfg.qk_rotation else 0
    v_stats = _v_stats_needed(cfg, smooth_v)
    method = rotation.method_for(cfg.rotation_tiles, qh.dtype, kh.dtype, D, d_pad) if rotate else "dot"
    parts, n_parts, k_tokens = _kv_stats(kh, vh, smooth_k, v_stats, d_pad, pdl)
    stats = final = None
    if parts is not None:
        # K mean, V scale, V mean (and the tiled rotation's mean·H, ``quant.ROTATED_MEAN_SLOT``)
        final = torch.empty((4 if method == "tiled" else 3, B * H_KV, D),
                            dtype=torch.float32, device=qh.device)
        stats = (parts, n_parts, LK, k_tokens, final)
    # Q first: its launch finalizes the statistics the K and V launches read. Q scales stay per token
    # (a row vector loaded once per program); K scales are one scalar per tile whenever the
    # granularity allows, which saves a multiply per logit in the inner loop.
    qbias = torch.empty((B * H, LQ), dtype=torch.float32, device=qh.device) if (smooth_k and return_lse) else None
    # Rotating Q: 128 rows per program, the signs' load shared by more rows (scales stay per token).
    q_block = rotation.q_rows(method, cfg.block_m) if rotate else cfg.block_m
    q8, qs = _quantize_qk(qh, q_group, q_block, d_pad, plan.sm_scale * quant.LOG2E,
                          quant.MEAN_DOT if qbias is not None else quant.MEAN_NONE, stats, H // H_KV,
                          bias=qbias, bias_mult=plan.sm_scale,
                          finalize=(smooth_k, v_stats, *_v_range(cfg)) if stats is not None else None,
                          pdl=pdl, after=parts is not None, rotate=rotate, method=method)
    if stats is not None:
        # The Q launch has reduced the partials into ``final``, which every later launch reads. Freed
        # now, they are not part of the call's peak: the allocator hands the block only to work queued
        # after that launch, and with ``pdl`` those launches store nothing before it has ended.
        stats = (final, 0, LK, k_tokens, final)
        del parts
    if release:
        qh = plan.qh = None
    if plan.k_layout == K_PER_GROUP:  # a scale per key, equal over SageAttention's sm90 groups (hopper_logits)
        k_group = quant.K_SM90_GROUPS
    k8, ks = _quantize_qk(kh, k_group, cfg.block_n, d_pad, 1.0, quant.MEAN_SUBTRACT if smooth_k else quant.MEAN_NONE,
                          stats, per_block=plan.k_scalar, pdl=pdl, rotate=rotate, method=method)
    if release:
        kh = plan.kh = None
    v_op, v_strides, v_scale, v_mean, pv_mode, p_scale, tile_bias = _prepare_v(vh, cfg, smooth_v, d_pad, final, pdl)
    if release and v_op is not vh:  # a converted copy: the kernel never reads the float V
        vh = plan.vh = None
    return _Quantized(q8, qs, qbias, k8, ks, v_op, v_strides, v_scale, v_mean, pv_mode, p_scale, tile_bias)


def _launch_attention(plan: _CallPlan, qz: _Quantized, cfg: KernelConfig, is_causal: bool, attn_mask,
                      return_lse: bool) -> None:
    """The portable attention kernel on the quantized operands."""
    B, H, H_KV, LQ, LK, D = plan.dims
    d_pad, oh, vh = plan.d_pad, plan.oh, plan.vh
    k_desc = v_desc = None
    if cfg.use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k3 = qz.k8.view(B * H_KV, LK, d_pad)
        k_desc = TensorDescriptor(k3, list(k3.shape), list(k3.stride()), [1, cfg.block_n, d_pad])
        if qz.v_op is not vh:  # our own converted buffer: contiguous rows, 16-byte aligned
            block = [1, d_pad, cfg.block_n] if qz.pv_mode in (attn.PV_FP8, attn.PV_INT8) else [1, cfg.block_n, d_pad]
            v_desc = TensorDescriptor(qz.v_op, list(qz.v_op.shape), list(qz.v_op.stride()), block)

    mask, mask_kind = _prepare_mask(attn_mask, B, H, LQ, LK)
    plan.mask_view = mask
    dummy = qz.qs
    mask_arg = mask if mask is not None else dummy
    mask_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
    grid = (_cdiv(LQ, cfg.block_m), B * H)
    _launch(attn.attention_kernel, grid, (
        qz.q8, qz.qs, qz.k8, qz.ks, qz.v_op,
        qz.v_scale if qz.v_scale is not None else dummy, qz.v_mean if qz.v_mean is not None else dummy,
        qz.qbias if qz.qbias is not None else dummy, qz.v_tile_bias if qz.v_tile_bias is not None else qz.k8,
        oh, plan.lse, mask_arg, k_desc if k_desc is not None else qz.k8, v_desc if v_desc is not None else qz.k8,
        *qz.v_strides, *oh.stride(), *mask_strides,
        H, H_KV, LQ, LK, D,
    ), dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D_PAD=d_pad,
        IS_CAUSAL=is_causal, MASK_KIND=mask_kind, PV_MODE=qz.pv_mode, P_LOG2=math.log2(qz.p_scale),
        HAS_VSCALE=qz.v_scale is not None, HAS_VMEAN=qz.v_mean is not None, HAS_QBIAS=qz.qbias is not None,
        K_SCALAR=plan.k_scalar, RETURN_LSE=return_lse, EVEN_D=(D == d_pad) or (qz.v_op is not vh),
        INTERPRETER=interpreter_enabled(), K_TMA=k_desc is not None, V_TMA=v_desc is not None,
        V_T=qz.pv_mode in (attn.PV_FP8, attn.PV_INT8), V_RES=qz.pv_mode == attn.PV_FP8 and cfg.v_residual, PDL=plan.pdl,
    ), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **_pdl_launch(plan.pdl),
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}))

