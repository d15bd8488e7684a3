"""Hopper's long-sequence kernel with the LSE (``kernels/hopper_lse.py``), checked without a GPU: calls that
ask for the LSE (every ring-attention step) are sent to its LSE twins, which cross-compile for sm90 with
the plain kernels' registers, store the LSE, and leave the plain kernels as they were. The numbers are
bench/gpu_check.py's (``--only lse``) on an H200; the cost against no LSE, bench/bench_dropin.py's."""
import pytest
from compile_child import compile_in_child, gluon_builds_in_child

_SCRIPT = """
import json, re, sys
from sagetriton_import import import_pack
import_pack()
import torch
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels import api, hopper_gluon, tail_split
from sagetriton.kernels.arch import resolve_config
target = cc.parse_target("sm90")
out = {"gluon": hopper_gluon.AVAILABLE}
if hopper_gluon.AVAILABLE:
    for variant in sys.argv[1:]:
        cfg = resolve_config(target.arch_info(), 128, pv_precision=variant)[0]
        n = cfg.shared_kv_min_len
        out[variant] = {"routed": api.uses_long_sequence_kernel(cfg, n, 128, False, False, True)}
        heads = tail_split.heads_with_split_tail(*hopper_gluon.grid(n, n), api.sm_count(torch.device("meta")))
        q = torch.empty((1, heads, n, 128), dtype=torch.bfloat16, device="meta")
        for lse in (False, True):
            with cc.record_launches() as specs:
                api.attention_forward(q, q, q, "HND", False, None, None, lse, cfg, True, False)
            for spec in specs:
                if not spec["name"].startswith("shared_kv"):
                    continue
                use = cc._compile_one(dict(spec, name=spec["name"].replace("_lse", "")), target)
                ptx = "\\n".join(line.split("//")[0] for line in use.pop("asm").splitlines())
                lse_args = [a for a in spec["args"] if isinstance(a, torch.Tensor) and a.dtype == torch.float32
                            and tuple(a.shape) == (1, heads, n)]
                out[variant][spec["name"]] = dict(use, scalar_stores=len(re.findall(r"st\\.global\\.b32", ptx)),
                                                  lse_args=len(lse_args),
                                                  has_qbias=spec["constexprs"].get("HAS_QBIAS"))
print(json.dumps(out))
"""
SPILLS_ADDED = 16  # most spill instructions the LSE adds to a kernel (Triton 3.8: 0 for fp8's whole CTAs,
STORES_ADDED = 8   # 16 / 8 stores in its split last wave, in the epilogue once per CTA)


@pytest.fixture(scope="module")
def lse_builds():  # (slow: cross-compiled in a child)
    r = gluon_builds_in_child(_SCRIPT, ["fp8", "int8"])
    return r


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fp8", "int8"])
def test_lse_calls_take_the_long_sequence_kernels_lse_twins(lse_builds, variant):
    r = lse_builds[variant]
    assert r["routed"], "a return_lse call of Gluon length must take the Gluon kernel"
    assert {k for k in r if k.startswith("shared_kv")} == {
        "shared_kv_attention_kernel", "shared_kv_split_kernel", "shared_kv_attention_lse_kernel",
        "shared_kv_split_lse_kernel"}
    for plain in ("shared_kv_attention_kernel", "shared_kv_split_kernel"):
        twin = r[plain.replace("_kernel", "_lse_kernel")]
        base = r[plain]
        assert twin["lse_args"] == 1 and base["lse_args"] == 0, (plain, twin, base)  # the call's own LSE tensor
        assert twin["has_qbias"] is True  # smooth_k: Q's K-mean bias goes into the LSE, as in the portable kernel
        # Its own stores of the LSE rows, beyond the plain kernel's (the whole one's: 16-byte row stores only).
        assert twin["scalar_stores"] > base["scalar_stores"], (plain, twin, base)
        # 168 registers (three warpgroups per SM); the LSE rows' layout change takes 512 bytes of shared memory.
        assert 0 < twin["registers"] <= 168 and twin["shared"] <= min(base["shared"] + 1024, 227 * 1024), (twin, base)
        assert twin.get("spills", 0) <= base.get("spills", 0) + SPILLS_ADDED, (plain, twin, base)
        assert twin.get("spill_stores", 0) <= base.get("spill_stores", 0) + STORES_ADDED, (plain, twin, base)
    assert r["shared_kv_attention_kernel"]["scalar_stores"] == 0


