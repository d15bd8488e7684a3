"""per_thread calls on Hopper's long-sequence kernel quantize K in SageAttention's sm90 groups (``quant.K_SM90_GROUPS``,
``hopper_logits.K_PER_GROUP``): one scale per 128-key tile and MMA column group (keys 8j + 2t + e alike in t), so
each thread's logits share a K scale and the kernel's key loop takes the per-tile kernel's math (integer row max,
one FMA per logit). Checked without a GPU: the quantization launch against the pure-torch reference, the whole
call through the portable kernel (which reads the same per-key array) against fp64 and the quantized reference,
and the sm90 SASS of the Gluon kernels. The GPU numbers are ``gpu_check.py --only kcols`` and bench_dropin.py's."""
import math

import pytest
import torch
from compile_child import gluon_builds_in_child
from sagetriton.kernels import hopper_host, quant
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import ArchInfo, KernelConfig, resolve_config
from sagetriton.kernels.hopper_logits import K_PER_GROUP, K_PER_KEY, K_PER_TILE
from sagetriton.kernels.reference import cosine

HOPPER = ArchInfo("nvidia", "sm90", "hopper", fp8="e4m3fn")


def _keys(L=300, H=2, D=64, seed=0, spread=30.0):
    """Keys whose magnitudes vary per token (x1 to x ``spread``), as per-token scales are for."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, H, L, D, generator=g) * torch.exp(torch.rand(1, H, L, 1, generator=g) * math.log(spread))
    return k.to(torch.bfloat16)


def test_the_layout_follows_the_kernel_and_the_switch(monkeypatch):
    per_thread = resolve_config(HOPPER, 128, "per_thread", pv_precision="fp8")[0]
    per_warp = resolve_config(HOPPER, 128, "per_warp", pv_precision="fp8")[0]
    plan = ("a Gluon plan",)
    assert hopper_host.k_layout(per_thread, plan) == K_PER_GROUP
    assert hopper_host.k_layout(per_thread, None) == K_PER_KEY  # the portable kernel: per token
    assert hopper_host.k_layout(per_warp, plan) == K_PER_TILE
    monkeypatch.setitem(hopper_host.TUNING, "k_groups", False)
    assert hopper_host.k_layout(per_thread, plan) == K_PER_KEY


def test_k_is_quantized_in_sageattentions_sm90_groups():
    """The quantization launch (interpreter) against the reference: a scale per (tile, t) group, repeated per key,
    the group's largest key at ±127; a NaN key makes its whole group's scale NaN and no other; 300 keys (a
    partial last tile)."""
    from sagetriton.kernels import api

    k = _keys()
    k[0, 1, 133, 5] = float("nan")  # tile 1, group t = (133 % 8) // 2 = 2
    k8, ks = api._quantize_qk(k, quant.K_SM90_GROUPS, 128, 64, 1.0)
    want_i, want_s = ref._quantize_groups(k.float(), quant.K_SM90_GROUPS)
    key = torch.arange(300)
    group = (key // 128) * 4 + (key % 8) // 2
    bad = torch.zeros(2, 300, dtype=torch.bool)
    bad[1] = (group == group[133])
    assert torch.equal(torch.isnan(ks), bad)
    assert torch.allclose(ks[~bad], want_s[0][~bad], rtol=1e-6, atol=0)
    for h in range(2):
        for g in group.unique():
            s = ks[h, group == g]
            assert (s == s[0]).all() or bad[h, group == g].all(), (h, g)
            if not bad[h, group == g].any():
                assert k8[h, group == g].abs().max() == 127
    good = ~bad[0]
    assert (k8[0][good, :64].float() != want_i[0, 0][good]).sum() <= 2  # ties summed in another order
    # Not per token: a group's scale is its largest key's, so most keys' scales differ from their own.
    assert (ks[0] != api._quantize_qk(k, 1, 128, 64, 1.0)[1][0]).float().mean() > 0.5


@pytest.mark.parametrize("smooth_k", [True, False])
def test_a_call_with_sm90_k_groups_matches_the_references(monkeypatch, smooth_k):
    """A per_thread fp8 call whose K is quantized in the groups (as on the Gluon kernel), run by the portable kernel
    on CPU, against fp64 and the quantized reference with the same groups; its accuracy against fp64 within
    the per-token call's (the reference SageAttention's per_thread is this granularity)."""
    from sagetriton.kernels import api

    cfg = KernelConfig("per_thread", "fp8", "fp32", "e4m3fn", 64, 128, 4, 1)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 200, 64, generator=g).to(torch.bfloat16)
    k = _keys(L=300, seed=2, spread=4.0) + 2.0  # a mean for smooth_k to take out
    v = torch.randn(1, 2, 300, 64, generator=g).to(torch.bfloat16)
    exact, exact_lse = ref.exact_attention(q, k, v)
    per_key, _ = api.attention_forward(q, k, v, "HND", False, None, None, True, cfg, smooth_k, False)
    monkeypatch.setattr(hopper_host, "k_layout", lambda c, plan: K_PER_GROUP)
    out, lse = api.attention_forward(q, k, v, "HND", False, None, None, True, cfg, smooth_k, False)
    qref, qref_lse = ref.quantized_reference(q, k, v, cfg, smooth_k=smooth_k, k_group=quant.K_SM90_GROUPS)
    assert not torch.equal(out, per_key)
    assert cosine(out, qref) >= 0.999
    assert (lse - qref_lse).abs().max() < 3e-2
    assert cosine(out, exact) >= 0.998 and cosine(out, exact) >= cosine(per_key, exact) - 2e-3
    assert (lse.double() - exact_lse).abs().max() < 0.2  # logits up to ~20: the per-token call's 0.08-0.1


_SASS_SCRIPT = """
import json, re, subprocess, sys, tempfile
from pathlib import Path
from sagetriton_import import import_pack
import_pack()
import torch, triton
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels import api, hopper_gluon, hopper_host, replay, rotation, tail_split
from sagetriton.kernels.arch import resolve_config
target = cc.parse_target("sm90")
nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
out = {"gluon": hopper_gluon.AVAILABLE}


