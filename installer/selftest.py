"""Build and self-test every kernel variant this device can select; measure the SDPA crossover.

Accuracy is measured against torch SDPA in fp32 with the MATH backend (exact, and safe on every
GPU including RDNA4, where other SDPA backends can crash). Speed is measured against the SDPA the
runtime would fall back to. On a CPU the same accuracy test runs through the Triton interpreter
at small sizes.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Optional

from ..kernels.arch import PV_ACCUM_DTYPES, QK_QUANT_GRANS, ArchInfo, default_config, supported_choices
from ..kernels.build_errors import is_oom, root_cause
from .report import CROSSOVER_BATCH, CROSSOVER_HEADS, variant_name

# A broken build (miscompile, wrong layout) lands far below these; a correct one is ~0.9993+ / ~0.03.
MIN_COSINE = 0.99
MAX_REL_L1 = 0.1

BUILD_HEAD_DIMS = (64, 128)  # others (40, 80, 96, 160, 256, ...) are compiled on first use
GPU_ACCURACY_SHAPES = ((1, 8, 1024, 1024, 128), (2, 4, 333, 77, 64))  # (B, H, Lq, Lk, D); odd sizes on purpose
CPU_ACCURACY_SHAPES = ((1, 2, 64, 64, 64), (1, 2, 100, 77, 40))
# 4608 = Flux at 1024² (4096 image + 512 text tokens); 3072 and 6144 split the 2K-4K and 4K-8K gaps
# (a GPU whose kernel wins from 3K would otherwise be read as 4K).
CROSSOVER_LENGTHS = (256, 512, 1024, 2048, 3072, 4096, 4608, 6144, 8192, 16384)
CROSSOVER_HEAD_DIMS = (128, 64)  # the first is the report's headline; the others go to "by_head_dim"


def variants_for(arch: ArchInfo) -> list:
    """Every (granularity, P·V precision, accumulation) the Sage Settings node can select on ``arch``."""
    pv_ok = [p for p, (ok, _) in supported_choices(arch)["pv_precision"].items() if ok]
    return [{"qk_quant_gran": g, "pv_precision": p, "pv_accum_dtype": a}
            for g, p, a in itertools.product(QK_QUANT_GRANS, pv_ok, PV_ACCUM_DTYPES)
            if p != "int8" or a == "fp32"]  # INT8 P·V sums in int32: the accumulation choice does not apply


def default_variant(arch: ArchInfo, head_dim: int = 128) -> dict:
    cfg = default_config(arch, head_dim)
    return {"qk_quant_gran": cfg.qk_quant_gran, "pv_precision": cfg.pv_precision, "pv_accum_dtype": cfg.pv_accum_dtype}


def name_of(variant: dict) -> str:
    return variant_name(variant["qk_quant_gran"], variant["pv_precision"], variant["pv_accum_dtype"])


# ---------------------------------------------------------------------------------------------
# Metrics and inputs


def make_inputs(shape, device, dtype, seed: int = 0):
    """q, k, v in HND layout; K gets per-channel offsets like real models have (what smooth_k removes)."""
    import torch

    b, h, lq, lk, d = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g)
    k = torch.randn(b, h, lk, d, generator=g) + 4 * torch.randn(1, h, 1, d, generator=g)
    v = torch.randn(b, h, lk, d, generator=g)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def reference(q, k, v):
    """fp32 SDPA with the MATH backend."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float())


def _sageattn():
    from ..kernels import sageattn

    return sageattn


# ---------------------------------------------------------------------------------------------
# Build and accuracy


def build_variant(variant: dict, head_dim: int, device, dtype, tokens: int = 256) -> dict:
    """Compile (first call JIT-compiles) and run once on a small input. Never raises."""
    import torch

    t0 = time.perf_counter()
    try:
        q, k, v = make_inputs((1, 2, tokens, tokens, head_dim), device, dtype, seed=1)
        out = _sageattn()(q, k, v, **variant)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if not torch.isfinite(out).all():
            return {"ok": False, "seconds": round(time.perf_counter() - t0, 2), "error": "non-finite output"}
        return {"ok": True, "seconds": round(time.perf_counter() - t0, 2)}
    except Exception as e:  # noqa: BLE001 - a variant that does not build is turned off, not fatal
        return {"ok": False, "seconds": round(time.perf_counter() - t0, 2), "error": _short_error(e),
                **({"oom": True} if is_oom(e) else {})}


