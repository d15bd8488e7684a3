"""``gpu_check.py --only sparse``: the compiled sparse kernels against the fp64 reference of the method.

Every GPU family's configs (``gpu_check.family_configs``: the arch table's tiles, P·V precision, scale
granularity and rotation, resolved as on that GPU) and this GPU's own defaults, on smooth inputs (local
attention, far from dense) of a ragged length, with tau, top-k and sinks; then hostile inputs (a NaN
query token, NaN keys, huge logits, sinks past the end), one-block and shorter sequences, and 300K tokens
through a fused-QKV view (element offsets past 2^31). The error allowed is the dense kernel's own
quantization error on the same inputs (as tests/test_sparse.py, which runs the same checks on the CPU).
"""
from __future__ import annotations

import math
import time

import torch
from sagetriton.kernels import sageattn, sparse_attn
from sagetriton.kernels import sparse_reference as sref
from sagetriton.kernels.api import attention_forward
from sagetriton.kernels.reference import cosine

DEVICE = "cuda"  # "cpu" under TRITON_INTERPRET=1: a smoke run of these checks' own code on small shapes


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def smooth_qkv(T, H=4, H_KV=2, D=128, strength=1.0, seed=0, dtype=torch.bfloat16):
    """As tests/test_sparse.py's: features smooth along the sequence, so attention is local."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    pos = torch.arange(T, device=DEVICE, dtype=torch.float32)[:, None]
    base = torch.sin(pos * torch.rand(D, generator=g, device=DEVICE) * 0.15 + torch.rand(D, generator=g, device=DEVICE)
                     * 6.3)

    def t(h, amp, noise):
        return (amp * base[None, :, None, :] + noise * torch.randn(1, T, h, D, generator=g, device=DEVICE)).to(dtype)

    q = t(H, strength, 0.5)
    k = t(H_KV, strength, 0.5) + torch.randn(D, generator=g, device=DEVICE).to(dtype)
    return q, k, t(H_KV, 1.0, 1.0)


def _report(name, ok, detail):
    print(f"{'ok ' if ok else 'BAD'} {('sparse ' + name)[:60]:60s} {detail}", flush=True)
    return bool(ok)


def _budget(q, k, v, cfg=None):
    exact = sref.dense_reference(q, k, v)
    if cfg is None:
        dense = sageattn(q, k, v, "NHD")
    else:
        dense = attention_forward(q, k, v, "NHD", False, None, None, False, cfg, True, False)[0]
    return 1.5 * rel(dense, exact) + 2e-3


def _against_reference(name, q, k, v, cfg=None, **kw) -> bool:
    out, density = sparse_attn(q, k, v, return_density=True, config=cfg, **kw)
    ref, ref_density = sref.sparse_reference(q, k, v, return_density=True, **kw)
    err, allowed = rel(out, ref), _budget(q, k, v, cfg)
    # TF32 proxy scores: a block within ~1e-3 of its threshold may go either way on the GPU
    dens_ok = abs(float(density) - float(ref_density)) <= 0.002
    return _report(name, err <= allowed and dens_ok and out.dtype == q.dtype,
                   f"rel {err:.4f} (allowed {allowed:.4f}), density {float(density):.4f} vs {float(ref_density):.4f}")


def _each_family(configs, check, suffix: str = "") -> list:
    """``check(name, q, k, v, cfg)``'s results for each (labels, head_dim, config), on 1,000 tokens; a config
    that does not compile is a failure, not a crash."""
    results = []
    for labels, d, cfg in configs:
        name = f"{labels[0]} d{d} {cfg.pv_choice()} {cfg.qk_quant_gran}{suffix}"
        try:
            q, k, v = smooth_qkv(1000, D=d, seed=d)
            results += check(name, q, k, v, cfg)
        except Exception as e:  # noqa: BLE001
            results.append(_report(name, False, f"{type(e).__name__}: {str(e)[:200]}"))
    return results


def family_cases() -> list:
    from gpu_check import family_configs

    return _each_family(family_configs(), lambda name, q, k, v, cfg: [
        _against_reference(f"{name} tau 1.0", q, k, v, cfg, tau=1.0),
        _against_reference(f"{name} top-k 0.2", q, k, v, cfg, topk_ratio=0.2)])


def own_cases() -> list:
    results = []
    q, k, v = smooth_qkv(1000)
    results.append(_against_reference("default tau 1.3", q, k, v))
    results.append(_against_reference("sinks", q, k, v, tau=1.5, sink_blocks=[0, 2], sink_q=[3, 4]))
    results.append(_against_reference("sinks past the end", q, k, v, tau=1.0, sink_blocks=[10, 99], sink_q=[15, 40]))
    for T in (1, 40, 64, 65, 130):  # one block and shorter, one token past a block
        q, k, v = smooth_qkv(T, seed=T)
        results.append(_against_reference(f"length {T}", q, k, v, tau=1.0))
    q, k, v = smooth_qkv(1000, H=4, H_KV=4, seed=7)
    qkv = torch.cat([q, k, v], dim=-1)  # fused projection, split as views
    out = sparse_attn(qkv[..., :128], qkv[..., 128:256], qkv[..., 256:], 1.0)
    results.append(_report("fused-QKV views", torch.equal(out, sparse_attn(q, k, v, 1.0)), "same bits as contiguous"))
    out, lse = sparse_attn(q, k, v, 1.0, return_lse=True)
    _, ref_lse = sref.sparse_reference(q, k, v, 1.0, return_lse=True)
    err = float((lse - ref_lse).abs().max())
    results.append(_report("lse", err < 0.05, f"max |lse - fp64| {err:.4f}"))
    return results


def hostile_cases() -> list:
    results = []
    q, k, v = smooth_qkv(500, H=2, H_KV=2, seed=11)
    qn = q.clone()
    qn[0, 70, 1, 3] = float("nan")
    bad = ~torch.isfinite(sparse_attn(qn, k, v, 1.0)[0, :, 1]).all(-1)
    results.append(_report("NaN query token: its 64-row block NaN only", bad[64:128].all() and int(bad.sum()) == 64,
                           f"{int(bad.sum())} rows non-finite"))
    kn = k.clone()
    kn[0, 5, 0, 0] = float("nan")
    out = sparse_attn(q, kn, v, 1.0)
    results.append(_report("NaN key: its head NaN, as SDPA", torch.isnan(out[:, :, 0]).all()
                           and torch.isfinite(out[:, :, 1]).all(), "head 0 NaN, head 1 finite"))
    qf, kf, vf = q.float() * 3000, k.float() * 3000, v.float()
    out = sparse_attn(qf, kf, vf, 1.0)
    ok, detail = huge_logit_rows(out, qf, kf, vf, sref.sparse_reference(qf, kf, vf, 1.0))
    results.append(_report("huge logits: right, a near-winner or NaN", ok, detail))
    return results


def huge_logit_rows(out, q, k, v, ref):
    """(ok, detail) for logits around 1e7 (NHD, as many key heads as query heads), where every row is nearly
    one-hot. A row is all NaN, or fp64's answer, or the value of a near-winner (a key within RESOLVED_LEAD of
    the row's top logit, which INT8 rounding of Q and K may put first); rows leading by more must be fp64's
    (cosine 0.999 over them). The sparse method has no quantized twin to compare with, hence the keys. The
    lead and the row match are the dense check's (``gpu_check.huge_logit_rows``)."""
    from gpu_check import RESOLVED_LEAD, ROW_MATCH

    o, r, vv = (x.double().transpose(1, 2) for x in (out, ref, v))  # (B, H, L, D)
    logits = q.double().transpose(1, 2) @ k.double().transpose(1, 2).transpose(-1, -2)
    top = logits.topk(2, dim=-1).values
    resolved = (top[..., 0] - top[..., 1]) > RESOLVED_LEAD * top[..., 0].abs()
    near = logits >= (top[..., :1] - RESOLVED_LEAD * top[..., :1].abs())
    unit = torch.nn.functional.normalize
    as_key = ((unit(o, dim=-1) @ unit(vv, dim=-1).transpose(-1, -2)).masked_fill(~near, -1).amax(-1)) >= ROW_MATCH
    as_ref = torch.nn.functional.cosine_similarity(o, r, dim=-1) >= ROW_MATCH
    finite, nan = torch.isfinite(o).all(-1), torch.isnan(o).all(-1)
    third = finite & ~as_ref & ~as_key
    rows = finite & resolved
    c = cosine(o[rows], r[rows]) if rows.any() else 1.0
    ok = bool((finite | nan).all()) and not bool(third.any()) and c >= 0.999
    return ok, (f"{int(finite.sum())} finite rows, {int((finite & ~as_ref).sum())} a near-winner's, {int(third.sum())} "
                f"neither, {int((~finite & ~nan).sum())} partly NaN; cos {c:.6f} on {int(rows.sum())} leading by "
                f">{RESOLVED_LEAD:.0%}")