def key_loops(sass):
    # (label, opcode) per line; a key loop: a backward branch whose body holds a warpgroup MMA.
    ins = []
    for line in sass.splitlines():
        m = re.match(r"^\\s*(\\.L_x_\\d+):", line)
        if m:
            ins.append((m.group(1), None))
            continue
        m = re.match(r"^\\s*/\\*[0-9a-f]+\\*/\\s+(.*?)\\s*;", line)
        if m:
            ins.append((None, re.sub(r"^@!?U?P\\w+\\s+", "", m.group(1))))
    where = {lab: i for i, (lab, _) in enumerate(ins) if lab}
    found = []
    for i, (_, op) in enumerate(ins):
        m = op and re.match(r"^BRA\\s+`?\\(?(\\.L_x_\\d+)", op)
        if m and where.get(m.group(1), i) < i:
            body = [o for _, o in ins[where[m.group(1)]:i + 1] if o]
            if any(re.match(r"^(IGMMA|QGMMA|HGMMA)", o) for o in body):
                found.append({"instructions": len(body), "FMUL": sum(o.startswith("FMUL") for o in body),
                              "LDG": sum(o.startswith("LDG") for o in body),
                              "local": sum(bool(re.match(r"^(LDL|STL)", o)) for o in body)})
    return sorted(found, key=lambda r: r["instructions"])[:3]


if hopper_gluon.AVAILABLE:
    for gran, groups in (("per_warp", True), ("per_thread", True), ("per_thread", False)):
        hopper_host.TUNING["k_groups"] = groups
        cfg = resolve_config(target.arch_info(), 128, gran, pv_precision=sys.argv[1])[0]
        n = cfg.shared_kv_min_len + 77
        heads = tail_split.heads_with_split_tail(*hopper_gluon.grid(n, n), api.sm_count(torch.device("meta")))
        q = torch.empty((1, heads, n, 128), dtype=torch.bfloat16, device="meta")
        for lse in (False, True):
            replay.clear()
            with cc.record_launches() as specs:
                api.attention_forward(q, q, q, "HND", False, None, None, lse, cfg, True, False)
            for spec in specs:
                if not spec["name"].startswith("shared_kv"):
                    continue
                with cc.sm90_ptxas_scope():
                    compiled = triton.compile(cc.launch_source(spec, target), target=target.gpu_target())
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(compiled.asm["cubin"])
                    f.flush()
                    sass = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True,
                                          check=True).stdout
                res = cc._resources(compiled, target)
                out[f"{gran}/{groups}/{spec['name']}"] = dict(k_cols=spec["constexprs"]["K_COLS"],
                                                               spills=res.get("spills", 0), loops=key_loops(sass))
    # K's quantization launch in the groups as a 32K x 12 heads call launches it (8 tiles a program, rotated).
    hopper_host.TUNING["k_groups"] = True
    replay.clear()
    cfg = resolve_config(target.arch_info(), 128, "per_thread", pv_precision=sys.argv[1])[0]
    with cc.record_launches() as specs:
        api.attention_forward(torch.empty((1, 12, 32768, 128), dtype=torch.bfloat16, device="meta"),
                              *[torch.empty((1, 12, 32768, 128), dtype=torch.bfloat16, device="meta")] * 2, "HND",
                              False, None, None, True, cfg, True, False)
    for spec in specs:
        c = spec["constexprs"]
        if spec["name"] == "quantize_int8_kernel" and c["GROUP"] == 0:
            opts = dict(spec.get("options") or {}, **({"maxnreg": rotation.TILED_MAXNREG} if c.get("ROTATE_TILES")
                                                      else {}))  # as host_quant launches it on a GPU
            compiled = triton.compile(cc.launch_source(spec, target), target=target.gpu_target(), options=opts)
            out["k_quant"] = dict(cc._resources(compiled, target), tiles=c.get("ROTATE_TILES"))