def accuracy(variant: dict, shapes, device, dtype) -> dict:
    """Worst cosine / relative L1 over ``shapes`` vs fp32 MATH SDPA. Never raises."""
    from ..kernels.reference import cosine, rel_l1  # torch-importing: kept off this module's import path
    worst = {"cosine": 1.0, "rel_l1": 0.0}
    try:
        for i, shape in enumerate(shapes):
            q, k, v = make_inputs(shape, device, dtype, seed=10 + i)
            out = _sageattn()(q, k, v, **variant)
            ref = reference(q, k, v)
            c, r = cosine(out, ref), rel_l1(out, ref)
            if not math.isfinite(c) or not math.isfinite(r):
                c, r = 0.0, float("inf")
            worst = {"cosine": min(worst["cosine"], c), "rel_l1": max(worst["rel_l1"], r)}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": _short_error(e), **({"oom": True} if is_oom(e) else {})}
    ok = worst["cosine"] >= MIN_COSINE and worst["rel_l1"] <= MAX_REL_L1
    out = {"ok": ok, "cosine": round(worst["cosine"], 6), "rel_l1": round(worst["rel_l1"], 5)}
    if not ok:
        out["error"] = f"inaccurate: cosine {worst['cosine']:.4f} (min {MIN_COSINE}), rel L1 {worst['rel_l1']:.4f}"
    return out


def long_sequence_kernel(arch: ArchInfo, device, dtype) -> Optional[dict]:
    """Build and check the kernel that serves long sequences where the default config has one
    (Hopper's Gluon shared-K/V kernel, ``KernelConfig.shared_kv_min_len``); None elsewhere.

    The runtime falls back to the portable kernel by itself if it cannot build the Gluon kernel; this
    makes that happen here, once, in front of the user, and catches wrong numbers, which no fallback
    would. A failure turns the long-sequence kernel off, not the variant. Never raises."""
    from ..kernels import api, hopper_gluon, hopper_host, tail_split

    cfg = default_config(arch, 128)
    if not cfg.shared_kv_min_len or getattr(device, "type", None) != "cuda":
        return None
    result = {"min_tokens": cfg.shared_kv_min_len}
    if not hopper_gluon.AVAILABLE:
        return {**result, "ok": False, "error": "this Triton has no Gluon (triton.experimental.gluon)"}
    t0 = time.perf_counter()
    # Odd lengths on purpose: a partial last CTA of query rows and a masked last key tile. Heads
    # enough for whole CTAs and a split last wave (tail_split) on this GPU: both kernels and the merge.
    lq, lk = cfg.shared_kv_min_len + 37, 1101
    heads = tail_split.heads_with_split_tail(*hopper_gluon.grid(lq, lk), api.sm_count(device))
    acc = accuracy(default_variant(arch), [(1, heads, lq, lk, 128)], device, dtype)
    result.update(acc, seconds=round(time.perf_counter() - t0, 2))
    error = hopper_host.shared_kv_error()
    if error is not None:
        result.update(ok=False, error=error)
    return result


def format_long_sequence_kernel(r: Optional[dict]) -> Optional[str]:
    if not r:
        return None
    where = f"from {r.get('min_tokens', '?')} query tokens"
    if r.get("ok"):
        return f"long-sequence kernel (Gluon, {where}): ok, cosine {r['cosine']:.5f}, rel L1 {r['rel_l1']:.4f}"
    return (f"long-sequence kernel (Gluon, {where}): OFF, the portable kernel serves those calls "
            f"({(r.get('error') or '?')[:160]})")


def rope_kernel(device, dtype) -> Optional[dict]:
    """Build the RoPE kernel (``kernels.rope``) and check that it gives ComfyUI's bits: Flux's q and k in one
    launch with both of ComfyUI's roundings, and Wan's strided (B, L, H, D) layout. A failure turns the
    pack's RoPE off (ComfyUI's own runs), nothing else. GPU only: the interpreter rounds differently.
    Never raises."""
    return check_rope_kernel(device, dtype) if getattr(device, "type", None) == "cuda" else None