def long_case(T: int = 300_000, H: int = 24, extra: int = 0) -> list:
    """300K tokens through fused-QKV views (offsets past 2^31 elements); the last query blocks checked."""
    t0 = time.time()
    qkv = torch.cat(smooth_qkv(T, H=H, H_KV=H, seed=3), dim=-1)
    q, k, v = qkv[..., :128], qkv[..., 128:256], qkv[..., 256:]
    assert qkv.numel() > 2**31
    out, density = sparse_attn(q, k, v, 1.3, return_density=True, extra_tokens=extra)
    torch.cuda.synchronize()
    seconds = time.time() - t0
    nb = math.ceil(T / 64)
    blocks = range(nb - 3, nb)
    hs = slice(H - 2, H)  # the last heads: their rows sit at the largest offsets
    ref = sref.sparse_reference(q[:, :, hs], k[:, :, hs], v[:, :, hs], 1.3, dtype=torch.float32, query_blocks=blocks,
                                extra_tokens=extra)
    rows = slice((nb - 3) * 64, T)
    err = rel(out[:, rows, hs], ref[:, rows])
    return [_report(f"{T} tokens x {H} heads, fused view" + (f", extra {extra}" if extra else ""),
                    err < 0.05 and torch.isfinite(out).all(),
                    f"rel {err:.4f} on the last blocks, density {float(density):.4f}, {seconds:.0f} s")]