print(json.dumps(out))
"""
# Spill instructions outside the key loops the grouped kernels may have (SASS read; none inside): Triton 3.8 3-32
# (the split kernel's, around its masked tile), 3.6 0-9; the per-key kernels had 35-68 with 8-30 inside.
KGROUPS_SPILLS = 40
# Key-loop instructions against the per-tile kernel's same loop: 3.8 -4 to 0, 3.6 -2 to +4 (of 412-479); the
# per-key kernels took +22 to +27 %.
KGROUPS_LOOP_RATIO = 1.02
KQUANT_SPILLS = 8


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fp8", "fp8+residual"])
def test_grouped_k_kernels_keep_the_per_tile_key_loop(variant):
    """Cross-compiled for sm90 (whole, split and LSE twins): the grouped kernels' key loops have no local memory,
    the per-tile kernels' multiplies (4 FMUL: one per logit would be 64 more) and one scale load per tile, and
    within KGROUPS_LOOP_RATIO of the per-tile loops' instructions; with the switch off, per-key kernels build."""
    r = gluon_builds_in_child(_SASS_SCRIPT, [variant])
    kernels = ("shared_kv_attention_kernel", "shared_kv_split_kernel", "shared_kv_attention_lse_kernel",
               "shared_kv_split_lse_kernel")
    for name in kernels:
        tile, grouped, per_key = (r[f"{g}/{name}"] for g in ("per_warp/True", "per_thread/True", "per_thread/False"))
        assert (tile["k_cols"], grouped["k_cols"], per_key["k_cols"]) == (K_PER_TILE, K_PER_GROUP, K_PER_KEY), name
        assert len(grouped["loops"]) == 3 and grouped["spills"] <= KGROUPS_SPILLS, (name, grouped)
        for mine, theirs in zip(grouped["loops"], tile["loops"], strict=True):
            assert mine["local"] == 0 and mine["FMUL"] <= theirs["FMUL"] and mine["LDG"] <= 1, (name, mine)
            assert mine["instructions"] <= KGROUPS_LOOP_RATIO * theirs["instructions"], (name, mine, theirs)
        assert per_key["loops"] and all(lp["FMUL"] >= 64 for lp in per_key["loops"]), (name, per_key)
    # K's quantization launch in the groups builds for sm90 (Hopper's default: the tiled rotation, 8 tiles a program):
    # 2 (3.6) / 8 (3.8) spill instructions, loop-invariant values stored once and reloaded per tile (per token: 0).
    k_quant = r["k_quant"]
    assert k_quant["tiles"] == 8 and k_quant["spills"] <= KQUANT_SPILLS and k_quant["registers"] > 0, k_quant


@pytest.mark.parametrize("method,D", [("dot", 64), ("tiled", 128)])
def test_rotated_k_is_grouped_the_same_way(method, D):
    """With the Q/K rotation (``qk_rotation``; "tiled" is Hopper's default) the rotated keys are grouped: scales and
    INT8 values as the reference's rotation then groups."""
    from sagetriton.kernels import api

    k = _keys(D=D, spread=20.0)
    k8, ks = api._quantize_qk(k, quant.K_SM90_GROUPS, 128, D, 1.0, rotate=D, method=method)
    rotated = (ref._rotated if method == "dot" else ref._rotated_exactly)(k.float(), D)
    want_i, want_s = ref._quantize_groups(rotated, quant.K_SM90_GROUPS)
    assert torch.allclose(ks, want_s[0], rtol=1e-6, atol=0)
    assert (k8.float() != want_i[0]).sum() <= 2
    assert (ks[:, :128].reshape(2, 16, 4, 2) == ks[:, :128].reshape(2, 16, 4, 2)[:, :1, :, :1]).all()