def check_rope_kernel(device, dtype) -> dict:
    """``rope_kernel``'s check on ``device``, whatever it is. Never raises."""
    import torch

    t0 = time.perf_counter()
    wrong = []
    try:
        from ..kernels import reference, rope  # rope imports Triton

        g = torch.Generator(device="cpu").manual_seed(0)
        q, k = (3 * torch.randn(1, 3, 301, 128, generator=g).to(device=device, dtype=dtype) for _ in range(2))
        freqs = reference.rope_matrices(301, 64, device=device)
        for fma in (False, True):
            rq, rk = rope.apply(q, freqs, k, fma=fma)
            if not (torch.equal(rq, reference.rope(q, freqs, fma)) and torch.equal(rk, reference.rope(k, freqs, fma))):
                wrong.append("q and k, " + ("addcmul_" if fma else "a * b + c * d"))
        x, wan = q.transpose(1, 2), freqs.movedim(1, 2)
        if not torch.equal(rope.apply(x, wan, fma=True), reference.rope(x, wan, True)):
            wrong.append("Wan's layout")
    except Exception as e:  # noqa: BLE001 - reported, and the runtime keeps ComfyUI's RoPE
        return {"ok": False, "error": _short_error(e), "oom": is_oom(e),
                "seconds": round(time.perf_counter() - t0, 2)}
    result = {"ok": not wrong, "seconds": round(time.perf_counter() - t0, 2)}
    if wrong:
        result["error"] = "not ComfyUI's bits: " + ", ".join(wrong)
    return result


def format_rope_kernel(r: Optional[dict]) -> Optional[str]:
    if not r:
        return None
    if r.get("ok"):
        return "RoPE kernel (Flux, Chroma, HiDream, Wan): ok, ComfyUI's bits"
    return f"RoPE kernel: OFF, ComfyUI's own RoPE runs ({(r.get('error') or '?')[:160]})"


def _short_error(e: BaseException) -> str:
    return root_cause(e)


# ---------------------------------------------------------------------------------------------
# Speed and crossover


