"""Correctness of the compiled kernels on a real GPU: every feature against fp64, one table.

    python bench/gpu_check.py                  # everything (a few minutes on an H200)
    python bench/gpu_check.py --only families  # every GPU family's configs on ordinary and hostile inputs
    python bench/gpu_check.py --only hostile   # the same hostile inputs on this GPU's own fast paths
    python bench/gpu_check.py --only core      # every feature on ordinary and non-finite inputs, Gluon, replays
    python bench/gpu_check.py --only replay    # core's replayed calls alone
    python bench/gpu_check.py --only rope      # the RoPE kernel against ComfyUI's RoPE, bit for bit
    python bench/gpu_check.py --only lse       # Hopper's long-sequence kernel returning the LSE (bench/lse_check.py)
    python bench/gpu_check.py --only kcols     # that kernel with per-token K scales (per_thread; bench/kcols_check.py)
    python bench/gpu_check.py --only sparse    # sparse_attn against its fp64 reference (bench/sparse_check.py)
    python bench/gpu_check.py --only sparse_extra  # its extra_tokens cases alone (also in --only sparse)

``families`` runs the portable kernel with each arch table entry's default and selectable configs
(Ampere, Ada, Blackwell datacenter and consumer, RDNA3, RDNA4, CDNA3: tiles, warps, stages, P·V
precision, resolved through the same ``resolve_config`` as on that GPU) on this GPU, against fp64.

The CPU test suite runs the same kernels through the Triton interpreter; this is the check that
the compiled code (wgmma / mma / wmma, fp8 casts) computes the same function.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time

import torch
from common import cosine, environment, import_pack

import_pack()
from sagetriton.kernels import reference as ref  # noqa: E402
from sagetriton.kernels import sageattn  # noqa: E402

# fp8+residual must beat plain fp8's ~0.9993 against exact attention (bench/fp8_accuracy_floor.py).
RESIDUAL_MIN_COS = 0.9995
# Gluon kernel with a split last wave against the portable kernel (shared_kv_cases).
SPLIT_MIN_AGREE = 0.9995
# (batch, head, token) that nonfinite_cases makes NaN or Inf, in channel 5.
BAD_TOKEN = (0, 1, 37)


def qkv(B=2, H=4, LQ=1000, LK=None, D=128, HKV=None, dtype=torch.bfloat16):
    LK = LQ if LK is None else LK
    HKV = H if HKV is None else HKV
    q = torch.randn(B, H, LQ, D, device="cuda", dtype=dtype)
    k = torch.randn(B, HKV, LK, D, device="cuda", dtype=dtype) + 2 * torch.randn(D, device="cuda", dtype=dtype)
    v = torch.randn(B, HKV, LK, D, device="cuda", dtype=dtype)
    return q, k, v


def case(name, q, k, v, min_cos=0.999, **kw):
    opts = {k_: kw.pop(k_) for k_ in list(kw) if k_ in ("qk_quant_gran", "pv_precision", "pv_accum_dtype",
                                                       "smooth_k", "smooth_v", "tensor_layout")}
    layout = opts.get("tensor_layout", "HND")
    out = sageattn(q, k, v, **opts, **kw)
    exact, _ = ref.exact_attention(q, k, v, layout=layout, **kw)
    c = cosine(out, exact)
    ok = c >= min_cos and out.dtype == q.dtype and not torch.isnan(out).any()
    print(f"{'ok ' if ok else 'BAD'} {name:60s} cos={c:.6f}", flush=True)
    return ok


def nonfinite_cases() -> list:
    """NaN and Inf propagate as in exact attention in the compiled code too: the quantization finds
    them with a NaN-propagating max, whose GPU lowering the interpreter's tests do not see. The rows
    kept finite must stay accurate (a bad token must not spoil its scale group). One documented
    difference: an Inf key makes every row of its head NaN (its INT8 scale is not finite, nor is K's
    mean where that key was summed), where exact attention spares the rows whose logit for it is -inf.
    Another: a query holding Inf gets a NaN row (its INT8 scale is NaN) also where all its logits
    are -inf (K's channel offset can give one channel a single sign), which torch's SDPA and the fp64
    reference write as 0, their convention for a fully masked row (seen once, 2026-12-02).
    NaN or Inf in V turns its channel non-finite in every row, as in exact attention.

    The expectation is fp64 math attention, not the fused SDPA kernels: with an Inf in a query, torch
    2.11's default SDPA on the H200 returned that row finite in 2-3 of 40 such cases (its row is +/-inf
    logits, so NaN in exact arithmetic), which failed this check against a correct NaN row."""
    from sagetriton.kernels.arch import default_config, detect_arch

    long = default_config(detect_arch(), 128).shared_kv_min_len or 4096
    results = []
    for gran, lq in (("per_block", 1000), ("per_warp", 1000), ("per_thread", 1000), ("per_warp", long)):
        for where, value in itertools.product("qk", (float("nan"), float("inf"))):
            q, k, v = qkv(B=1, H=4, LQ=lq)
            (q if where == "q" else k)[(*BAD_TOKEN, 5)] = value
            out = sageattn(q, k, v, qk_quant_gran=gran)
            exact = ref.exact_attention(q, k, v)[0]
            nan_rows = ~torch.isfinite(exact).all(-1)  # +/-inf logits: Inf - Inf in the softmax
            if where == "k" and value == float("inf"):
                nan_rows[0, 1] = True
            if where == "q":  # its row is NaN, also where SDPA writes 0 (see the docstring)
                nan_rows[BAD_TOKEN] = True
            same = torch.equal(torch.isnan(out).any(-1), nan_rows)
            c = cosine(out[~nan_rows], exact[~nan_rows])
            ok = same and c >= 0.999
            detail = "" if same else (f" (NaN rows per head: ours {torch.isnan(out).any(-1).sum(-1).tolist()}, "
                                      f"expected {nan_rows.sum(-1).tolist()})")
            print(f"{'ok ' if ok else 'BAD'} {f'{value} in {where}, {gran}, {lq} tokens':60s} cos={c:.6f} "
                  f"NaN rows as expected={same}{detail}", flush=True)
            results.append(ok)
    # NaN/Inf in V: that channel's fp8 scale (its max |v|) is NaN or Inf, so the channel comes out
    # non-finite in every row, as in exact attention; the other channels stay exact.
    for lq, value in itertools.product((1000, long), (float("nan"), float("inf"))):
        q, k, v = qkv(B=1, H=4, LQ=lq)
        v[(*BAD_TOKEN, 5)] = value
        out = sageattn(q, k, v)
        exact = ref.exact_attention(q, k, v)[0]
        bad = ~torch.isfinite(exact)
        same = torch.equal(~torch.isfinite(out), bad) and bool(bad[0, 1, :, 5].all())
        c = cosine(out[~bad], exact[~bad])
        ok = same and c >= 0.999
        print(f"{'ok ' if ok else 'BAD'} {f'{value} in v, {lq} tokens':60s} cos={c:.6f} "
              f"non-finite entries as expected={same} (ours {int((~torch.isfinite(out)).sum())}, "
              f"expected {int(bad.sum())})", flush=True)
        results.append(ok)
    return results


def _split_plan(q, k):
    """How the Gluon kernel's CTAs ran for these inputs: (whole CTAs, key shares per tail CTA)."""
    from sagetriton.kernels import api, hopper_gluon, tail_split

    B, H, LQ, _ = q.shape
    ctas_per_head, key_tiles = hopper_gluon.grid(LQ, k.shape[2])
    return tail_split.plan_tail(ctas_per_head * B * H, api.sm_count(q.device), key_tiles)


