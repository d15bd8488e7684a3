"""The launches behind ``sparse_attn`` (validated arguments only: ``sparse_api.check_sparse_args``).

Order: one read of V (``sparse_route.pool_kernel``: its block sums and max |v|, and a sample of K's
rows), K's centre and V's scale from those (``pool_finish_kernel``), the quantization of K (centred by
that sample's mean, rotated) and then of Q, each writing its block means as well (``sparse_quant``: Q
and K are read once each before the attention kernel), the block means' mean and variance and the
centred means (two torch ops), V's conversion (``api._prepare_v``), the router, then the sparse
attention kernel. With ``extra_tokens``, ``sparse_extra`` rewrites the router's tail before the kernel
and merges the extra tokens into its output after it. Every launch goes through ``api._launch``, so the
cross-compile check records these as it records the dense ones.
"""
from __future__ import annotations

import math

import torch

from . import api, quant, rotation, sparse_extra
from . import attention as attn
from .arch import KernelConfig, arch_for_device, interpreter_enabled, sparse_default_pv
from .footprint import head_dim_padded
from .rotation import ROTATION_BLOCK
from .sparse_attention import sparse_attention_kernel
from .sparse_quant import quantize_with_means
from .sparse_reference import BLOCK, topk_count
from .sparse_route import centre_means_kernel, pool_finish_kernel, pool_kernel, route_kernel

POOL_BLOCKS = 4  # 64-token blocks per pool program
# Keys per pool program summed for K's centre (1/16 of K): any centre gives the same logits up to a per-row
# constant (``sparse_quant``); it only sets INT8's range, which the sample's mean centres as well as K's mean.
K_SAMPLE = 16
# Knobs the A/B benchmark (bench/sparse_ab.py) flips; the defaults are what it measured fastest on the H200
# (bench/results/sm90_sparse_ab.json; None: the config's own choice). bench/NOTES.md, "Sparse attention".
# The pre-attention launches' tensor-core sums, timed on the H200 (bench/results/sm90_sparse_route_ab.json, 103,950
# x 56): block means and row dots in the Q/K quantization (quant_mma_sums: 2.49 -> 1.75 ms) and V's block sums in
# the pool (pool_mma_sums), on for 16-bit inputs everywhere (no spill or occupancy change cross-compiled on
# sm80/sm90/sm120/gfx942/gfx1100); the router's prefix sum (route_scan_mma; None: Hopper only, where it drops the
# router's spills, 45 -> 0; sm86-sm120 spill 4 with it) and its tail in the threshold's frame (route_fixed_frame;
# None: Hopper only, as the scan): router 1.70 -> 1.38 ms. route_stages / route_maxnreg: None, the config's
# pipelining and no cap. pool_stages 1: 0.61 ms against 0.89 with 2 stages (None: 2 on NVIDIA, 1 elsewhere).
TUNING = {"pool_stages": 1, "attn_stages": None, "attn_tma": True, "attn_maxnreg": None, "route_prec": None,
          "route_tiles": None, "route_warps": 8, "attn_pairs": None, "quant_mma_sums": True, "pool_mma_sums": True,
          "route_scan_mma": None, "route_fixed_frame": None, "route_stages": None, "route_maxnreg": None,
          "int8_k_tokens": True, "extra_qb": None}
_TOPK_SLICE_BYTES = 256 << 20  # the top-k scores are worked out this many bytes of heads at a time
# The top-k threshold is backed off this much (relative) below the k-th score torch finds: the router's
# TF32 scores differ from torch's fp32 ones by about that, and a tie kept costs one block, a block lost
# the accuracy it was chosen for.
TOPK_BACKOFF = 2e-3


def default_config(device, head_dim: int) -> KernelConfig:
    """The config of a call that left it to the GPU: the dense default, with the sparse P·V default of
    ``arch.sparse_default_pv`` (INT8 on Hopper)."""
    arch = arch_for_device(device)
    return api._resolved_config(arch, head_dim, None, sparse_default_pv(arch), None)


def sparse_config(cfg: KernelConfig) -> KernelConfig:
    """The dense config's choices (P·V format, rotation, scale granularity, stages, TMA, registers) on
    the router's 64x64 tiles: one program per query block, one key block per tile, 4 warps."""
    return cfg.replace(block_m=BLOCK, block_n=BLOCK, num_warps=4, pdl=False, shared_kv_min_len=0)


