"""Per-token K scales in Hopper's long-sequence kernel (``kernels/hopper_logits.py``, ``K_COLS``), checked without
a GPU: per_thread calls (the drop-in's default, ``sageattn_qk_int8_pv_fp8_cuda_sm90`` as yunchang calls it) are
sent to the Gluon kernel with a scale per key, and its per-token variant (plain and LSE twin, whole and split
kernels) cross-compiles for sm90 with the plain kernels' registers and its own matrix instructions. The numbers
are bench/gpu_check.py's (``--only kcols``) on an H200; the speed, bench/bench_dropin.py's."""
import pytest
from compile_child import gluon_builds_in_child
from sagetriton.kernels.arch import ArchInfo, resolve_config
from sagetriton.kernels.hopper_host import uses_long_sequence_kernel
from sagetriton.kernels.hopper_logits import K_PER_GROUP, K_PER_KEY, K_PER_TILE

HOPPER = ArchInfo("nvidia", "sm90", "hopper", fp8="e4m3fn")


def test_per_thread_fp8_calls_on_hopper_take_the_long_sequence_kernel():
    cfg = resolve_config(HOPPER, 128, "per_thread", pv_precision="fp8")[0]
    assert cfg.group_sizes() == (1, 1) and cfg.shared_kv_min_len == 4608
    n = cfg.shared_kv_min_len
    for lse in (False, True):
        assert uses_long_sequence_kernel(cfg, n, 128, False, False, lse)
        assert uses_long_sequence_kernel(cfg, n + 77, 96, False, False, lse)  # head_dim 96, padded to 128
    # What the kernel does not do stays on the portable kernel: masks, causal, short, 64-wide heads.
    assert not uses_long_sequence_kernel(cfg, n - 1, 128, False, False, False)
    assert not uses_long_sequence_kernel(cfg, n, 128, True, False, False)
    assert not uses_long_sequence_kernel(cfg, n, 128, False, True, False)
    assert not uses_long_sequence_kernel(cfg.replace(shared_kv_min_len=n), n, 64, False, False, False)
    residual = resolve_config(HOPPER, 128, "per_thread", pv_precision="fp8+residual")[0]
    assert uses_long_sequence_kernel(residual, n, 128, False, False, False)
    # INT8 P·V with a scale per key: portable (its per-token Gluon build spilled 171 times, hopper_logits).
    int8 = resolve_config(HOPPER, 128, "per_thread", pv_precision="int8")[0]
    assert not uses_long_sequence_kernel(int8, n, 128, False, False, False)
    assert uses_long_sequence_kernel(resolve_config(HOPPER, 128, "per_warp", pv_precision="int8")[0], n, 128,
                                     False, False, False)


_ROUTE_SCRIPT = """
import json
from sagetriton_import import import_pack
import_pack()
import torch
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels import api, hopper_gluon, tail_split
from sagetriton.kernels import sageattention_compat as sa
hopper = cc.parse_target("sm90").arch_info()
api.arch_for_device = lambda device: hopper  # what an H200 reports for the inputs' device
api._resolved_config.cache_clear()
n = 4608 + 77
heads = tail_split.heads_with_split_tail(*hopper_gluon.grid(n, n), api.sm_count(torch.device("meta")))
q = torch.empty((1, n, heads, 128), dtype=torch.bfloat16, device="meta")
out = {"gluon": hopper_gluon.AVAILABLE, "heads": heads, "n": n}
if hopper_gluon.AVAILABLE:
    for name, kw in (("sageattn_qk_int8_pv_fp8_cuda_sm90", {"pv_accum_dtype": "fp32+fp32"}),
                     ("sageattn_qk_int8_pv_fp8_cuda", {"pv_accum_dtype": "fp32+fp32"}), ("sageattn", {})):
        for lse in (False, True):
            with cc.record_launches() as specs:
                getattr(sa, name)(q, q, q, tensor_layout="NHD", return_lse=lse, **kw)
            out[name + ("/lse" if lse else "")] = [
                [s["name"], s["constexprs"].get("K_COLS"), list(s["args"][4].shape)]  # KS follows the descriptors
                for s in specs if s["name"].startswith("shared_kv")]
print(json.dumps(out))
"""