def shared_kv_cases() -> list:
    """Hopper's Gluon kernel (long sequences) must agree with the portable kernel and be the one that
    ran. Not bit for bit: its row sums add the fp8-rounded P (on the tensor cores), the portable
    kernel's the fp32 P. Elsewhere (or without Gluon) these cases are skipped."""
    from sagetriton.kernels import api, hopper_host
    from sagetriton.kernels.arch import default_config, detect_arch

    cfg = default_config(detect_arch(), 128)
    if not cfg.shared_kv_min_len:
        print("-- shared-K/V Gluon kernel: not used on this GPU")
        return []
    ran = []
    real = hopper_host.run_shared_kv
    hopper_host.run_shared_kv = lambda *a, **kw: ran.append(real(*a, **kw)) or ran[-1]
    results = []
    n = cfg.shared_kv_min_len
    try:
        residual = cfg.with_pv_choice("fp8+residual")
        int8 = cfg.with_pv_choice("int8").replace(qk_rotation=True)
        for name, (q, k, v), smooth_v, c_run in (
                ("odd lengths", qkv(B=1, H=4, LQ=n + 77, LK=n + 129), False, cfg),
                ("GQA 8/2, Lk > Lq", qkv(B=1, H=8, HKV=2, LQ=n, LK=n + 1000), False, cfg),
                ("smooth_v", qkv(B=1, H=4, LQ=n, LK=n), True, cfg),
                ("short K (77 keys)", qkv(B=1, H=4, LQ=n, LK=77), False, cfg),
                ("short K (300 keys)", qkv(B=1, H=4, LQ=n, LK=300), False, cfg),
                ("head_dim 96 (padded to 128)", qkv(B=1, H=4, LQ=n, D=96), False, cfg),
                ("fp8+residual, odd lengths", qkv(B=1, H=4, LQ=n + 77, LK=n + 129), False, residual),
                ("fp8+residual, GQA 8/2", qkv(B=1, H=8, HKV=2, LQ=n, LK=n + 1000), False, residual),
                # Partial last waves (kernels/tail_split.py): split CTAs only, whole + split, many shares.
                # Each head's last CTA has rows for one warpgroup only: the other two compute rows past LQ,
                # whose stores are masked (attempt 50's skipping of them was slower, bench/NOTES.md).
                ("two idle warpgroups per head's last CTA", qkv(B=1, H=6, LQ=n + 20, LK=n + 129), False, cfg),
                ("tail split, 2 heads, odd lengths", qkv(B=1, H=2, LQ=n + 77, LK=n + 129), False, cfg),
                ("tail split after whole waves, GQA 10/2, smooth_v", qkv(B=1, H=10, HKV=2, LQ=n + 77), True, cfg),
                ("tail split, 1 head, 4x the keys", qkv(B=1, H=1, LQ=n, LK=4 * n), False, cfg),
                ("tail split, fp8+residual", qkv(B=1, H=2, LQ=n + 77, LK=n + 129), False, residual),
                # Several waves of whole CTAs, batch > 1 (each CTA finds its batch, head and KV head).
                ("3.9 waves, batch 2, odd key length", qkv(B=2, H=8, LQ=n, LK=n + 129), False, cfg),
                ("6 waves, batch 2, GQA 12/4, smooth_v, odd lengths", qkv(B=2, H=12, HKV=4, LQ=n + 77, LK=n + 1),
                 True, cfg),
                ("11.6 waves of 4 key tiles each", qkv(B=4, H=12, LQ=n, LK=512), False, cfg),
                ("3.9 waves, fp8+residual", qkv(B=2, H=8, LQ=n, LK=n + 129), False, residual),
                ("int8 P·V, odd lengths", qkv(B=1, H=4, LQ=n + 77, LK=n + 129), False, int8),
                ("int8 P·V, GQA 8/2, smooth_v", qkv(B=1, H=8, HKV=2, LQ=n, LK=n + 1000), True, int8),
                ("int8 P·V, short K (77 keys)", qkv(B=1, H=4, LQ=n, LK=77), False, int8),
                ("int8 P·V, tail split, 2 heads", qkv(B=1, H=2, LQ=n + 77, LK=n + 129), False, int8),
                ("int8 P·V, 3.9 waves, batch 2", qkv(B=2, H=8, LQ=n, LK=n + 129), False, int8)):
            ran.clear()
            out, _ = api.attention_forward(q, k, v, "HND", False, None, None, False, c_run, True, smooth_v)
            again, _ = api.attention_forward(q, k, v, "HND", False, None, None, False, c_run, True, smooth_v)
            # The second call replays the first one's launches (kernels/replay.py) where it can.
            used = bool(ran) and all(ran)
            # Key shares are combined in a fixed order, without atomics: the same bits on every run.
            same = torch.equal(out, again)
            portable, _ = api.attention_forward(q, k, v, "HND", False, None, None, False,
                                                c_run.replace(shared_kv_min_len=0), True, smooth_v)
            agree = cosine(out, portable)
            c = cosine(out, ref.exact_attention(q, k, v)[0])
            plan = _split_plan(q, k)
            # A key share rounds P to fp8 against its own row max, not the running max over every key:
            # an independent fp8 rounding for those rows, as far from the portable kernel as either is
            # from fp64 at most. Whole CTAs differ only by the row sums' rounding.
            min_agree = SPLIT_MIN_AGREE if plan[1] > 1 else 0.99995
            ok = used and same and agree >= min_agree and c >= (RESIDUAL_MIN_COS if c_run.v_residual else 0.999)
            print(f"{'ok ' if ok else 'BAD'} {'shared-K/V Gluon kernel: ' + name:60s} cos={c:.6f} "
                  f"ran={used} deterministic={same} cos to portable={agree:.7f} (whole CTAs, shares) = {plan}",
                  flush=True)
            results.append(ok)
    finally:
        hopper_host.run_shared_kv = real
    return results