def k_group_size(cfg: KernelConfig) -> int:
    """Keys per K scale: the config's, but one per token with INT8 P·V, the accurate choice (the A/B's other
    side: ``TUNING["int8_k_tokens"] = False``). On the video-like input (bench/sparse_inputs.py, the kernel's
    roundings simulated in fp64) K's is ~80 % of INT8's squared error, and per-token scales take 16 % off the
    error; Q's, P's and V's matter less (bench/NOTES.md, "Sparse INT8 error"). The kernel pays one multiply
    per logit."""
    if cfg.pv_precision == "int8" and TUNING["int8_k_tokens"]:
        return 1
    return cfg.group_sizes()[1]


def exact_pairs(cfg: KernelConfig, k_scalar: bool) -> bool:
    """Whether the attention kernel runs its listed blocks two per step (``sparse_tile.attn_pair``):
    ``TUNING``'s choice, else Hopper with 8-bit P·V and one K scale per block, or per token with INT8 P·V,
    where the 128-key step cross-compiles in its 168 registers (its MMAs read K and V from shared memory;
    fp8 with per-token K scales spills there). Elsewhere not measured: bench/NOTES.md, "Sparse attention",
    "Pairs, second form", and "Sparse INT8 error"."""
    if TUNING["attn_pairs"] is not None:
        return bool(TUNING["attn_pairs"])
    return cfg.use_tma and (k_scalar or cfg.pv_precision == "int8") and cfg.pv_precision in ("fp8", "int8")


def dot_precisions(device) -> tuple[str, str]:
    """(scores, tail P·V) precision of the router's fp32 products: TF32 on NVIDIA tensor cores (10-bit
    mantissas: a block within ~1e-3 of its threshold may go either way), full fp32 on AMD, the
    interpreter and meta tensors."""
    if device.type == "cuda" and torch.version.hip is None and not interpreter_enabled():
        return "tf32", "tf32"
    return "ieee", "ieee"


def route_precisions(device) -> tuple[str, str]:
    """The routers' (scores, tail P·V) precisions: ``TUNING``'s where a benchmark set one, else ``dot_precisions``."""
    return TUNING["route_prec"] or dot_precisions(device)