def extra_cases() -> list:
    """``extra_tokens`` (kernels/sparse_extra.py) against the reference: each budget with GQA and LSE, with
    sinks, top-k and a ragged length; the families' distinct LSE frames at 128; NaN query; 300K tokens at
    256."""
    from gpu_check import family_configs

    results = extra_router_cases()
    q, k, v = smooth_qkv(1000)
    for extra in (64, 128, 192, 256):
        results.append(_against_reference(f"extra {extra} tau 1.3", q, k, v, extra_tokens=extra))
    out, lse = sparse_attn(q, k, v, 1.3, extra_tokens=256, return_lse=True)
    ref, ref_lse = sref.sparse_reference(q, k, v, 1.3, extra_tokens=256, return_lse=True)
    err, moved = float((lse - ref_lse).abs().max()), rel(sref.sparse_reference(q, k, v, 1.3), ref)
    results.append(_report("extra 256 lse, and the extra tokens matter", err < 0.05 and moved > 0.01,
                           f"max |lse - fp64| {err:.4f}; reference moved {moved:.3f} by them"))
    results.append(_against_reference("extra 128 sinks", q, k, v, tau=1.5, sink_blocks=[0, 2], sink_q=[3, 4],
                                      extra_tokens=128))
    results.append(_against_reference("extra 192 top-k 0.2", q, k, v, topk_ratio=0.2, extra_tokens=192))
    q, k, v = smooth_qkv(777, seed=5)
    results.append(_against_reference("extra 256 length 777", q, k, v, tau=1.0, extra_tokens=256))
    qn = q.clone()
    qn[0, 70, 1, 3] = float("nan")
    bad = ~torch.isfinite(sparse_attn(qn, k, v, 1.0, extra_tokens=256)[0, :, 1]).all(-1)
    results.append(_report("extra 256 NaN query token: its block NaN only", bad[64:128].all() and int(bad.sum()) == 64,
                           f"{int(bad.sum())} rows non-finite"))
    frames = {}
    for labels, d, cfg in family_configs():
        # the extra path's config-dependent part is the kernel's LSE frame: one case per P·V format, scale
        # granularity, rotation and head size (the families' other choices are checked without extra tokens)
        fp8 = cfg.fp8_format if cfg.pv_precision == "fp8" else None
        frames.setdefault((d, cfg.pv_choice(), fp8, cfg.qk_quant_gran, cfg.qk_rotation, cfg.rotation_tiles),
                          (labels, d, cfg))
    results += _each_family(frames.values(), lambda name, q, k, v, cfg: [
        _against_reference(name, q, k, v, cfg, tau=1.0, extra_tokens=128)], suffix=" extra 128")
    return results + long_case(extra=256)