def replay_cases() -> list:
    """A call with a recorded call's shapes replays its launches straight through the compiled kernels'
    launchers (``kernels/launcher.py``): the same bits as the call worked out in full on the same inputs,
    for every path whose launches differ; and inputs whose alignment differs from the recorded call's
    (a kernel specialized for aligned pointers must not see them) go through ``kernel[grid]`` instead."""
    from sagetriton.kernels import api, failures, replay
    from sagetriton.kernels.arch import default_config, detect_arch

    base = default_config(detect_arch(), 128)
    gluon = base.replace(shared_kv_min_len=1) if api.uses_long_sequence_kernel(
        base.replace(shared_kv_min_len=1), 4096, 128, False, False, False) else None
    mask = torch.randn(1, 1, 1000, 1000, device="cuda", dtype=torch.bfloat16)
    cases = [("portable, default", dict(), base, None, "HND"),
             ("portable, int8 P·V, smooth_v", dict(smooth_v=True), base.with_pv_choice("int8"), None, "HND"),
             ("portable, additive mask, lse", dict(return_lse=True), base, mask, "HND"),
             ("portable, NHD in, HND out", dict(out_layout="HND"), base, None, "NHD")]
    if gluon is not None:
        cases.append(("Gluon, tail split", dict(LQ=4096 + 77), gluon, None, "HND"))
    results = []
    for name, kw, cfg, m, layout in cases:
        kw = dict(kw)
        shape = dict(B=1, H=6, LQ=kw.pop("LQ", 1000))
        lse, smooth_v, out_layout = kw.pop("return_lse", False), kw.pop("smooth_v", False), kw.pop("out_layout", None)

        def call(t, cfg=cfg, m=m, layout=layout, lse=lse, smooth_v=smooth_v, out_layout=out_layout):
            t = [x.transpose(1, 2) for x in t] if layout == "NHD" else t
            return api.attention_forward(*t, layout, False, None, m, lse, cfg, True, smooth_v, out_layout)

        replay.clear()
        call(qkv(**shape))  # recorded
        rec = next(iter(failures.memory.replays.values()), None)
        fresh = qkv(**shape)
        again = call(fresh)  # replayed
        replay.clear()
        full = call(fresh)  # worked out in full, recorded anew
        direct = rec is not None and rec.direct_calls == 1
        same = all(torch.equal(a, b) for a, b in zip(again, full, strict=True))
        # Misaligned inputs (views starting one element into their storage) must skip the launchers built
        # for aligned pointers and give what the unrecorded path gives on them. Not necessarily the aligned
        # inputs' bits: Triton picks its register layouts, hence the order of float sums, by alignment.
        rec = next(iter(failures.memory.replays.values()), None)
        odd = [torch.empty(x.numel() + 1, device="cuda", dtype=x.dtype)[1:].view_as(x).copy_(x) for x in fresh]
        shifted = call(odd)
        skipped = rec is not None and rec.direct_calls == 0
        replay.clear()
        unrecorded = call(odd)
        safe = skipped and all(torch.equal(a, b) for a, b in zip(shifted, unrecorded, strict=True))
        near = cosine(shifted[0], full[0])
        aligned_bits = all(torch.equal(a, b) for a, b in zip(shifted, full, strict=True))
        ok = direct and same and safe and near > 0.99999
        print(f"{'ok ' if ok else 'BAD'} {'replay: ' + name:60s} direct={direct} same bits={same} "
              f"misaligned inputs safe={safe} (launchers skipped={skipped}, cos to aligned={near:.7f}, "
              f"aligned bits={aligned_bits})", flush=True)
        results.append(ok)
    replay.clear()
    return results