def k_sample_count(L: int) -> int:
    """Keys ``pool_kernel`` sums for K's centre: K_SAMPLE evenly spaced ones per program's span, those before L."""
    span = POOL_BLOCKS * BLOCK
    return (L // span) * K_SAMPLE + -(-(L % span) // (span // K_SAMPLE))


def _pool_v(vh, kh, L, d_pad, nb, absmax):
    """One read of V (B, H_KV, L, D): (B*H_KV, nb, d_pad) fp32 block sums, with ``absmax`` the per-program
    partial max |v| per channel (B*H_KV, n_progs, d_pad), and the per-program partial sums of a sample of K's
    rows (``k_sample_count``; B*H_KV, n_progs, d_pad), whose mean K is quantized around."""
    B, H_KV, _, D = vh.shape
    out = torch.empty((B * H_KV, nb, d_pad), dtype=torch.float32, device=vh.device)
    progs = -(-nb // POOL_BLOCKS)
    amax = torch.empty((B * H_KV, progs, d_pad) if absmax else (1,), dtype=torch.float32, device=vh.device)
    ksum = torch.empty((B * H_KV, progs, d_pad), dtype=torch.float32, device=vh.device)
    api._launch(pool_kernel, (progs, B * H_KV), (vh, *vh.stride(), out, amax, kh, *kh.stride(), ksum, H_KV, L, D, nb,
                                                 POOL_BLOCKS),
                dict(D_PAD=d_pad, ABSMAX=absmax, K_SAMPLE=K_SAMPLE, INTERPRETER=interpreter_enabled(),
                     MMA_SUMS=TUNING["pool_mma_sums"] and vh.dtype in (torch.float16, torch.bfloat16)), num_warps=4,
                num_stages=TUNING["pool_stages"] or (2 if vh.is_cuda and torch.version.hip is None else 1))
    return out, amax, ksum


def _finish_pool(amax, ksum, L, cfg: KernelConfig, D, signs=None):
    """K's centre (B*H_KV, d_pad), with ``signs`` (the tiled rotation's) also times them (else the centre
    itself), and the (3, B*H_KV, D) buffer ``api._prepare_v`` reads V's scale from (slot 1), from the pool's
    partials (``sparse_route.pool_finish_kernel``)."""
    n, progs, d_pad = ksum.shape
    centre = torch.empty((n, d_pad), dtype=torch.float32, device=ksum.device)
    k_centre = torch.empty_like(centre) if signs is not None else centre
    final = torch.empty((3, n, D), dtype=torch.float32, device=ksum.device)
    v_range, pow2 = api._v_range(cfg)
    api._launch(pool_finish_kernel, (n,), (ksum, amax, centre, k_centre, final[1], signs if signs is not None
                                           else centre, progs, float(k_sample_count(L)), D),
                dict(D_PAD=d_pad, CHUNK=16, ABSMAX=amax.dim() > 1, V_RANGE=v_range, V_POW2=pow2,
                     ROTATE_TILES=signs is not None, INTERPRETER=interpreter_enabled()), num_warps=4)
    return centre, k_centre, final


def centre_means(kbar):
    """K's block means (B*H_KV, nb, d_pad) less their mean ``mu`` per channel, ``mu`` and the means' variance
    (B*H_KV, d_pad) each: ``sparse_route.centre_means_kernel``."""
    n, nb, d_pad = kbar.shape
    kc = torch.empty_like(kbar)
    mu = torch.empty((n, d_pad), dtype=torch.float32, device=kbar.device)
    kvar = torch.empty_like(mu)
    ch = min(32, d_pad)
    api._launch(centre_means_kernel, (d_pad // ch, n), (kbar, kc, mu, kvar, nb), dict(D_PAD=d_pad, CH=ch, CHUNK=64),
                num_warps=4)
    return kc, mu, kvar


def _topk_threshold(cen, kc, kv_of, nb, ratio, log2s, sinks):
    """Per query block, the score of its k-th best non-sink key block (ties kept by ``>=``), backed off a
    few ulps since the kernel's product is not bit-identical; +inf where there is nothing to choose."""
    s0, s1 = sinks if sinks is not None else (0, 0)
    s0, s1 = min(s0, nb), min(s1, nb)
    kk = topk_count(nb - (s1 - s0), ratio)
    thr = torch.empty(cen.shape[:2], dtype=torch.float32, device=cen.device)
    if kk == 0:
        return thr.fill_(float("inf"))
    step = max(1, _TOPK_SLICE_BYTES // (nb * nb * 4))
    for a in range(0, cen.shape[0], step):
        s = torch.bmm(cen[a:a + step], kc[kv_of[a:a + step]].transpose(1, 2)) * log2s
        if s1 > s0:
            s[..., s0:s1] = float("-inf")
        thr[a:a + step] = s.topk(kk, dim=-1, sorted=False).values.amin(dim=-1)
    return thr - thr.abs() * TOPK_BACKOFF


def route(cen, kc, vsum, kvar, B, H, H_KV, L, tau, log2s, sinks, sinks_q, topk_ratio, stages: int = 1,
          tiles=None, scan_mma: bool = False):
    """The router on the block proxies (fp32: centroids (B*H, nb, d_pad), centred K block means and V
    block sums (B*H_KV, nb, d_pad), K's per-channel block variance (B*H_KV, d_pad)). Returns the exact
    key blocks per query block (B*H, nb, nb; the first ``count`` of each row, ascending), ``count``
    (B*H, nb) and the pooled tail's max, sum (B*H, nb) and P·V (B*H, nb, d_pad). ``stages``: software
    pipelining of its loop (Hopper's shared memory takes 2); ``tiles``: (query blocks, key blocks) per step;
    ``scan_mma``: the lists' prefix sum as an MMA (``TUNING["route_scan_mma"]`` overrides it)."""
    nb, d_pad, dev = cen.shape[1], cen.shape[2], cen.device
    thr = torch.empty((1,), dtype=torch.float32, device=dev)
    if topk_ratio:  # the key/value head of each query head (batch-major), for the top-k scores
        heads = torch.arange(B * H, device=dev)
        kv_of = (heads // H) * H_KV + (heads % H) // (H // H_KV)
        thr = _topk_threshold(cen, kc, kv_of, nb, topk_ratio, log2s, sinks)
    lists = torch.empty((B * H, nb, nb), dtype=torch.int16 if nb < 2**15 else torch.int32, device=dev)
    count = torch.empty((B * H, nb), dtype=torch.int32, device=dev)
    tail_m = torch.empty((B * H, nb), dtype=torch.float32, device=dev)
    tail_l = torch.empty_like(tail_m)
    tail_acc = torch.empty((B * H, nb, d_pad), dtype=torch.float32, device=dev)
    score_prec, tail_prec = route_precisions(dev)
    # Query blocks x key blocks per step: TF32 on 64 x 32 fits without spills (sm80-sm120); full fp32
    # products are FMA loops (AMD), which spill at that size.
    qb, kb = (64, 32) if score_prec == "tf32" else (32, 16)
    if d_pad > 128:
        qb = max(16, qb // 2)
    qb, kb = TUNING["route_tiles"] or tiles or (qb, kb)
    s0, s1 = sinks if sinks is not None else (0, 0)
    q0, q1 = sinks_q if sinks_q is not None else (0, 0)
    api._launch(route_kernel, (-(-nb // qb), B * H), (
        cen, kc, vsum, kvar, thr, lists, count, tail_m, tail_l, tail_acc,
        H, H_KV, nb, float(L - (nb - 1) * BLOCK), float(tau), log2s, min(s0, nb), min(s1, nb), min(q0, nb), min(q1, nb),
    ), dict(QB=qb, KB=kb, D_PAD=d_pad, HAS_THR=bool(topk_ratio), SCORE_PREC=score_prec, TAIL_PREC=tail_prec,
            SCAN_MMA=scan_mma if TUNING["route_scan_mma"] is None else TUNING["route_scan_mma"],
            FIXED_FRAME=scan_mma if TUNING["route_fixed_frame"] is None else TUNING["route_fixed_frame"],
            INTERPRETER=interpreter_enabled()),
        num_warps=TUNING["route_warps"], num_stages=TUNING["route_stages"] or stages,
        **({"maxnreg": TUNING["route_maxnreg"]} if TUNING["route_maxnreg"] and dev.type == "cuda"
           and torch.version.hip is None else {}))
    return lists, count, tail_m, tail_l, tail_acc


def run(q, k, v, tau, layout, scale, sinks, sinks_q, topk_ratio, extra_tokens, return_lse, return_density,
        out_layout, config):
    qh, kh, vh = (api._as_bhld(t, layout) for t in (q, k, v))
    B, H, L, D = qh.shape
    H_KV = kh.shape[1]
    if scale < 0:  # Q·Kᵀ·s = (-Q)·Kᵀ·|s|: the kernels' scales stay positive (as ``api._plan_call``)
        qh, scale = -qh, -scale
    if config is None:
        config = default_config(q.device, D)
    cfg = sparse_config(api.check_config(config))
    d_pad = head_dim_padded(D)
    nb = -(-L // BLOCK)
    dev = q.device
    log2s = scale * quant.LOG2E

    # One read of V: its block sums and scale, and K's centre from a sample of K's rows.
    rotate = min(d_pad, ROTATION_BLOCK) if cfg.qk_rotation else 0
    method = rotation.method_for(cfg.rotation_tiles, qh.dtype, kh.dtype, D, d_pad) if rotate else "dot"
    vsum, vmax, ksum = _pool_v(vh, kh, L, d_pad, nb, absmax=api._v_stats_needed(cfg, False) != quant.V_NONE)
    # "tiled" subtracts K's centre after the product: the centre times the rotation's signs
    centre, k_centre, final = _finish_pool(vmax, ksum, L, cfg, D, api._rotation_signs(d_pad, rotate, dev, kh.dtype)
                                           if method == "tiled" else None)
    q_group, k_group = cfg.group_sizes()[0], k_group_size(cfg)
    k_scalar = k_group == cfg.block_n
    # K's and Q's quantization, each also writing its block means (the router's proxies: K's centred by their
    # mean ``mu``, the method's centre). Q's launch writes per row q·(mu - centre)·scale·log2 e, which moves
    # the router's tail into the kernel's frame, and with the LSE q·centre·scale, which moves the kernel's
    # LSE into the frame of q·k·scale.
    k8, ks, kbar, _, _ = quantize_with_means(kh, k_group, cfg.block_n, d_pad, 1.0, k_centre, subtract=True,
                                             per_block=k_scalar, rotate=rotate, method=method,
                                             mma_sums=TUNING["quant_mma_sums"])
    # Centred here, not in the router: subtracting mu there spilled (sm90: 45 -> 85 local loads and stores).
    kc, mu, kvar = centre_means(kbar)
    q_block = rotation.q_rows(method, cfg.block_m) if rotate else cfg.block_m
    q8, qs, cen, tail_off, qbias = quantize_with_means(qh, q_group, q_block, d_pad, log2s, centre, mu=mu,
                                                      off_mult=log2s, bias_mult=scale if return_lse else None,
                                                      kv_div=H // H_KV, rotate=rotate, method=method,
                                                      mma_sums=TUNING["quant_mma_sums"])
    v_op, v_strides, v_scale, _, pv_mode, p_scale, tile_bias = api._prepare_v(vh, cfg, False, d_pad, final)

    lists, count, tail_m, tail_l, tail_acc = route(cen, kc, vsum, kvar, B, H, H_KV, L, tau, log2s, sinks, sinks_q,
                                                   topk_ratio, stages=2 if cfg.use_tma else 1,
                                                   tiles=(128, 32) if cfg.use_tma and d_pad <= 128 else None,
                                                   scan_mma=cfg.use_tma)

    if extra_tokens:  # the tail becomes per-token centroid terms; the extra tokens are merged in below
        extra_idx, n_extra = sparse_extra.retail(qh, kh, vh, cen, mu, lists, count, tail_m, tail_l, tail_acc,
                                                 log2s, extra_tokens, route_precisions(dev), wide=cfg.use_tma,
                                                 qb=TUNING["extra_qb"], pipelined=cfg.num_stages > 1)

    out = torch.empty(api._out_shape(B, H, L, D, out_layout), dtype=q.dtype, device=dev)
    oh = api._as_bhld(out, out_layout)
    want_lse = return_lse or bool(extra_tokens)
    lse = torch.empty((B, H, L) if want_lse else (1,), dtype=torch.float32, device=dev)
    k_desc = v_desc = None
    if cfg.use_tma and TUNING["attn_tma"]:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k3 = k8.view(B * H_KV, L, d_pad)
        k_desc = TensorDescriptor(k3, list(k3.shape), list(k3.stride()), [1, BLOCK, d_pad])
        if v_op is not vh:
            blk = [1, d_pad, BLOCK] if pv_mode in (attn.PV_FP8, attn.PV_INT8) else [1, BLOCK, d_pad]
            v_desc = TensorDescriptor(v_op, list(v_op.shape), list(v_op.stride()), blk)
    api._launch(sparse_attention_kernel, (nb, B * H), (
        q8, qs, k8, ks, v_op, v_scale if v_scale is not None else qs, qbias if qbias is not None else qs, tail_off,
        tile_bias if tile_bias is not None else k8, oh, lse, k_desc if k_desc is not None else k8,
        v_desc if v_desc is not None else k8, lists, count, tail_m, tail_l, tail_acc,
        *v_strides, *oh.stride(), H, H_KV, L, D, nb,
    ), dict(
        BLOCK_M=BLOCK, D_PAD=d_pad, PV_MODE=pv_mode, P_LOG2=math.log2(p_scale), HAS_VSCALE=v_scale is not None,
        HAS_QBIAS=qbias is not None and not extra_tokens, K_SCALAR=k_scalar, RETURN_LSE=want_lse,
        EVEN_D=(D == d_pad) or (v_op is not vh), INTERPRETER=interpreter_enabled(), K_TMA=k_desc is not None,
        V_TMA=v_desc is not None, V_T=pv_mode in (attn.PV_FP8, attn.PV_INT8),
        V_RES=pv_mode == attn.PV_FP8 and cfg.v_residual, PDL=False, PAIRS=exact_pairs(cfg, k_scalar),
    ), num_warps=cfg.num_warps, num_stages=TUNING["attn_stages"] or cfg.num_stages,
        **({"maxnreg": regs} if (regs := TUNING["attn_maxnreg"] if TUNING["attn_maxnreg"] is not None
                                  else cfg.max_registers) else {}))
    if extra_tokens:  # the merge runs in the centred frame; the returned LSE then moves to q·k·scale
        sparse_extra.merge(qh, kh, vh, centre, extra_idx, n_extra, scale, oh, lse,
                           "tf32x3" if dot_precisions(dev)[0] == "tf32" else "ieee")
        if qbias is not None:
            lse += qbias.view(B, H, L)
    res = (out,)
    if return_lse:
        res += (lse,)
    if return_density:
        res += ((count.sum(dtype=torch.float64) / float(B * H * nb * nb)).float(),)
    return res[0] if len(res) == 1 else res
