"""Hopper's long-sequence (Gluon) kernel on the host side: which calls it takes, its split last wave's plan,
its launches, and the state that turns it off for this process when this Triton cannot build it."""
from __future__ import annotations

from typing import Optional

import torch

from . import devices, failures, footprint, hopper_gluon, hopper_lse, launch, tail_split
from .arch import KernelConfig, interpreter_enabled
from .build_errors import root_cause
from .footprint import head_dim_padded
from .hopper_logits import K_PER_GROUP, K_PER_KEY, K_PER_TILE
from .launch import _launch, _pdl_launch
from .log import logger
from .triton_compat import sm90_ptxas_scope


def uses_long_sequence_kernel(cfg: KernelConfig, q_len: int, head_dim: int, masked: bool, is_causal: bool,
                              return_lse: bool) -> bool:
    """Whether ``cfg`` sends a call to Hopper's Gluon kernel (where this Triton can build it): long
    enough, unmasked, not causal, 8-bit P·V through tensor descriptors, one K scale per tile (or per key
    with FP8 P·V: per_thread, ``hopper_logits``), its fixed tiles; with or without the LSE (``return_lse``
    is kept for callers)."""
    d_pad = head_dim_padded(head_dim)
    return bool(cfg.shared_kv_min_len and q_len >= cfg.shared_kv_min_len and not masked and not is_causal
                and (cfg.group_sizes()[1] == cfg.block_n or (cfg.group_sizes()[1] == 1 and cfg.pv_precision == "fp8"))
                and cfg.pv_precision in ("fp8", "int8")
                and cfg.use_tma and d_pad == hopper_gluon.HEAD_DIM and head_dim % 8 == 0
                and cfg.block_n == hopper_gluon.BLOCK_N and cfg.block_m == hopper_gluon.ROWS)



# per_thread calls on the Gluon kernel: K quantized in SageAttention's sm90 groups (a scale per 128-key tile and
# MMA column group, ``hopper_logits.K_PER_GROUP``) or, False, per token (``K_PER_KEY``, 22 % slower at 8K on
# the H200). A switch for bench/bench_dropin.py's A/B (``--k-scales``); calls in flight keep what they planned.
TUNING = {"k_groups": True}


def k_layout(cfg: KernelConfig, shared_kv) -> int:
    """How a call's K scales are laid out (``hopper_logits.K_PER_*``): per tile where the granularity has one
    per tile, per SageAttention's groups where per-token K runs on the Gluon kernel (``shared_kv``: its plan),
    else per key."""
    if cfg.group_sizes()[1] == cfg.block_n:
        return K_PER_TILE
    return K_PER_GROUP if shared_kv is not None and TUNING["k_groups"] else K_PER_KEY


# Why the Gluon kernel could not run here (then never tried again), and the same for its LSE twins alone (calls
# without the LSE keep it) and its variant with a K scale per key alone (per-tile calls keep it):
# ``failures.memory.gluon``, ``.gluon_lse`` and ``.gluon_kcols``.
_memory = failures.memory


def shared_kv_error() -> Optional[str]:
    """None while Hopper's Gluon kernel works (or was never needed), else why it failed in this process."""
    return _memory.gluon


def errors() -> tuple:
    """(the Gluon kernel's error, its LSE twins' error, its per-key K scales variant's error) in this process,
    None where they work."""
    return _memory.gluon, _memory.gluon_lse, _memory.gluon_kcols