# The arch table's families, as their GPUs identify (``installer.crosscompile.parse_target``).
FAMILY_TARGETS = ("sm80", "sm86", "sm89", "sm100", "sm120", "gfx1100", "gfx1201", "gfx942")
FMAX = torch.finfo(torch.float32).max


def family_configs() -> list:
    """[(labels, head_dim, config)]: each target's default and selectable P·V configs at head_dim 64 and
    128, deduplicated (sm100 and sm120 share a row). AMD's e4m3fnuz fp8 runs as e4m3fn here (NVIDIA has
    no fnuz MMA): same tiles and P·V precision, the other fp8 flavour."""
    from sagetriton.installer.crosscompile import parse_target
    from sagetriton.kernels.arch import PV_PRECISIONS, resolve_config, supported_choices

    seen: dict = {}
    for target in FAMILY_TARGETS:
        arch = parse_target(target).arch_info()
        for head_dim in (64, 128):
            for pv in (None, *PV_PRECISIONS):
                if pv is not None and not supported_choices(arch)["pv_precision"][pv][0]:
                    continue
                cfg = resolve_config(arch, head_dim, pv_precision=pv)[0]
                if cfg.fp8_format == "e4m3fnuz":
                    cfg = cfg.replace(fp8_format="e4m3fn")
                seen.setdefault((cfg, head_dim), []).append(f"{target}{'/' + pv if pv else ' default'}")
    return [(labels, d, cfg) for (cfg, d), labels in seen.items()]