def test_a_failing_lse_twin_leaves_the_plain_kernel_on(monkeypatch):
    """If this Triton cannot build the LSE twins, calls asking for the LSE take the portable kernel, and the
    others keep the long-sequence kernel (never one failure turning it off for every call)."""
    import torch
    from sagetriton.kernels import failures, hopper_gluon, hopper_host

    if not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(hopper_gluon, "descriptors", lambda *a: (None, None, None))
    monkeypatch.setattr(failures.memory, "gluon", None)
    monkeypatch.setattr(failures.memory, "gluon_lse", None)

    def failing(kernel, *a, **kw):
        raise RuntimeError(f"cannot build {kernel.__name__}")

    monkeypatch.setattr(hopper_host, "_launch", failing)
    t = torch.zeros(1)
    plan = (1, 1, 0, None, None)
    args = (t, t, t, t, t, None, None, None, torch.zeros(1, 1, 8, 8), (1, 1, 8, 8, 8), 8.0, False, plan)
    assert hopper_host.run_shared_kv(*args, lse=torch.zeros(1, 1, 8)) is False
    assert failures.memory.gluon_lse.endswith("cannot build shared_kv_attention_lse_kernel")
    assert failures.memory.gluon is None
    assert hopper_host.run_shared_kv(*args) is False  # the plain kernel failing is what turns it off
    assert failures.memory.gluon.endswith("cannot build shared_kv_attention_kernel")



_Q_BIAS_SCRIPT = """
import json, re
from sagetriton_import import import_pack
import_pack()
import torch, triton
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels import api, replay, rotation
from sagetriton.kernels.arch import default_config
target = cc.parse_target("sm90")
cfg = default_config(target.arch_info(), 128)
out = {}
for lse in (False, True):
    replay.clear()
    q = torch.empty((1, 24, 8192, 128), dtype=torch.bfloat16, device="meta")  # 8 tiles per program on 132 SMs
    with cc.record_launches() as specs:
        api.attention_forward(q, q, q, "HND", False, None, None, lse, cfg, True, False)
    spec = next(s for s in specs if s["name"] == "quantize_int8_kernel")  # Q's launch comes first
    options = dict(spec["options"], maxnreg=rotation.TILED_MAXNREG)  # as host_quant launches it on a GPU
    compiled = triton.compile(cc.launch_source(spec, target), target=target.gpu_target(), options=options)
    ptx = compiled.asm["ptx"]
    out[str(lse)] = dict(cc._resources(compiled, target), mean_mode=spec["constexprs"]["MEAN_MODE"],
                         tiles=spec["constexprs"]["ROTATE_TILES"],
                         mma=sorted(set(re.findall(r"wgmma\\.mma_async\\.sync\\.aligned\\.(m64n\\d+k16)", ptx))),
                         shuffles=len(re.findall(r"shfl\\.sync", ptx)))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_tiled_q_launch_takes_the_lse_bias_from_a_tensor_core_product():
    """Asking for the LSE adds q·mean(K) to Hopper's tiled Q launch (``quant._bias_mean_operand``): one small
    MMA of the rows it already multiplies, in registers (no spill under its 128-register cap), and no second
    pass over the 16-bit rows, whose row sums across a layout change cost +25 % of the launch on the H200
    (87 shuffles a tile against 7, bench/NOTES.md)."""
    r = compile_in_child(_Q_BIAS_SCRIPT)
    plain, lse = r["False"], r["True"]
    assert (plain["mean_mode"], lse["mean_mode"]) == (0, 2) and lse["tiles"] == plain["tiles"] == 8, r
    assert plain["mma"] == ["m64n128k16"] and lse["mma"] == ["m64n128k16", "m64n16k16"], r
    assert lse.get("spills", 0) == 0 and 0 < lse["registers"] <= 128, r
    assert lse["shuffles"] <= plain["shuffles"] + 16, r  # the bias's row sums (SASS, before: 143 against 55)
