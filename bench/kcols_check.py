"""``gpu_check.py --only kcols``: Hopper's long-sequence kernel with per_thread K scales (``kernels/hopper_logits.py``).

per_thread calls (the drop-in's ``sageattn_qk_int8_pv_fp8_cuda_sm90`` default) used to run on the portable kernel.
Their K scales are SageAttention's sm90 groups there (``K_PER_GROUP``; per key, ``K_PER_KEY``, with
``hopper_host.TUNING["k_groups"]`` off; the drop-in cases run both). Each case checks that the Gluon kernel ran
with that variant (``K_COLS``),
whole CTAs and split last waves, with and without the LSE, fp8 and fp8+residual, lengths no multiple of 128;
that it agrees with fp64 and with the portable kernel on the same K scales (cosine ≥ 0.99995 for whole
CTAs, as the per-tile kernel's check; ``SPLIT_MIN_AGREE`` where key shares round P against their own row max);
that its LSE agrees with the portable kernel's; that a second call (replayed, ``kernels/replay.py``) gives the
same bits; and the hostile inputs (huge logits, NaN/Inf) through it. Speed is bench/bench_dropin.py's.
"""
from __future__ import annotations

import itertools

import torch
from common import cosine
from lse_check import _qkv  # the same inputs as the LSE checks: K with a large mean
from sagetriton.kernels import api, failures, hopper_host, replay, tail_split
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import default_config, detect_arch
from sagetriton.kernels.hopper_logits import K_PER_GROUP, K_PER_KEY

WHOLE_MIN_AGREE = 0.99995  # Gluon against portable, whole CTAs (gpu_check.shared_kv_cases)
SPLIT_MIN_AGREE = 0.9995  # key shares round P to fp8 against their own row max (gpu_check.SPLIT_MIN_AGREE)
RESIDUAL_MIN_COS = 0.9995  # fp8+residual against fp64 (gpu_check.RESIDUAL_MIN_COS)
LSE_AGREE = 0.02  # natural-log units, against the portable kernel's LSE (lse_check.LSE_AGREE)


def _plan(q, k):
    from sagetriton.kernels import hopper_gluon

    B, H, LQ, _ = q.shape
    ctas_per_head, key_tiles = hopper_gluon.grid(LQ, k.shape[2])
    return tail_split.plan_tail(ctas_per_head * B * H, api.sm_count(q.device), key_tiles)