def _forward(q, k, v, cfg, mask=None, scale=None):
    from sagetriton.kernels.api import attention_forward

    return attention_forward(q, k, v, "HND", False, scale, mask, False, cfg, True, False)[0]


def hostile_mask(lq: int, lk: int) -> torch.Tensor:
    """Additive mask, one hostile case per row (rows 6.. ordinary): -finfo.max and -1e30 everywhere,
    -inf then -finfo.max and the reverse (across key tiles), -inf everywhere, a -finfo.max padding."""
    m = torch.zeros(lq, lk, device="cuda")
    m[1] = -FMAX
    m[2] = -1e30
    m[3, :lk // 2] = float("-inf")
    m[3, lk // 2:] = -FMAX
    m[4, :lk // 2] = -FMAX
    m[4, lk // 2:] = float("-inf")
    m[5] = float("-inf")
    m[6:, lk - lk // 5:] = -FMAX
    return m


# Huge logits: rows whose winning logit leads the next by more than this (relative) are ones INT8
# rounding of Q and K cannot reorder; measured with the torch reference, the method reorders rows up
# to a ~5-10 % lead (bench/NOTES.md, "gpu_check: huge logits").
RESOLVED_LEAD = 0.1
# A row "matches" an expectation at this per-row cosine: near one-hot rows that took another winner
# read ~0, the fp8 P·V rounding of a right one ~0.9998.
ROW_MATCH = 0.99


def huge_logit_rows(out, q, k, v, cfg, mask=None, k_group=None):
    """(ok, detail) for logits around 1e7 (q, k x3000), where every row is nearly one-hot. Every finite row
    must be the fp64 answer or the quantized method's (``quantized_reference``: INT8 rounding may pick a
    near-winner, which SDPA on the rounded inputs would pick too), never a third; rows with a lead INT8
    cannot reorder must be the fp64 answer (cosine >= 0.999 over them); a non-finite row is all NaN
    (the one-FMA loop's overflow, for the guard). ``k_group``: K's grouping where the kernel's differs from
    ``cfg``'s (``quant.K_SM90_GROUPS``: per_thread on Hopper's Gluon kernel)."""
    exact = ref.exact_attention(q, k, v, attn_mask=mask)[0]
    method = ref.quantized_reference(q, k, v, cfg, attn_mask=mask, k_group=k_group)[0]
    top = (q.double() @ k.double().transpose(-1, -2)).topk(2, dim=-1).values
    resolved = (top[..., 0] - top[..., 1]) > RESOLVED_LEAD * top[..., 0].abs()
    finite = torch.isfinite(out).all(-1)

    def row_cos(a, b):
        return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)

    as_exact = row_cos(out, exact) >= ROW_MATCH
    as_method = row_cos(out, method) >= ROW_MATCH
    third = finite & ~as_exact & ~as_method
    rows = resolved & finite
    c = cosine(out[rows], exact[rows]) if rows.any() else 1.0
    ok = bool((finite | torch.isnan(out).all(-1)).all()) and not bool(third.any()) and c >= 0.999
    method_only = int((finite & as_method & ~as_exact).sum())
    return ok, (f"cos={c:.6f} on {int(rows.sum())} finite rows leading by >{RESOLVED_LEAD:.0%}; rows as fp64 "
                f"{int((finite & as_exact).sum())}, as the method only {method_only}, neither {int(third.sum())}, "
                f"NaN rows {int((~finite).sum())}")


def hostile_results(cfg, d: int, lq: int = 300, lk: int = 333, masks: bool = True, k_group=None) -> dict:
    """The kernel with ``cfg`` on every hostile input; {case: (ok, detail)}.
    Expectations: fp64 SDPA (``exact_attention``), whose -finfo.max/-1e30 rows average V and whose
    fully masked rows are 0; NaN/Inf inputs give non-finite output wherever fp64 attention has it.
    Huge logits: ``huge_logit_rows`` (INT8 rounding may pick another near-winner, as the method does)."""
    def run(q, k, v, mask=None, scale=None):
        return _forward(q, k, v, cfg, mask, scale)

    res = {}
    g = torch.Generator(device="cuda").manual_seed(39)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)

    q, k, v = rnd(1, 2, lq, d), rnd(1, 2, lk, d), rnd(1, 2, lk, d)
    k = k + 2 * rnd(d)
    if masks:
        mask = hostile_mask(lq, lk)
        out = run(q, k, v, mask=mask)
        exact = ref.exact_attention(q, k, v, attn_mask=mask)[0]
        rows = torch.ones(lq, dtype=torch.bool, device="cuda")
        rows[5] = False
        means = (out[:, :, [1, 2]].double() - v.double().mean(2, keepdim=True)).abs().max().item()
        mixed = (out[:, :, 3].double() - v[:, :, lk // 2:].double().mean(2)).abs().max().item()
        c = cosine(out[:, :, rows], exact[:, :, rows])
        ok = bool(torch.isfinite(out).all()) and c >= 0.999 and means < 0.02 and mixed < 0.02 and bool(
            (out[:, :, 5] == 0).all())
        res["masks"] = (ok, f"cos={c:.6f} |-max row - mean V|={means:.4f} mixed={mixed:.4f}")
        bmask = torch.rand(lq, lk, device="cuda", generator=g) > 0.4
        bmask[2] = False
        out = run(q, k, v, mask=bmask)
        exact = ref.exact_attention(q, k, v, attn_mask=bmask)[0]
        c = cosine(out, exact)
        res["bool mask, empty row"] = (bool((out[:, :, 2] == 0).all()) and c >= 0.999, f"cos={c:.6f}")
    big_q, big_k = (q.float() * 3000).to(q.dtype), (k.float() * 3000).to(k.dtype)
    if masks:  # a (zero) mask: materialized logits, exact at any size
        zero = torch.zeros(lq, lk, device="cuda")
        res["q, k x3000 (logits ~1e7), masked"] = huge_logit_rows(run(big_q, big_k, v, mask=zero), big_q, big_k, v,
                                                                 cfg, zero)
    # Unmasked: the one-FMA loop gives NaN rows beyond 2^16 (base 2), for the guard; never a finite wrong row.
    res["q, k x3000 (logits ~1e7), unmasked"] = huge_logit_rows(run(big_q, big_k, v), big_q, big_k, v, cfg,
                                                                k_group=k_group)
    bq, bk, bv = (t.repeat(3, 1, 1, 1).clone() for t in (q, k, v))
    bq[0, 0, 3, 4] = float("nan")
    bk[1, 1, lk // 2, 2] = float("nan")
    bv[2, 0, 10, 5] = float("inf")
    out = run(bq, bk, bv)
    exact = ref.exact_attention(bq, bk, bv)[0]
    bad = ~torch.isfinite(exact)
    missed = int((bad & torch.isfinite(out)).sum())
    res["NaN in q, NaN in k, Inf in v"] = (missed == 0 and bool(bad[:, :].any()),
                                           f"non-finite expected {int(bad.sum())}, finite of those {missed}")
    scale = -1.0 / math.sqrt(d)
    out = run(q, k, v, scale=scale)
    c = cosine(out, ref.exact_attention(q, k, v, sm_scale=scale)[0])
    res["negative sm_scale"] = (c >= 0.999, f"cos={c:.6f}")
    return res


def family_cases() -> list:
    """Every family's configs through the portable kernel: ordinary inputs, then the hostile ones."""
    results = []
    for labels, d, cfg in family_configs():
        name = f"{', '.join(labels)} d{d}: {cfg.pv_choice()} {cfg.block_m}x{cfg.block_n}/{cfg.num_warps}w"
        t0 = time.time()
        try:
            q, k, v = qkv(B=1, H=4, LQ=777, LK=901, D=d)
            c = cosine(_forward(q, k, v, cfg), ref.exact_attention(q, k, v)[0])
            found = {"ordinary": (c >= (RESIDUAL_MIN_COS if cfg.v_residual else 0.999), f"cos={c:.6f}")}
            found.update(hostile_results(cfg, d))
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a failure, not a crash
            found = {"compile/launch": (False, f"{type(e).__name__}: {str(e)[:200]}")}
        for case_name, (ok, detail) in found.items():
            print(f"{'ok ' if ok else 'BAD'} {'family ' + name + ' / ' + case_name:60s} {detail}", flush=True)
            results.append(ok)
        print(f"   ({time.time() - t0:.1f} s)", flush=True)
    return results


def hostile_fast_path_cases() -> list:
    """The hostile inputs on this GPU's own defaults (INT8 P·V's shift with the int8 choice) and, on
    Hopper, through the Gluon kernel (long, unmasked calls): fp8 and int8 P·V."""
    from sagetriton.kernels import hopper_host
    from sagetriton.kernels.arch import default_config, detect_arch

    results = []
    for d in (64, 128):
        base = default_config(detect_arch(), d)
        for pv in ("fp8", "int8"):
            cfg = base.with_pv_choice(pv).replace(shared_kv_min_len=0)
            for case_name, (ok, detail) in hostile_results(cfg, d).items():
                print(f"{'ok ' if ok else 'BAD'} {f'this GPU d{d} {pv}: {case_name}':60s} {detail}", flush=True)
                results.append(ok)
    cfg = default_config(detect_arch(), 128)
    if not cfg.shared_kv_min_len:
        return results
    ran = []
    real = hopper_host.run_shared_kv
    hopper_host.run_shared_kv = lambda *a, **kw: ran.append(real(*a, **kw)) or ran[-1]
    try:
        for pv in ("fp8", "int8"):
            c_run = cfg.with_pv_choice(pv)
            ran.clear()
            found = hostile_results(c_run, 128, lq=cfg.shared_kv_min_len + 77, lk=cfg.shared_kv_min_len + 129,
                                    masks=False)  # masked calls never reach the Gluon kernel
            used = bool(ran) and all(ran)
            for case_name, (ok, detail) in found.items():
                print(f"{'ok ' if ok and used else 'BAD'} {f'Gluon {pv}: {case_name}':60s} {detail} ran={used}",
                      flush=True)
                results.append(ok and used)
    finally:
        hopper_host.run_shared_kv = real
    return results


def core_cases() -> list:
    """Every kernel feature on ordinary inputs, the non-finite inputs, the Gluon kernel and direct launches."""
    results = []
    for gran, pv, acc in itertools.product(("per_block", "per_warp", "per_thread"),
                                           ("fp16", "fp8", "fp8+residual", "int8"), ("fp32", "fp16+fp32")):
        if pv == "int8" and acc != "fp32":
            continue  # INT8 P·V sums exactly in int32: no accumulation choice
        results.append(case(f"{gran} {pv} {acc}", *qkv(), min_cos=RESIDUAL_MIN_COS if pv == "fp8+residual" else 0.999,
                            qk_quant_gran=gran, pv_precision=pv, pv_accum_dtype=acc))
    for D in (40, 64, 80, 96, 120, 128, 160, 256):
        results.append(case(f"head_dim {D}", *qkv(D=D, LQ=777)))
    for dtype in (torch.float16, torch.float32):
        results.append(case(f"dtype {dtype}", *qkv(dtype=dtype)))
    q, k, v = qkv(LQ=1000, LK=77)
    results.append(case("cross-attention 1000x77", q, k, v))
    results.append(case("GQA 8/2", *qkv(H=8, HKV=2)))
    results.append(case("causal 1000x1300", *qkv(LQ=1000, LK=1300), is_causal=True))
    q, k, v = qkv(LQ=900, LK=700)
    m = torch.rand(2, 1, 900, 700, device="cuda") > 0.3
    results.append(case("bool mask (B,1,Lq,Lk)", q, k, v, attn_mask=m))
    results.append(case("additive mask (Lq,Lk)", q, k, v, attn_mask=torch.randn(900, 700, device="cuda")))
    nhd = [t.transpose(1, 2) for t in qkv()]
    results.append(case("NHD strided", *nhd, tensor_layout="NHD"))
    q, k, v = qkv()
    results.append(case("large V (x3000 + 1000) fp16 accum", q, k, (v.float() * 3000 + 1000).to(v.dtype),
                        pv_precision="fp16", pv_accum_dtype="fp16+fp32"))
    results.append(case("smooth_v", q, k, v, smooth_v=True))
    from sagetriton.kernels.api import attention_forward
    from sagetriton.kernels.arch import default_config, detect_arch

    for pv in ("fp16", "fp8", "fp8+residual", "int8"):
        cfg = default_config(detect_arch(), 128).with_pv_choice(pv).replace(
            use_tma=True, pv_accum_dtype="fp16+fp32" if pv == "fp16" else "fp32")
        q, k, v = qkv(LQ=1000, LK=1001)
        out, _ = attention_forward(q, k, v, "HND", False, None, None, False, cfg, True, False)
        c = cosine(out, ref.exact_attention(q, k, v)[0])
        print(f"{'ok ' if c >= 0.999 else 'BAD'} {'tensor descriptors (TMA) ' + pv:60s} cos={c:.6f}")
        results.append(c >= 0.999)
    results += nonfinite_cases()
    results += shared_kv_cases()
    results += replay_cases()
    results += rope_cases()
    return results


def rope_cases() -> list:
    """``kernels.rope`` gives ComfyUI's bits: Flux's q and k in one launch, Wan's strided (B, L, H, D) q, both
    roundings, 16-bit dtypes, a head size whose pairs are not a power of two."""
    from sagetriton.kernels import rope

    results = []
    for dtype, fma, D in itertools.product((torch.bfloat16, torch.float16), (False, True), (128, 96)):
        q, k = (torch.randn(2, 24, 4608, D, device="cuda", dtype=dtype) * 3 for _ in range(2))
        f = ref.rope_matrices(4608, D // 2, device="cuda")
        oq, ok_ = rope.apply(q, f, k, fma=fma)
        same = torch.equal(oq, ref.rope(q, f, fma)) and torch.equal(ok_, ref.rope(k, f, fma))
        name = f"rope: Flux q+k {dtype} D={D} fma={fma}"
        print(f"{'ok ' if same else 'BAD'} {name:60s} same bits={same}", flush=True)
        results.append(same)
    qkv_ = torch.randn(2, 3000, 3, 12, 128, device="cuda", dtype=torch.float16)
    x, f = qkv_[:, :, 0], ref.rope_matrices(3000, 64, device="cuda").movedim(1, 2)
    same = torch.equal(rope.apply(x, f, fma=True), ref.rope(x, f, True))
    print(f"{'ok ' if same else 'BAD'} {'rope: Wan strided (B, L, H, D) fp16, fma':60s} same bits={same}", flush=True)
    results.append(same)
    # Longer matrices cut to the input (a view, as the RoPE hook passes Flux.2's on current ComfyUI).
    q = torch.randn(1, 24, 4096, 128, device="cuda", dtype=torch.bfloat16)
    f = ref.rope_matrices(4608, 64, device="cuda")[:, :, :4096]
    same = torch.equal(rope.apply(q, f, fma=True), ref.rope(q, f, True))
    print(f"{'ok ' if same else 'BAD'} {'rope: longer matrices cut to the input, bf16, fma':60s} same bits={same}",
          flush=True)
    results.append(same)
    return results


from kcols_check import kcols_cases  # noqa: E402
from lse_check import lse_cases  # noqa: E402


def sparse_cases() -> list:
    from sparse_check import sparse_cases as cases

    return cases()


def sparse_extra_cases() -> list:
    from sparse_check import extra_cases

    return extra_cases()


PARTS = {"core": core_cases, "hostile": hostile_fast_path_cases, "families": family_cases, "replay": replay_cases,
         "rope": rope_cases, "lse": lse_cases, "kcols": kcols_cases, "sparse": sparse_cases,
         "sparse_extra": sparse_extra_cases}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=tuple(PARTS), help="run only this part")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gpu_check.py needs a GPU")
    print(environment())
    t0 = time.time()
    results = []
    for name, part in PARTS.items():
        if args.only == name or (args.only is None and name != "sparse_extra"):  # that one is in "sparse" too
            results += part()
    label = f" ({args.only})" if args.only else ""
    print(f"gpu_check{label} ({time.time() - t0:.0f} s): {sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