def time_call(fn, device, iters: int = 10, warmup: int = 3, repeats: int = 3) -> float:
    """Milliseconds per call: the median of ``iters × repeats`` calls, on a GPU each timed alone
    right after the L2 cache was overwritten.

    That is the state inside a model forward: the layers between two attention calls evict their
    inputs from L2 (timed back to back, SDPA reads warm caches and the crossover comes out too late;
    bench/NOTES.md). Calls are queued without waiting, so host-side launch cost only counts where it
    exceeds the GPU time, as in a forward.
    """
    import torch

    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(iters * repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    else:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        scratch = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)
        events = []
        for _ in range(iters * repeats):
            scratch.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) for start, end in events]
    times.sort()
    return times[len(times) // 2]


def sdpa_fallback(arch: ArchInfo, sdpa_safe: Optional[bool]):
    """The SDPA the runtime falls back to: MATH on RDNA4 unless the default passed the child probe."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if arch.family == "rdna4" and not sdpa_safe:
        def math_sdpa(q, k, v):
            with sdpa_kernel([SDPBackend.MATH]):
                return F.scaled_dot_product_attention(q, k, v)
        return math_sdpa, "math"
    return F.scaled_dot_product_attention, "default"


# The kernel must beat SDPA by this factor to be picked at a length: near the crossover both are
# host-bound and a small win flips between runs, while a slow host step costs far more (bench/NOTES.md).
CROSSOVER_MARGIN = 0.95


def crossover_from_timings(timings: list) -> dict:
    """Smallest length from which the kernel is faster, by ``CROSSOVER_MARGIN``, at every measured length."""
    seq_len = None
    for t in sorted(timings, key=lambda t: t["seq_len"], reverse=True):
        if t["kernel_ms"] <= CROSSOVER_MARGIN * t["sdpa_ms"]:
            seq_len = t["seq_len"]
        else:
            break
    return {"seq_len": seq_len, "kernel_never_faster": seq_len is None and bool(timings), "timings": timings,
            "margin": CROSSOVER_MARGIN}


def retime_implausible(timings: list, time_length, on_length=None) -> None:
    """Time again, once, each length where the kernel took as long as at the next longer one. Its work grows with
    the length, so such a row is a hiccup (another program, a clock ramp) or host-bound calls; one row like
    that would hold the crossover above every shorter length (``crossover_from_timings``). The lower of the
    two times counts for each side, and the row says it was re-timed."""
    timed = [t for t in timings if "kernel_ms" in t]
    for t, longer in zip(timed[:-1], timed[1:], strict=True):
        if t["kernel_ms"] < longer["kernel_ms"]:
            continue
        try:
            again = time_length(t["seq_len"])
        except Exception:  # noqa: BLE001 - the first timing stands
            continue
        for side in ("kernel", "sdpa"):
            if again[f"{side}_ms"] < t[f"{side}_ms"]:
                t[f"{side}_ms"], t[f"{side}_tops"] = again[f"{side}_ms"], again[f"{side}_tops"]
        t["retimed"] = True
        if on_length:
            on_length(t)


def alternating(fn, sets: list):
    """``fn`` called on each input set in turn."""
    turns = itertools.cycle(sets)
    return lambda: fn(*next(turns))


def measure_crossovers(arch: ArchInfo, device, dtype, sdpa_safe: Optional[bool] = None,
                       head_dims=CROSSOVER_HEAD_DIMS, pv_choice: Optional[dict] = None, **kw) -> dict:
    """The crossover for ``head_dims[0]`` with the others under ``"by_head_dim"``: at head_dim 64 the
    same tile does half the matrix work per exp2, so the kernel needs longer sequences to win. Each is
    measured with the P·V path ``measure_pv_choice`` chose for that size, where it chose one."""
    def one(d):
        pv = ((pv_choice or {}).get("by_head_dim", {}).get(str(d)) or {}).get("choice")
        return measure_crossover(arch, device, dtype, sdpa_safe, head_dim=d,
                                 variant={"pv_precision": pv} if pv else None, **kw)

    result = one(head_dims[0])
    result["by_head_dim"] = {str(d): one(d) for d in head_dims[1:]}
    return result


def measure_crossover(arch: ArchInfo, device, dtype, sdpa_safe: Optional[bool] = None, head_dim: int = 128,
                      lengths=CROSSOVER_LENGTHS, heads: int = CROSSOVER_HEADS, batch: int = CROSSOVER_BATCH,
                      on_length=None, variant: Optional[dict] = None) -> dict:
    import torch

    sdpa, sdpa_name = sdpa_fallback(arch, sdpa_safe)
    sage = (lambda q, k, v: _sageattn()(q, k, v, **variant)) if variant else _sageattn()
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 8 << 30

    def time_length(n: int) -> dict:
        try:
            # Two input sets taken in turn, as a model's layers would: a call does not simply reread
            # the inputs the previous one left in L2.
            sets = [make_inputs((batch, heads, n, n, head_dim), device, dtype, seed=n + i) for i in range(2)]
            iters = 10 if n <= 4096 else 6
            t_sage = time_call(alternating(sage, sets), device, iters)
            t_sdpa = time_call(alternating(sdpa, sets), device, iters)
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        flops = 4 * batch * heads * n * n * head_dim
        return {"seq_len": n, "kernel_ms": round(t_sage, 4), "sdpa_ms": round(t_sdpa, 4),
                "kernel_tops": round(flops / t_sage / 1e9, 1), "sdpa_tops": round(flops / t_sdpa / 1e9, 1)}

    timings = []
    for n in lengths:
        # MATH materialises the (H, L, L) scores in fp32 (plus softmax): skip lengths that would not fit.
        need = batch * ((3 * heads * n * n * 4) if sdpa_name == "math" else (16 * heads * n * head_dim * 2))
        if need > 0.5 * free:
            continue
        try:
            timings.append(time_length(n))
        except Exception as e:  # noqa: BLE001 - e.g. out of memory at the longest length: stop there
            timings.append({"seq_len": n, "error": _short_error(e)})
            break
        if on_length:
            on_length(timings[-1])
    retime_implausible(timings, time_length, on_length)
    result = crossover_from_timings([t for t in timings if "kernel_ms" in t])
    result.update({"sdpa": sdpa_name, "batch": batch, "heads": heads, "head_dim": head_dim,
                   "dtype": str(dtype).replace("torch.", "")})
    if variant:
        result["variant"] = dict(variant)
    return result


# P·V paths install.py times against each other on the user's GPU (the arch table's default comes
# from datasheet rates, which this replaces with a measurement where both 8-bit paths work).
PV_CHOICE_CANDIDATES = ("fp8", "int8")
PV_CHOICE_LENGTH = 8192  # long enough that the kernel, not its launches, is timed


def pv_candidates(arch: ArchInfo, head_dim: int, passed) -> list:
    """The default variant's P·V and the 8-bit ones this GPU runs natively, among the variant names
    ``passed`` (built and self-tested)."""
    base = default_variant(arch, head_dim)
    native = [p for p, (ok, _) in supported_choices(arch)["pv_precision"].items() if ok]
    out = []
    for pv in dict.fromkeys((base["pv_precision"], *PV_CHOICE_CANDIDATES)):
        v = {**base, "pv_precision": pv, "pv_accum_dtype": "fp32" if pv == "int8" else base["pv_accum_dtype"]}
        if pv in native and name_of(v) in passed:
            out.append(v)
    return out


def choose_pv(ms: dict) -> Optional[str]:
    """The fastest measured P·V (``{pv: ms}``, failed ones absent), None with nothing measured."""
    timed = {pv: t for pv, t in ms.items() if isinstance(t, (int, float)) and math.isfinite(t) and t > 0}
    return min(timed, key=timed.get) if timed else None


def measure_pv_choice(arch: ArchInfo, device, dtype, passed, head_dims=CROSSOVER_HEAD_DIMS,
                      seq_len: int = PV_CHOICE_LENGTH, heads: int = CROSSOVER_HEADS,
                      batch: int = CROSSOVER_BATCH) -> Optional[dict]:
    """Per head size, each candidate P·V (``pv_candidates``) timed on the same inputs and the fastest
    named ``choice``; None where there is nothing to choose (one candidate). Never raises."""
    import torch

    result = {"seq_len": seq_len, "batch": batch, "heads": heads, "by_head_dim": {}}
    for d in head_dims:
        cands = pv_candidates(arch, d, passed)
        if len(cands) < 2:
            continue
        ms, errors = {}, {}
        try:
            sets = [make_inputs((batch, heads, seq_len, seq_len, d), device, dtype, seed=7 + i) for i in range(2)]
        except Exception as e:  # noqa: BLE001 - no room for the inputs: nothing measured at this size
            result["by_head_dim"][str(d)] = {"choice": None, "ms": {}, "errors": {"inputs": _short_error(e)}}
            continue
        for v in cands:
            try:
                ms[v["pv_precision"]] = round(time_call(alternating(
                    lambda q, k, v_, var=v: _sageattn()(q, k, v_, **var), sets), device, iters=5), 4)
            except Exception as e:  # noqa: BLE001 - that path is simply not chosen
                errors[v["pv_precision"]] = _short_error(e)
        entry = {"choice": choose_pv(ms), "ms": ms}
        if errors:
            entry["errors"] = errors
        result["by_head_dim"][str(d)] = entry
        del sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result if result["by_head_dim"] else None


def format_pv_choice(r: Optional[dict]) -> Optional[str]:
    if not r:
        return None
    parts = []
    for d, e in r.get("by_head_dim", {}).items():
        times = ", ".join(f"{pv} {t:.2f} ms" for pv, t in e.get("ms", {}).items())
        parts.append(f"head_dim {d}: {e.get('choice') or 'none'} ({times or 'nothing measured'})")
    shape = f"{r.get('batch')}x{r.get('heads')}x{r.get('seq_len')}"
    return f"P·V path, timed at {shape} (the faster one is used when Sage Settings says auto): " + "; ".join(parts)


def format_variant_table(variants: dict) -> str:
    width = max([28, *map(len, variants)])  # the longest name sets the column (fp8+residual/fp16+fp32 is 32)
    lines = [f"{'variant':<{width}} {'build':<6} {'cosine':>8} {'rel L1':>8}  note"]
    for name, r in variants.items():
        b, acc = r.get("build", {}), r.get("selftest", {})
        note = b.get("error") or acc.get("error") or ""
        cos = f"{acc['cosine']:.5f}" if "cosine" in acc else "-"
        rl1 = f"{acc['rel_l1']:.4f}" if "rel_l1" in acc else "-"
        lines.append(f"{name:<{width}} {'ok' if b.get('ok') else 'FAIL':<6} {cos:>8} {rl1:>8}  {note[:80]}")
    return "\n".join(lines)


def format_crossover(cross: Optional[dict]) -> str:
    if not cross:
        return "crossover: not measured"
    text = _format_one_crossover(cross)
    for other in (cross.get("by_head_dim") or {}).values():
        text += "\n" + _format_one_crossover(other)
    return text


def _format_one_crossover(cross: dict) -> str:
    lines = [f"head_dim {cross.get('head_dim', '?')}, batch {cross.get('batch', 1)} x {cross.get('heads', '?')} heads:",
             f"{'tokens':>7} {'kernel ms':>10} {'SDPA ms':>10} {'kernel TOPS':>12} {'SDPA TOPS':>10}"]
    for t in cross.get("timings", []):
        lines.append(f"{t['seq_len']:>7} {t['kernel_ms']:>10.3f} {t['sdpa_ms']:>10.3f} {t['kernel_tops']:>12.1f} "
                     f"{t['sdpa_tops']:>10.1f}" + ("  (timed twice)" if t.get("retimed") else ""))
    if cross.get("seq_len"):
        lines.append(f"crossover: the kernel beats SDPA ({cross.get('sdpa')}) from {cross['seq_len']} tokens")
    elif cross.get("kernel_never_faster"):
        lines.append(f"crossover: the kernel did not beat SDPA ({cross.get('sdpa')}) at any measured length")
    return "\n".join(lines)
