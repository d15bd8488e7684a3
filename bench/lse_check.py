"""``gpu_check.py --only lse``: Hopper's long-sequence kernel with the LSE (``kernels/hopper_lse.py``).

Ring attention asks every step for the LSE; these calls used to leave the Gluon kernel for the portable
one. Each case checks that the LSE twins ran (whole CTAs and split last waves, fp8, fp8+residual, INT8
P·V, GQA, smooth_k's bias, odd lengths), that the output is the plain Gluon kernel's bit for bit (the
LSE is an extra store), that the LSE agrees with fp64 and with the portable
kernel's, that a second call (replayed) gives the same bits, and that the drop-in's names return it too.
Speed is bench/bench_dropin.py's (``--lse``).
"""
from __future__ import annotations

import torch
from common import cosine
from sagetriton.kernels import api, hopper_host
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import default_config, detect_arch

LSE_MAX_ERROR = 0.05  # natural-log units against fp64: the portable kernel's CPU tests hold the same bound
LSE_UNSMOOTHED_ERROR = 0.1  # measured 0.066 on the H200 (Gluon) with the portable kernel within 0.003 of it
LSE_AGREE = 0.02  # against the portable kernel's LSE on the same quantized inputs


def _qkv(B, H, LQ, LK=None, HKV=None, D=128):
    LK, HKV = LK or LQ, HKV or H
    q = torch.randn(B, H, LQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HKV, LK, D, device="cuda", dtype=torch.bfloat16) + 2 * torch.randn(D, device="cuda",
                                                                                           dtype=torch.bfloat16)
    v = torch.randn(B, HKV, LK, D, device="cuda", dtype=torch.bfloat16)
    return q, k, v