def test_dropin_per_thread_names_launch_the_per_token_gluon_kernels():
    """The drop-in's per_thread names, called as yunchang calls them on an H200 (NHD, with and without the LSE),
    launch the Gluon kernel's whole and split CTAs with a K scale per key (B·H_KV, LK), equal over SageAttention's
    sm90 groups (``K_PER_GROUP``, tests/test_hopper_kgroups.py); ``sageattn`` (per_warp) keeps one per 128-key
    tile. Recorded on meta tensors in a child without the interpreter (nothing is run)."""
    r = gluon_builds_in_child(_ROUTE_SCRIPT, timeout=300)
    heads, n = r["heads"], r["n"]
    per_key, per_tile = [heads, n], [heads, -(-n // 128)]
    for name in ("sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_qk_int8_pv_fp8_cuda"):
        assert r[name] == [["shared_kv_attention_kernel", K_PER_GROUP, per_key],
                           ["shared_kv_split_kernel", K_PER_GROUP, per_key]]
        assert r[name + "/lse"] == [["shared_kv_attention_lse_kernel", K_PER_GROUP, per_key],
                                    ["shared_kv_split_lse_kernel", K_PER_GROUP, per_key]]
    assert r["sageattn"] == [["shared_kv_attention_kernel", K_PER_TILE, per_tile],
                             ["shared_kv_split_kernel", K_PER_TILE, per_tile]]
    assert r["sageattn/lse"] == [["shared_kv_attention_lse_kernel", K_PER_TILE, per_tile],
                                 ["shared_kv_split_lse_kernel", K_PER_TILE, per_tile]]


_BUILD_SCRIPT = """
import json, re, sys
from sagetriton_import import import_pack
import_pack()
import torch
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels import api, hopper_gluon, hopper_host, tail_split
from sagetriton.kernels.arch import resolve_config
target = cc.parse_target("sm90")
hopper_host.TUNING["k_groups"] = False  # the per-key kernels (the grouped ones: tests/test_hopper_kgroups.py)
out = {"gluon": hopper_gluon.AVAILABLE}
if hopper_gluon.AVAILABLE:
    for variant in sys.argv[1:]:
        cfg = resolve_config(target.arch_info(), 128, "per_thread", pv_precision=variant)[0]
        n = cfg.shared_kv_min_len + 77  # a partial last key tile: the masked tile with a scale per key
        heads = tail_split.heads_with_split_tail(*hopper_gluon.grid(n, n), api.sm_count(torch.device("meta")))
        q = torch.empty((1, heads, n, 128), dtype=torch.bfloat16, device="meta")
        out[variant] = {}
        for lse in (False, True):
            with cc.record_launches() as specs:
                api.attention_forward(q, q, q, "HND", False, None, None, lse, cfg, True, False)
            for spec in specs:
                if spec["name"].startswith("shared_kv"):
                    use = cc._compile_one(dict(spec, name=spec["name"].replace("_lse", "")), target)
                    asm = use.pop("asm")
                    out[variant][spec["name"]] = dict(use, k_cols=spec["constexprs"]["K_COLS"],
                                                      mma=sorted(set(cc.matrix_instructions(asm, "cuda"))))
print(json.dumps(out))
"""
# Spill instructions (local loads + stores) the per-token kernels may have, Triton 3.8 (SASS read): 43-92, nearly
# all once per CTA around the masked last tile and the epilogue; in the key loop 1-4 stores and 3-6 loads of
# loop-invariant scalars per tile, against 520-617 instructions (the per-tile kernels: none, 16 in the split LSE).
KCOLS_SPILLS = 96
KCOLS_SPILL_STORES = 48


@pytest.fixture(scope="module")
def kcols_builds():  # (slow: cross-compiled in a child)
    r = gluon_builds_in_child(_BUILD_SCRIPT, ["fp8", "fp8+residual"])
    return r


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fp8", "fp8+residual"])
def test_per_token_gluon_kernels_build_for_sm90_in_registers(kcols_builds, variant):
    import re

    r = kcols_builds[variant]
    assert set(r) == {"shared_kv_attention_kernel", "shared_kv_split_kernel", "shared_kv_attention_lse_kernel",
                      "shared_kv_split_lse_kernel"}, sorted(r)
    for name, use in r.items():
        assert use["k_cols"] == K_PER_KEY, name
        # INT8 Q·Kᵀ and fp8 P·V on the warpgroup tensor cores, 168 registers (three warpgroups per SM).
        assert any(re.search(r"^wgmma\.mma_async.*\.s8\.s8", i) for i in use["mma"]), (name, use["mma"])
        assert any(re.search(r"^wgmma\.mma_async.*\.e4m3\.e4m3", i) for i in use["mma"]), (name, use["mma"])
        assert 0 < use["registers"] <= 168 and 0 < use["shared"] <= 227 * 1024, (name, use)
        assert use.get("spills", 0) <= KCOLS_SPILLS and use.get("spill_stores", 0) <= KCOLS_SPILL_STORES, (name, use)


def test_a_failing_per_token_build_leaves_the_per_tile_kernel_on(monkeypatch):
    """If this Triton cannot build the per-key variant, per_thread calls take the portable kernel (their plan
    leaves the Gluon kernel out), and per-tile calls keep the Gluon kernel: never one failure turning it off for
    every call."""
    import torch
    from sagetriton.kernels import failures, hopper_gluon, hopper_host, host

    if not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(hopper_gluon, "descriptors", lambda *a: (None, None, None))
    for slot in ("gluon", "gluon_lse", "gluon_kcols"):
        monkeypatch.setattr(failures.memory, slot, None)

    def failing(kernel, grid, args, consts, **kw):
        raise RuntimeError(f"cannot build {kernel.__name__} K_COLS={consts['K_COLS']}")

    monkeypatch.setattr(hopper_host, "_launch", failing)
    t = torch.zeros(1)
    plan = (1, 1, 0, None, None)
    args = (t, t, t, t, t, None, None, None, torch.zeros(1, 1, 8, 8), (1, 1, 8, 8, 8), 8.0, False, plan)
    for lse, kernel in ((None, "shared_kv_attention_kernel"), (torch.zeros(1, 1, 8), "shared_kv_attention_lse_kernel")):
        for layout in (K_PER_KEY, K_PER_GROUP):
            assert hopper_host.run_shared_kv(*args, lse=lse, k_cols=layout) is False
            assert failures.memory.gluon_kcols.endswith(f"cannot build {kernel} K_COLS={layout}")
            assert failures.memory.gluon is None and failures.memory.gluon_lse is None

    # Where the plan is made: per_thread calls no longer choose the Gluon kernel, per_warp calls still do.
    chosen = []
    monkeypatch.setattr(hopper_host, "shared_kv_plan", lambda *a: chosen.append(a) or ("a plan",))
    q = torch.zeros(1, 2, 4608, 128)
    for gran in ("per_thread", "per_warp"):
        cfg = resolve_config(HOPPER, 128, gran, pv_precision="fp8")[0]
        planned = host._plan_call(q, q, q, "HND", False, None, None, False, cfg, None, defer_out=True)
        assert (planned.shared_kv is not None) == (gran == "per_warp"), gran