def extra_router_cases() -> list:
    """The extra router's choice token for token against the fp64 rule (``sref._extra_select``) on the
    scores of the centroids and centre it was given, outside the router's own exact blocks: its 16-bit
    products (the centroid in 16-bit parts) must be as good as fp32. bf16 and fp16, 64 and 16 query blocks a
    program (Hopper's and the others'), 4,200 tokens (66 key blocks, K off centre)."""
    from sagetriton.kernels import sparse_extra, sparse_launch

    results = []
    for dtype, qb, extra in ((torch.bfloat16, 64, 128), (torch.bfloat16, 16, 256), (torch.float16, 64, 64)):
        q, k, v = smooth_qkv(4200, H=2, H_KV=1, seed=7, dtype=dtype)
        r = sref.route_reference(q, k, 1.3)
        nb, d = r["centroid"].shape[2], q.shape[-1]
        flat = lambda x, nb=nb, d=d: x.float().reshape(-1, nb, d).contiguous()  # noqa: E731
        cen, kc, mu = flat(r["centroid"]), flat(r["kc"]), r["mu"].float().reshape(-1, d).contiguous()
        vsum = flat(sref._block_pool(v.permute(0, 2, 1, 3).double(), nb, "sum"))
        kvar = (r["kc"] ** 2).mean(2).float().reshape(-1, d).contiguous()
        log2s = sref.LOG2E / math.sqrt(d)
        lists, count, tm, tl_, tacc = sparse_launch.route(cen, kc, vsum, kvar, 1, 2, 1, 4200, 1.3, log2s, None, None,
                                                          None)
        qh, kh, vh = (x.permute(0, 2, 1, 3) for x in (q, k, v))
        idx, n_extra = sparse_extra.retail(qh, kh, vh, cen, mu, lists, count, tm, tl_, tacc, log2s, extra, qb=qb,
                                           pipelined=True)
        exact = torch.zeros(2, nb, nb + 1, dtype=torch.bool, device=DEVICE)  # the router's lists, as a mask
        cols = torch.where(torch.arange(nb, device=DEVICE) < count[..., None], lists[..., :nb].long(), nb)
        exact.scatter_(-1, cols, True)
        tok_blk = torch.arange(4200, device=DEVICE) // 64
        c = cen.double() @ (kh[0, 0].double() - mu[0].double()).T * log2s  # (2, nb, T): what it was given
        want = sref._extra_select(c, ~exact[..., :nb][:, :, tok_blk], extra)
        live = torch.arange(extra, device=DEVICE) < n_extra[..., None].long()
        got = torch.zeros(2, nb, 4201, dtype=torch.bool, device=DEVICE)  # the last column takes the unused slots
        got.scatter_(-1, torch.where(live, idx.long(), 4200), True)
        diff = int((got[..., :4200] ^ want).sum())
        results.append(_report(f"extra router {str(dtype)[6:]} qb {qb} +{extra}: choice = fp64's", diff == 0,
                               f"{diff} tokens differ of {int(want.sum())} chosen"))
    return results


def sparse_cases() -> list:
    return own_cases() + hostile_cases() + long_case() + family_cases() + extra_cases()