def shared_kv_plan(n_heads: int, LQ: int, LK: int, device):
    """(whole CTAs, shares per tail CTA, split CTAs, hand-over flags, row max/sum workspace) of the Gluon
    kernel's split last wave (``tail_split``) for ``n_heads`` = B·H query heads; None where it cannot run."""
    if _memory.gluon is not None or not hopper_gluon.AVAILABLE or interpreter_enabled():
        return None
    g = hopper_gluon
    ctas_per_head, key_tiles = g.grid(LQ, LK)
    n_cta = ctas_per_head * n_heads
    n_whole, splits = tail_split.plan_tail(n_cta, devices.sm_count(device), key_tiles)
    n_tail = n_cta - n_whole
    # The split shares' hand-over: a ticket counter and a flag per warpgroup of a tail CTA (zeroed),
    # and the rows' max and sum in two buffers.
    turns = (torch.zeros((footprint.split_flags(n_tail, g.CONSUMERS),), dtype=torch.int32, device=device)
             if n_tail else None)
    ml = (torch.empty((footprint.split_workspace_bytes(n_tail, g.CONSUMERS * g.ROWS) // footprint.FP32,),
                      dtype=torch.float32, device=device) if n_tail else None)
    return n_whole, splits, n_tail * splits, turns, ml


def run_shared_kv(q8, qs, k8, ks, v_t, v_scale, v_mean, v_tile_bias, oh, dims, p_log2: float, v_residual: bool, plan,
                   pdl: bool = False, lse=None, qbias=None, k_cols: int = K_PER_TILE) -> bool:
    """Hopper's Gluon kernel on the quantized tensors, split last wave as ``plan`` (``shared_kv_plan``);
    False (and the portable kernel from then on, logged once) if this Triton cannot build or launch it.
    With ``pdl`` the whole CTAs may start while the V conversion ends (they wait for its output). ``lse``:
    the (B, H, LQ) LSE to write (its kernels' twins), plus ``qbias`` where K was smoothed. ``k_cols``: how ``ks``
    is laid out (``k_layout``): per 128-key tile (B·H_KV, tiles), or per key (B·H_KV, LK), equal over each
    tile's column groups with ``K_PER_GROUP``."""
    H, H_KV, LQ, LK, D = dims
    # The kernel tells the compiler its output rows are 16-byte aligned with contiguous channels.
    assert oh.stride(3) == 1 and D % 8 == 0, "the Gluon kernel writes only our own (.., D % 8 == 0) outputs"
    g = hopper_gluon
    n_whole, splits, n_units, turns, ml = plan
    flags = dict(HAS_VSCALE=v_scale is not None, HAS_VMEAN=v_mean is not None)
    v_scale = v_scale if v_scale is not None else qs
    v_mean = v_mean if v_mean is not None else qs
    v_tile_bias = v_tile_bias if v_tile_bias is not None else qs
    args = (*g.descriptors(q8, k8, v_t), qs, ks, v_scale, v_mean, v_tile_bias, oh, *oh.stride()[:3], H, H_KV, LQ, LK, D)
    consts = dict(P_LOG2=p_log2, STAGES=g.STAGES, **flags, REGISTERS=g.REGISTERS, V_RES=v_residual,
                  K_COLS=int(k_cols))
    whole, split, lse_args = g.shared_kv_attention_kernel, g.shared_kv_split_kernel, ()
    if lse is not None:
        whole, split, lse_args = hopper_lse.shared_kv_attention_lse_kernel, hopper_lse.shared_kv_split_lse_kernel, (
            lse, qbias if qbias is not None else qs)
        consts["HAS_QBIAS"] = qbias is not None
    try:
        with sm90_ptxas_scope():  # Triton 3.9: built by a CUDA 12 ptxas, as on 3.6-3.8 (triton_compat)
            if n_whole:
                _launch(whole, (n_whole,), (*args, *lse_args), consts, num_warps=4, **_pdl_launch(pdl))
            if n_units:  # launch_pdl: may start while the whole CTAs finish (it reads none of their output)
                split_consts = dict(consts, STAGES=g.SPLIT_RESIDUAL_STAGES) if v_residual else consts
                _launch(split, (n_units,), (*args, n_whole, splits, turns, ml, *lse_args), split_consts,
                        num_warps=4, launch_pdl=bool(n_whole))
    except Exception as e:  # noqa: BLE001 - a compiler error must not break the user's run
        if launch.hook is not None:  # the cross-compile check must see the error
            raise
        if k_cols:  # per_thread calls take the portable kernel; per-tile ones keep this one
            _memory.gluon_kcols = root_cause(e)
            logger.warning("Hopper Gluon kernel with per-token K scales unavailable with this Triton (%s); the "
                           "portable kernel runs per_thread calls instead", _memory.gluon_kcols)
            return False
        if lse is not None:
            _memory.gluon_lse = root_cause(e)
            logger.warning("Hopper Gluon kernel with the LSE unavailable with this Triton (%s); the portable kernel "
                           "runs calls that ask for the LSE instead", _memory.gluon_lse)
            return False
        _memory.gluon = root_cause(e)
        logger.warning("Hopper Gluon kernel unavailable with this Triton (%s); the portable kernel runs "
                       "every call instead (a few %% slower from 4.6K tokens)", _memory.gluon)
        return False
    return True