def kcols_cases() -> list:
    base = default_config(detect_arch(), 128)
    if not base.shared_kv_min_len:
        print("-- per-token K scales in the Gluon kernel: not used on this GPU")
        return []
    from sagetriton.kernels.arch import resolve_config

    arch = detect_arch()
    cfg = resolve_config(arch, 128, "per_thread", pv_precision="fp8")[0]
    residual = resolve_config(arch, 128, "per_thread", pv_precision="fp8+residual")[0]
    n = cfg.shared_kv_min_len
    seen = []
    real = hopper_host.run_shared_kv

    def noting(*a, **kw):
        ok = real(*a, **kw)
        seen.append(ok and kw.get("k_cols") == (K_PER_GROUP if hopper_host.TUNING["k_groups"] else K_PER_KEY))
        return ok

    hopper_host.run_shared_kv = noting
    results = []
    try:
        # Plans on 132 SMs (whole CTAs, shares per tail CTA): 2 heads of n + 77 rows (0, 5): split only; 4 heads
        # (100, 1): whole only; 8 heads (132, 3) and 24 heads of 16K (1980, 3): both; 6 heads of n + 20 (132, 7).
        for name, (q, k, v), c_run, lse, smooth_v in (
                ("fp8, split tail only, odd lengths", _qkv(1, 2, n + 77, n + 129), cfg, False, False),
                ("fp8, split tail only, odd lengths, LSE", _qkv(1, 2, n + 77, n + 129), cfg, True, False),
                ("fp8, whole CTAs only, odd lengths", _qkv(1, 4, n + 77, n + 129), cfg, False, False),
                ("fp8, whole CTAs only, odd lengths, LSE", _qkv(1, 4, n + 77, n + 129), cfg, True, False),
                ("fp8, whole + split, GQA 8/2, smooth_v", _qkv(1, 8, n + 77, HKV=2), cfg, False, True),
                ("fp8, whole + split, GQA 8/2, LSE", _qkv(1, 8, n + 77, HKV=2), cfg, True, False),
                ("fp8, 2.9 waves, batch 2, Lk odd", _qkv(2, 8, n, n + 1), cfg, False, False),
                ("fp8, short K (77 keys: the masked tile only)", _qkv(1, 4, n, 77), cfg, False, False),
                ("fp8, head_dim 96", _qkv(1, 4, n + 77, D=96), cfg, False, False),
                ("fp8, 16K x 24 heads (a ring step), LSE", _qkv(1, 24, 16384), cfg, True, False),
                ("fp8+residual, whole + split, odd lengths", _qkv(1, 6, n + 20, n + 129), residual, False, False),
                ("fp8+residual, split tail only, LSE", _qkv(1, 2, n + 77, n + 129), residual, True, False)):
            seen.clear()
            replay.clear()
            out, out_lse = api.attention_forward(q, k, v, "HND", False, None, None, lse, c_run, True, smooth_v)
            ran = bool(seen) and all(seen)
            again, again_lse = api.attention_forward(q, k, v, "HND", False, None, None, lse, c_run, True, smooth_v)
            same = torch.equal(out, again) and (not lse or torch.equal(out_lse, again_lse))
            # The second call replays the first one's launches through the launchers where its buffers are
            # small enough to keep (``replay.worth_recording``; not the 16K x 24 heads case).
            rec = next(iter(failures.memory.replays.values()), None)
            replayed = rec is not None and rec.direct_calls == 1
            replay_ok = replayed == replay.worth_recording(q, k, v)
            portable, portable_lse = _portable(q, k, v, lse, c_run, smooth_v)
            agree = cosine(out, portable)
            hq, hk = min(q.shape[1], 2), max(1, min(q.shape[1], 2) * k.shape[1] // q.shape[1])
            c = cosine(out[:, :hq], ref.exact_attention(q[:, :hq], k[:, :hk], v[:, :hk])[0])
            plan = _plan(q, k)
            lse_err = (out_lse - portable_lse).abs().max().item() if lse else 0.0
            ok = (ran and same and replay_ok and agree >= (SPLIT_MIN_AGREE if plan[1] > 1 else WHOLE_MIN_AGREE)
                  and c >= (RESIDUAL_MIN_COS if c_run.v_residual else 0.999) and lse_err <= LSE_AGREE
                  and not torch.isnan(out).any().item())
            print(f"{'ok ' if ok else 'BAD'} {'Gluon per_thread K: ' + name:60s} cos={c:.6f} ran={ran} "
                  f"deterministic={same} replayed={replayed} cos to portable={agree:.7f} lse vs portable={lse_err:.5f} "
                  f"(whole CTAs, shares) = {plan}", flush=True)
            results.append(ok)
        replay.clear()
        results += _hostile(cfg, n, seen)
        results += _dropin(n, seen)
    finally:
        hopper_host.run_shared_kv = real
    return results


def _portable(q, k, v, lse, cfg, smooth_v):
    """The portable kernel on the K scales the Gluon call took (it reads SageAttention's groups as per-key scales)."""
    real = hopper_host.k_layout
    hopper_host.k_layout = lambda c, plan: real(c, plan if plan is not None else ("as the Gluon call",))
    try:
        return api.attention_forward(q, k, v, "HND", False, None, None, lse, cfg.replace(shared_kv_min_len=0), True,
                                     smooth_v)
    finally:
        hopper_host.k_layout = real


def _hostile(cfg, n: int, seen: list) -> list:
    """gpu_check's hostile inputs (unmasked: huge logits, NaN/Inf in q, k, v, a negative scale) through the
    per-token kernel."""
    from gpu_check import hostile_results

    seen.clear()
    from sagetriton.kernels import quant

    # the quantized reference of huge logits with the K groups the kernel took
    found = hostile_results(cfg, 128, lq=n + 77, lk=n + 129, masks=False,
                            k_group=quant.K_SM90_GROUPS if hopper_host.TUNING["k_groups"] else None)
    used = bool(seen) and all(seen)
    results = []
    for case_name, (ok, detail) in found.items():
        print(f"{'ok ' if ok and used else 'BAD'} {'Gluon per_thread K: ' + case_name:60s} {detail} ran={used}",
              flush=True)
        results.append(ok and used)
    return results


def _dropin(n: int, seen: list) -> list:
    """The drop-in's per_thread names as yunchang calls them (NHD, return_lse) reach the per-token kernel."""
    from sagetriton.kernels import sageattention_compat as sa

    results = []
    q, k, v = (t.transpose(1, 2) for t in _qkv(1, 8, n + 77))
    exact_out, exact_lse = ref.exact_attention(q, k, v, layout="NHD")
    grouped = hopper_host.TUNING["k_groups"]
    try:
        for hopper_host.TUNING["k_groups"], name in itertools.product(
                (True, False), ("sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_qk_int8_pv_fp8_cuda")):
            seen.clear()
            replay.clear()  # the second name's call would replay the first's launches, never reaching the launcher
            out, lse = getattr(sa, name)(q, k, v, tensor_layout="NHD", return_lse=True, pv_accum_dtype="fp32+fp32")
            ran = bool(seen) and all(seen)
            error = (lse.double() - exact_lse).abs().max().item()
            c = cosine(out, exact_out)
            ok = ran and error <= 0.05 and c >= 0.999
            label = f"Gluon K {'groups' if hopper_host.TUNING['k_groups'] else 'per key'}: drop-in {name}"
            print(f"{'ok ' if ok else 'BAD'} {label:60s} cos={c:.6f} ran={ran} lse err={error:.5f}", flush=True)
            results.append(ok)
    finally:
        hopper_host.TUNING["k_groups"] = grouped
    return results