def lse_cases() -> list:
    cfg = default_config(detect_arch(), 128)
    if not cfg.shared_kv_min_len:
        print("-- LSE of the Gluon kernel: not used on this GPU")
        return []
    n = cfg.shared_kv_min_len
    residual = cfg.with_pv_choice("fp8+residual")
    int8 = cfg.with_pv_choice("int8").replace(qk_rotation=True)
    seen = []
    real = hopper_host.run_shared_kv

    def noting(*a, **kw):
        seen.append(kw.get("lse") is not None)
        return real(*a, **kw)

    hopper_host.run_shared_kv = noting
    results = []
    try:
        for name, (q, k, v), c_run, smooth_k in (
                ("fp8, odd lengths", _qkv(1, 4, n + 77, n + 129), cfg, True),
                ("fp8, no smooth_k (no bias)", _qkv(1, 4, n + 77, n + 129), cfg, False),
                ("fp8, GQA 8/2, Lk > Lq", _qkv(1, 8, n, n + 1000, HKV=2), cfg, True),
                ("fp8, tail split, 2 heads", _qkv(1, 2, n + 77, n + 129), cfg, True),
                ("fp8, 3.9 waves, batch 2", _qkv(2, 8, n, n + 129), cfg, True),
                ("fp8, 16K, 24 heads (a ring step)", _qkv(1, 24, 16384), cfg, True),
                ("fp8+residual, tail split", _qkv(1, 2, n + 77, n + 129), residual, True),
                ("fp8+residual, 3.9 waves", _qkv(2, 8, n, n + 129), residual, True),
                ("int8 P·V, odd lengths", _qkv(1, 4, n + 77, n + 129), int8, True),
                ("int8 P·V, tail split, 2 heads", _qkv(1, 2, n + 77, n + 129), int8, True),
                ("int8 P·V, 3.9 waves, batch 2", _qkv(2, 8, n, n + 129), int8, True)):
            seen.clear()
            out, lse = api.attention_forward(q, k, v, "HND", False, None, None, True, c_run, smooth_k, False)
            again, lse_again = api.attention_forward(q, k, v, "HND", False, None, None, True, c_run, smooth_k, False)
            ran = bool(seen) and all(seen)  # the first call launches; the second may be replayed (no launch call)
            plain, _ = api.attention_forward(q, k, v, "HND", False, None, None, False, c_run, smooth_k, False)
            portable_out, portable_lse = api.attention_forward(q, k, v, "HND", False, None, None, True,
                                                               c_run.replace(shared_kv_min_len=0), smooth_k, False)
            # fp64 on two heads (and their K/V heads): the 16K x 24 heads case would need 48 GB whole.
            hq, hk = min(q.shape[1], 2), max(1, min(q.shape[1], 2) * k.shape[1] // q.shape[1])
            exact_out, exact_lse = ref.exact_attention(q[:, :hq], k[:, :hk], v[:, :hk])
            error = (lse[:, :hq].double() - exact_lse).abs().max().item()
            agree = (lse - portable_lse).abs().max().item()
            # Same arithmetic as the plain kernel: the LSE is one more store (bits compared, cosine required).
            as_plain = cosine(out, plain)
            same = torch.equal(out, again) and torch.equal(lse, lse_again)
            c = cosine(out[:, :hq], exact_out)
            # K with a 2-sigma channel mean, not smoothed: INT8 K's own error moves the LSE (the portable
            # kernel's by as much; ``agree`` still holds them together).
            bound = LSE_MAX_ERROR if smooth_k else LSE_UNSMOOTHED_ERROR
            ok = (ran and same and as_plain >= 0.999999 and error <= bound and agree <= LSE_AGREE
                  and lse.shape == q.shape[:3] and lse.dtype == torch.float32 and torch.isfinite(lse).all().item()
                  and c >= 0.999)
            print(f"{'ok ' if ok else 'BAD'} {'Gluon LSE: ' + name:60s} cos={c:.6f} ran={ran} deterministic={same} "
                  f"as without LSE: bits={torch.equal(out, plain)} cos={as_plain:.7f} lse err={error:.5f} "
                  f"vs portable={agree:.5f}", flush=True)
            results.append(ok)
        results += _dropin_cases(n)
        results += _bias_cases()
    finally:
        hopper_host.run_shared_kv = real
    return results


def _dropin_cases(n: int) -> list:
    """The drop-in's names as yunchang calls them (NHD, return_lse): the LSE as SageAttention returns it."""
    from sagetriton.kernels import sageattention_compat as sa

    results = []
    q, k, v = (t.transpose(1, 2) for t in _qkv(1, 8, n + 77))
    exact_out, exact_lse = ref.exact_attention(q, k, v, layout="NHD")
    for name in ("sageattn", "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp8_cuda_sm90",
                 "sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp16_triton"):
        out, lse = getattr(sa, name)(q, k, v, tensor_layout="NHD", return_lse=True, dropout_p=0.0,
                                     softmax_scale=None, causal=False)
        error = (lse.double() - exact_lse).abs().max().item()
        c = cosine(out, exact_out)
        ok = error <= LSE_MAX_ERROR and c >= 0.999 and lse.shape == (1, 8, n + 77)
        print(f"{'ok ' if ok else 'BAD'} {'drop-in ' + name + ', NHD, LSE':60s} cos={c:.6f} lse err={error:.5f}",
              flush=True)
        results.append(ok)
    return results


def _bias_cases() -> list:
    """The Q launch's LSE bias (q·mean(K)·scale) as Hopper's tiled rotation takes it, from a tensor-core
    product of the 16-bit rows with K's mean in three 16-bit parts (``quant._bias_mean_operand``): within fp32
    sums of fp64's on the mean the launch reduced, with massive channels (a 16-bit mean misses by ~1e-3)."""
    from sagetriton.kernels import host_quant, quant

    results = []
    B, H, HKV, L, D, mult = 1, 24, 8, 4096 + 77, 128, 128 ** -0.5
    for dtype in (torch.bfloat16, torch.float16):
        q, k = (torch.randn(B, h, L, D, device="cuda") for h in (H, HKV))
        q[..., [3, 40]] *= 30
        k[..., [3, 40]] *= 30
        k += 3 * torch.randn(D, device="cuda")
        q, k = q.to(dtype), k.to(dtype)
        parts, n_parts, k_tokens = host_quant._kv_stats(k, k, True, quant.V_NONE, D)
        mean = parts[0].double().sum(1) / k_tokens  # (B*HKV, D): what the launch reduces, in fp64
        final = torch.empty((4, B * HKV, D), dtype=torch.float32, device="cuda")
        bias = torch.full((B * H, L), float("nan"), dtype=torch.float32, device="cuda")
        api._quantize_qk(q, 16, 64, D, 1.0, quant.MEAN_DOT, (parts, n_parts, L, k_tokens, final), H // HKV,
                         bias=bias, bias_mult=mult, finalize=(True, quant.V_NONE, 1.0, False), rotate=128,
                         method="tiled")
        terms = q.double().reshape(B * H, L, D) * mean.repeat_interleave(H // HKV, dim=0)[:, None, :]
        want = terms.sum(-1) * mult
        rel = ((bias.double() - want).abs() / (terms.abs().sum(-1) * mult)).max().item()
        ok = rel <= 1e-5 and want.abs().max().item() > 10
        print(f"{'ok ' if ok else 'BAD'} {f'LSE bias of the tiled Q launch, {dtype}':60s} "
              f"err/sum|terms|={rel:.2e} (fp32 sums: <= 1e-5)", flush=True)
        results.append(ok)
    return results
