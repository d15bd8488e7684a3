"""`install.py --check-targets --json` on a CPU-only machine: the real kernels cross-compiled with
Triton's NVIDIA and AMD back-ends, and the matrix instructions each GPU family must use."""
import json
import os
import subprocess
import sys
import time

import pytest
from compile_child import compile_in_child, gluon_builds_in_child

from sagetriton_import import PACK_DIR

TARGETS = ("sm80", "sm86", "sm89", "sm90", "sm120", "gfx1100", "gfx1201", "gfx942")

# target -> (int8 Q·Kᵀ instruction, P·V instruction) the default config must produce.
EXPECTED = {
    "sm80": (r"^mma\.sync.*\.s8\.s8", r"^mma\.sync.*\.s8\.s8"),  # INT8 P·V where it outruns FP16/FP8
    "sm86": (r"^mma\.sync.*\.s8\.s8", r"^mma\.sync.*\.s8\.s8"),
    "sm89": (r"^mma\.sync.*\.s8\.s8", r"^mma\.sync.*\.s8\.s8"),
    "sm90": (r"^wgmma\.mma_async.*\.s8\.s8", r"^wgmma\.mma_async.*\.e4m3\.e4m3"),
    "sm120": (r"^mma\.sync.*\.s8\.s8", r"^mma\.sync.*\.s8\.s8"),
    "gfx1100": (r"^v_wmma_i32_16x16x16_iu8$", r"^v_wmma_f32_16x16x16_(bf16|f16)$"),  # RDNA3: no fp8 MMA
    "gfx1201": (r"^v_wmma_i32_16x16x16_iu8$", r"^v_wmma_f32_16x16x16_fp8_fp8$"),
    "gfx942": (r"^v_mfma_i32_\d+x\d+x\d+_i8$", r"^v_mfma_f32_\d+x\d+x\d+_fp8_fp8$"),  # e4m3fnuz
}


@pytest.fixture(scope="module")
def check_targets_json():
    """One run for the module (cold: about a minute on 2 cores; Triton's cache makes later runs fast)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(PACK_DIR / "install.py"), "--check-targets", ",".join(TARGETS),
                           "--json"], capture_output=True, text=True, cwd=str(PACK_DIR), timeout=900,
                          env=dict(os.environ))  # TRITON_INTERPRET=1 here: install.py must step around it
    print(f"--check-targets took {time.perf_counter() - t0:.1f} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)  # stdout is exactly one JSON object (progress goes to stderr)


@pytest.mark.parametrize("target", TARGETS)
def test_target_compiles_with_the_intended_matrix_instructions(check_targets_json, target):
    import re

    r = check_targets_json[target]
    assert r["ok"] is True, r.get("error")
    assert "error" not in r
    qk, pv = EXPECTED[target]
    assert any(re.search(qk, i) for i in r["instructions"]), (target, r["instructions"])
    assert any(re.search(pv, i) for i in r["instructions"]), (target, r["instructions"])
    if qk == pv:  # INT8 P·V: both products of the attention kernel are INT8 matrix instructions
        attention = r["kernels"]["attention_kernel"]
        assert attention and all(re.search(qk, i) for i in attention), (target, attention)
    # Instructions of the wrong vendor or family never show up.
    wrong = "v_" if target.startswith("sm") else "mma."
    assert not any(i.startswith(wrong) for i in r["instructions"])


def test_json_is_keyed_by_requested_targets(check_targets_json):
    assert set(check_targets_json) == set(TARGETS)
    assert check_targets_json["gfx942"]["config"]["fp8_format"] == "e4m3fnuz"
    assert check_targets_json["gfx1100"]["config"]["pv_precision"] == "fp16"
    assert check_targets_json["gfx1201"]["config"]["num_stages"] == 1
    for target, r in check_targets_json.items():  # the RoPE kernel is built for every target too
        assert {"rope_kernel", "rope_kernel_fma"} <= set(r["kernels"]), (target, sorted(r["kernels"]))


def triton_of(version: str) -> tuple:
    return tuple(int(x) for x in version.split(".")[:2])


# Spills a Triton's compiler leaves where no config choice avoids them without costing the kernel its
# occupancy or its Gluon path: (target, kernel, P·V variant) -> [(from Triton, most local loads+stores,
# most of them stores (values spilled) or None)]; the last row whose Triton is not newer than the
# installed one applies, none: no spill allowed. docs/COMPATIBILITY.md has the table, bench/NOTES.md
# ("Triton 3.9") the measurements.
SPILLS_ALLOWED = {
    # The Gluon kernels, fp8 (the default) and fp8+residual. Triton 3.6: the whole kernel 4 (2 values
    # stored), the build measured on the H200 (855-980 TOPS at 8K-32K, docs/RESULTS.md); 3.8: none.
    # Triton 3.9, assembled by the CUDA 12 ptxas as on 3.6-3.8 (triton_compat.sm90_ptxas_scope): fp8's
    # whole kernel two 4-byte values stored at kernel entry and reloaded outside the main loops (SASS read;
    # 11 and 15 with 3.9's own CUDA 13 ptxas), fp8+residual none.
    ("sm90", "shared_kv_attention_kernel", "fp8"): [((3, 6), 4, 2), ((3, 7), 0, 0), ((3, 9), 4, 2)],
    ("sm90", "shared_kv_attention_kernel", "fp8+residual"): [((3, 6), 4, 2), ((3, 7), 0, 0)],
    # INT8 P·V (selectable): the Gluon kernels' extra per-row state and V's tile column sums, outside
    # their loops (Triton 3.8, SASS read; the H200's speed is in bench/NOTES.md): the split kernel's
    # share merge 35, the whole kernel 18. Triton 3.9: 33 / 64 with the wait before the row-sum MMA
    # (hopper_gluon.WAIT_PV_MMA; 228 / 243 without), and the portable kernel 17 (64-key tiles spill
    # none but turn the Gluon kernel off; a 176-register cap costs a CTA per SM); 3.6: the portable 2.
    ("sm90", "shared_kv_attention_kernel", "int8"): [((0, 0), 24, None), ((3, 9), 64, None)],
    ("sm90", "shared_kv_split_kernel", "int8"): [((0, 0), 48, None), ((3, 9), 36, None)],
    ("sm90", "attention_kernel", "int8"): [((3, 6), 2, 1), ((3, 7), 0, 0), ((3, 9), 17, None)],
    # RDNA's portable kernel at head_dim 128 since V's tile column sums joined the tile (gfx1100 29,
    # gfx1201 36, at the least-spilling tiles): INT8 is not the default there (fp16 on RDNA3, fp8 on
    # RDNA4), docs/AMD.md says so, and nothing is run on AMD hardware here.
    ("gfx1100", "attention_kernel", "int8"): [((0, 0), 40, None)],
    ("gfx1201", "attention_kernel", "int8"): [((0, 0), 40, None)],
}


def assert_spills_allowed(use: dict, target: str, kernel: str, variant: str, triton: str) -> None:
    most, stores = 0, 0
    for since, n, s in SPILLS_ALLOWED.get((target, kernel, variant), []):
        if triton_of(triton) >= since:
            most, stores = n, s
    spills = use.get("spills") or 0
    assert spills <= most, (target, kernel, variant, triton, use, most)
    assert stores is None or (use.get("spill_stores") or 0) <= stores, (target, kernel, variant, triton, use)


def test_spill_allowances_follow_the_triton_version():
    assert_spills_allowed({"spills": 4, "spill_stores": 2}, "sm90", "shared_kv_attention_kernel", "fp8", "3.9.0")
    assert_spills_allowed({"spills": 0}, "sm90", "shared_kv_attention_kernel", "fp8", "3.8.0")
    for use, triton in (({"spills": 4, "spill_stores": 1}, "3.8.0"), ({"spills": 5, "spill_stores": 1}, "3.9.0"),
                        ({"spills": 4, "spill_stores": 3}, "3.9.1")):
        with pytest.raises(AssertionError):
            assert_spills_allowed(use, "sm90", "shared_kv_attention_kernel", "fp8", triton)
    with pytest.raises(AssertionError):
        assert_spills_allowed({"spills": 1}, "sm120", "attention_kernel", "int8", "3.9.0")


# Shared memory one block may use (bytes): per SM on NVIDIA, LDS per workgroup on AMD.
SHARED_LIMIT = {"sm80": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024,
                "sm120": 99 * 1024, "gfx1100": 64 * 1024, "gfx1201": 64 * 1024, "gfx942": 64 * 1024}


@pytest.mark.parametrize("target", TARGETS)
def test_default_attention_kernel_fits_without_spills(check_targets_json, target):
    """The default tiles keep the attention kernel in registers on every family, built as a real
    launch specializes it (aligned pointers, unit strides): spilling is a silent 2x slowdown on a
    GPU we cannot time here (docs/AMD.md has the table the tiles were chosen from)."""
    r = check_targets_json[target]
    variant = r["config"]["pv_precision"]
    assert_spills_allowed(r, target, "attention_kernel", variant, r["triton"])
    assert 0 < r["registers"] <= (512 if target == "gfx942" else 256), (target, r)
    assert 0 < r["shared"] <= SHARED_LIMIT[target], (target, r)
    if target == "sm90":
        assert r["registers"] <= 168  # 3 CTAs of 4 warps per SM, the measured-fastest occupancy
        # Hopper's Gluon kernel for long sequences: three warpgroups of 168 registers in one CTA,
        # sharing a ring of K/V tiles that must fit beside their Q tiles.
        # Its split twin runs the last wave's CTAs in key shares (kernels/tail_split.py).
        for key, kernel in (("shared_kv_kernel", "shared_kv_attention_kernel"),
                            ("shared_kv_split_kernel", "shared_kv_split_kernel")):
            g = r[key]
            assert_spills_allowed(g, target, kernel, variant, r["triton"])
            assert 0 < g["registers"] <= 168 and 0 < g["shared"] <= SHARED_LIMIT[target], g
    else:
        assert "shared_kv_kernel" not in r  # Gluon's Hopper kernel is built for sm90 only


@pytest.mark.parametrize("target", TARGETS)
def test_sparse_kernels_compile_with_the_dense_matrix_instructions(check_targets_json, target):
    """``sparse_attn``'s kernels (installer.crosscompile.sparse_specs) build for every target with the default
    config's matrix instructions: INT8 Q·Kᵀ and the family's P·V in the sparse attention kernel, the router's
    tile sizes within the shared memory one block may use."""
    import re

    r = check_targets_json[target]
    kernels = r["kernels"]
    assert {"route_kernel", "route_kernel_topk", "sparse_attention_kernel", "sparse_attention_kernel_nolse",
            "extra_tail_kernel", "extra_merge_kernel", "pool_finish_kernel", "centre_means_kernel",
            "sparse_quantize_int8_kernel_k",
            "sparse_quantize_int8_kernel_q1", "sparse_quantize_int8_kernel_q2"} <= set(kernels), sorted(kernels)
    assert {"pool_kernel", "pool_kernel_absmax"} & set(kernels), sorted(kernels)
    qk, pv = EXPECTED[target]
    for name in ("sparse_attention_kernel", "sparse_attention_kernel_nolse"):
        assert any(re.search(qk, i) for i in kernels[name]), (target, name, kernels[name])
        assert any(re.search(pv, i) for i in kernels[name]), (target, name, kernels[name])
    for key in ("sparse_kernel", "route_kernel"):
        assert 0 < r[key]["shared"] <= SHARED_LIMIT[target], (target, key, r[key])


def _compile_in_child(script: str, targets) -> dict:
    return compile_in_child(script, targets)


RESIDUAL_TARGETS = ("sm89", "sm90", "sm120", "gfx1201", "gfx942")
_RESIDUAL_SCRIPT = """
import json, sys
from sagetriton_import import import_pack
import_pack()
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels.arch import resolve_config
out = {}
for name in sys.argv[1:]:
    arch = cc.parse_target(name).arch_info()  # the config Sage Settings' "fp8+residual" resolves to there
    specs = lambda cfg, d: cc.compile_specs(resolve_config(arch, d, pv_precision="fp8+residual")[0], d)
    out[name] = cc.compile_target(cc.parse_target(name), 128, specs)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_fp8_residual_variant_fits_without_spills():
    """fp8+residual adds a second P·V MMA and a second V tile per step (shared memory, TMA ring):
    it must still build with fp8 matrix instructions, in registers, on the fp8 families."""
    results = _compile_in_child(_RESIDUAL_SCRIPT, RESIDUAL_TARGETS)
    for target, r in results.items():
        assert r["ok"] is True, (target, r.get("error"))
        assert_spills_allowed(r, target, "attention_kernel", "fp8+residual", r["triton"])
        assert 0 < r["shared"] <= SHARED_LIMIT[target], (target, r)
        if target == "sm90":
            assert r["registers"] <= 168
            for key, kernel in (("shared_kv_kernel", "shared_kv_attention_kernel"),
                                ("shared_kv_split_kernel", "shared_kv_split_kernel")):
                g = r[key]
                assert_spills_allowed(g, target, kernel, "fp8+residual", r["triton"])
                assert 0 < g["registers"] <= 168 and 0 < g["shared"] <= SHARED_LIMIT[target], g


_GLUON_PTX_SCRIPT = """
import json, re
from sagetriton_import import import_pack
import_pack()
import triton
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels import api, hopper_gluon
from sagetriton.kernels.arch import default_config
target = cc.parse_target("sm90")
stores, events, handover, row_loads, pdl = {}, [], {}, {}, {}
# The split kernel's hand-over between key shares, in program order (kernels/tail_split.py).
HANDOVER = [("acquire", r"ld\\.global\\.gpu\\.acquire"), ("load_l2", r"ld\\.global\\.cg"),
            ("store", r"st\\.global"), ("fence", r"fence\\.acq_rel\\.gpu"), ("barrier", r"bar\\.sync"),
            ("release", r"atom\\.global\\.gpu\\.release"), ("ticket", r"atom\\.global\\.gpu\\.relaxed\\.add"),
            ("atomic", r"\\batom\\.|\\bred\\.")]
if hopper_gluon.AVAILABLE:
    for spec in cc.compile_specs(default_config(target.arch_info(), 128), 128):
        ptx = triton.compile(cc.launch_source(spec, target), target=target.gpu_target(),
                             options=dict(spec.get("options") or {})).asm["ptx"]
        ptx = "\\n".join(line.split("//")[0] for line in ptx.splitlines())
        # Programmatic dependent launch: the launch option, and which memory operations come
        # before the kernel's wait for the launch before it.
        wait = ptx.find("griddepcontrol.wait")
        head = ptx[:wait] if wait >= 0 else ""
        mem = r"\\b(ld\\.global|st\\.global|atom|red|cp\\.async)"
        pdl[spec["name"]] = {"launch_pdl": bool((spec.get("options") or {}).get("launch_pdl")), "waits": wait >= 0,
                             "triggers": "griddepcontrol.launch_dependents" in ptx,
                             "before_wait": sorted(set(re.findall(mem, head)))}
        if spec["name"] not in ("shared_kv_attention_kernel", "shared_kv_split_kernel"):
            continue
        seq = []
        for line in ptx.splitlines():
            for name, pattern in HANDOVER:
                if re.search(pattern, line):
                    seq.append(name)
                    break
        handover[spec["name"]] = seq
        if spec["name"] == "shared_kv_split_kernel":
            for op in re.findall(r"ld\\.global[.\\w]*v4[.\\w]*", ptx):
                row_loads[op] = row_loads.get(op, 0) + 1
        if spec["name"] == "shared_kv_attention_kernel":
            for op in re.findall(r"st\\.global[.\\w]*", ptx):
                stores[op] = stores.get(op, 0) + 1
            # In program order: P·V (fp8 MMA), Q·Kᵀ (int8 MMA), TMA copies, MMA waits.
            for m in re.finditer(r"wgmma\\.mma_async[.\\w]*|cp\\.async\\.bulk\\.tensor|wgmma\\.wait_group", ptx):
                op = m.group(0)
                events.append("pv" if "e4m3" in op else "qk" if ".s8" in op else "tma" if "bulk" in op else "wait")
print(json.dumps({"gluon": hopper_gluon.AVAILABLE, "stores": stores, "events": events, "handover": handover,
                  "row_loads": row_loads, "pdl": pdl}))
"""


@pytest.fixture(scope="module")
def gluon_ptx():
    """Facts of the sm90 PTX of a Hopper call's launches (the Gluon kernel's above all), compiled once in
    a clean child (no interpreter)."""
    r = gluon_builds_in_child(_GLUON_PTX_SCRIPT)
    return r


def test_hopper_launches_chain_and_wait_before_reading_what_the_one_before_wrote(gluon_ptx):
    """With programmatic dependent launch each launch of a call after the first may start while the
    one before it ends (bench/NOTES.md attempt 49). So it must wait (griddepcontrol.wait) before it
    stores anything or reads an earlier launch's output: only the quantization kernels' loads of the
    user's tensors (or, in the tiled rotation's, of the host's constant signs) come first. The first
    launch waits for nothing of ours and is an ordinary launch; the split last wave reads nothing the
    whole CTAs write and starts when they have all got past their wait."""
    facts = gluon_ptx["pdl"]
    assert set(facts) >= {"kv_stats_kernel", "quantize_int8_kernel", "convert_v_kernel", "attention_kernel",
                          "shared_kv_attention_kernel", "shared_kv_split_kernel"}, facts
    first = facts.pop("kv_stats_kernel")
    assert first == {"launch_pdl": False, "waits": False, "triggers": True, "before_wait": []}, first
    split = facts.pop("shared_kv_split_kernel")
    assert split["launch_pdl"] and not split["waits"], split
    for name, f in facts.items():
        assert f["launch_pdl"] and f["waits"], (name, f)
        # Loads of Q, K or V overlap the launch before; no store, atomic or TMA copy may.
        assert f["before_wait"] == (["ld.global"] if name in ("quantize_int8_kernel", "convert_v_kernel") else []), \
            (name, f)


def test_hopper_kernel_writes_its_output_in_16_byte_stores(gluon_ptx):
    """The Gluon kernel's output leaves in 16-byte stores of whole rows (8 channels per thread),
    not from the MMA accumulator layout, whose 4-byte stores scattered over 8 rows per instruction
    took ~5 µs of every CTA's epilogue on an H200 (bench/NOTES.md, attempt 39): 8 per warpgroup."""
    assert gluon_ptx["stores"] == {"st.global.v4.b32": 24}, gluon_ptx["stores"]


def test_hopper_kernel_refills_the_ring_while_p_v_runs(gluon_ptx):
    """Warpgroup 0 starts its TMA refill of the K/V ring between issuing a tile's P·V and waiting
    for it, so the refill's barrier waits cost it nothing; before the tile they made it the last
    warpgroup of every CTA to finish (bench/NOTES.md, attempt 44: +3-6 % from 8K tokens)."""
    ev = gluon_ptx["events"]
    shadowed = [i for i, e in enumerate(ev) if e == "tma" and _after_pv_before_its_wait(ev, i)]
    assert shadowed, ev


def _after_pv_before_its_wait(events: list, i: int) -> bool:
    """Event ``i`` comes after a P·V MMA with no MMA wait between the two (the MMA still running)."""
    for e in reversed(events[:i]):
        if e == "wait":
            return False
        if e == "pv":
            return True
    return False


def test_hopper_split_shares_hand_over_through_release_and_acquire(gluon_ptx):
    """Each warpgroup of a key share waits for its predecessor's flag with an acquire load, reads the
    rows it left from L2 (``.cg``, never a stale L1 line), and hands on only after its own stores are
    fenced at GPU scope and every thread of the warpgroup has passed a barrier, with a releasing
    atomic (kernels/tail_split.py). The whole kernel has none of it."""
    whole = set(gluon_ptx["handover"]["shared_kv_attention_kernel"])
    assert not {"acquire", "release", "ticket", "atomic", "fence", "load_l2"} & whole, whole
    seq = gluon_ptx["handover"]["shared_kv_split_kernel"]
    releases = [i for i, e in enumerate(seq) if e == "release"]
    assert releases and "acquire" in seq and "atomic" not in seq, seq
    # One ticket per CTA, taken before anything waits: which share a CTA is (kernels/hopper_gluon.py).
    assert seq.count("ticket") == 1 and seq.index("ticket") < seq.index("acquire"), seq
    for i in releases:  # (ptxas may share one epilogue between two warpgroups' partitions)
        fence = max(j for j in range(i) if seq[j] == "fence")
        assert "barrier" in seq[fence:i], seq[:i + 1]
        assert "store" in seq[:fence] and "release" not in seq[fence:i], seq[:i + 1]
    for i in (i for i, e in enumerate(seq) if e == "load_l2"):
        assert "acquire" in seq[:i], seq[:i + 1]
    # Its only 16-byte global loads are the rows a predecessor left: all from L2.
    assert gluon_ptx["row_loads"].get("ld.global.cg.v4.b32") and not gluon_ptx["row_loads"].get("ld.global.v4.b32")


# ---- the scanning and target parsing, without compiling


@pytest.fixture
def cc(pack):
    from sagetriton.installer import crosscompile

    return crosscompile


def test_parse_target(cc):
    assert cc.parse_target("sm90") == cc.Target("sm90", "cuda", 90, 32)
    assert cc.parse_target("sm_120") == cc.Target("sm120", "cuda", 120, 32)
    assert cc.parse_target("gfx942").warp_size == 64  # CDNA: wave64
    assert cc.parse_target("GFX1201") == cc.Target("gfx1201", "hip", "gfx1201", 32)  # RDNA: wave32
    assert cc.parse_target("gfx90a").warp_size == 64
    with pytest.raises(ValueError):
        cc.parse_target("rtx4090")
    assert cc.parse_target("gfx1201").arch_info().family == "rdna4"
    assert cc.parse_target("sm89").arch_info().fp8 == "e4m3fn"


def test_missing_instruction_fails_the_target(cc):
    t = cc.parse_target("gfx1201")
    asm = "v_wmma_i32_16x16x16_iu8 v[0:7], v[8:9], v[10:11], v[0:7]\n v_wmma_f32_16x16x16_f16 v[0:7]"

    def fake_specs(cfg, head_dim):
        return [{"name": "fake", "fn": None, "signature": {}}]

    cc_compile = cc._compile_one
    try:
        cc._compile_one = lambda spec, target: {"asm": asm}  # compiled, but fp16 P·V where fp8 is the default
        r = cc.compile_target(t, 128, fake_specs)
    finally:
        cc._compile_one = cc_compile
    assert r["ok"] is False and r["missing"] == ["fp8 P·V"] and "no fp8 P·V" in r["error"]
    assert r["instructions"] == ["v_wmma_f32_16x16x16_f16", "v_wmma_i32_16x16x16_iu8"]


def test_compile_error_is_reported_per_target(cc):
    def broken_specs(cfg, head_dim):
        raise RuntimeError("PassManager::run failed")

    r = cc.compile_target(cc.parse_target("sm89"), 128, broken_specs)
    assert r["ok"] is False and "PassManager::run failed" in r["error"]


def test_refuses_to_run_under_the_interpreter(cc, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="clean process"):
        cc.check_targets(["sm90"])


INT8_TARGETS = ("sm86", "sm90", "gfx1100", "gfx1201", "gfx942")
_INT8_SCRIPT = """
import json, sys
import triton
from sagetriton_import import import_pack
import_pack()
from sagetriton.installer import crosscompile as cc
from sagetriton.kernels.arch import resolve_config
out = {}
for name in sys.argv[1:]:
    target = cc.parse_target(name)
    cfg = resolve_config(target.arch_info(), 128, pv_precision="int8")[0]  # what Sage Settings' "int8" runs
    out[name] = {}
    for spec in cc.compile_specs(cfg, 128):
        if spec["name"] in ("attention_kernel", "shared_kv_attention_kernel", "shared_kv_split_kernel"):
            r = cc._compile_one(spec, target)
            out[name][spec["name"]] = {"instructions": cc.matrix_instructions(r["asm"], target.backend),
                                       "spills": r.get("spills"), "spill_stores": r.get("spill_stores")}
print(json.dumps({"triton": triton.__version__, "targets": out}))
"""
INT8_MMA = {"sm": r"^(wgmma\.mma_async|mma\.sync).*\.s8\.s8", "gfx9": r"^v_mfma_i32_\w+_i8$",
            "gfx1": r"^v_wmma_i32_16x16x16_iu8$"}


@pytest.mark.slow
def test_int8_pv_variant_uses_int8_matrix_instructions_for_both_products():
    """pv_precision="int8" on every family, the Hopper Gluon kernels included: both products of every
    attention kernel are INT8 matrix instructions (no 16-bit or fp8 one), built without spills."""
    results = _compile_in_child(_INT8_SCRIPT, INT8_TARGETS)
    import re

    for target, kernels in results["targets"].items():
        rx = next(v for k, v in INT8_MMA.items() if target.startswith(k))
        assert "attention_kernel" in kernels and (target != "sm90" or len(kernels) == 3), (target, kernels)
        for name, r in kernels.items():
            assert r["instructions"] and all(re.search(rx, i) for i in r["instructions"]), (target, name, r)
            if r["spills"] is not None:  # AMD's portable kernels report VGPRs spilled, NVIDIA's local loads/stores
                assert_spills_allowed(r, target, name, "int8", results["triton"])


# ---- why a kernel did not build, in one line (a real compile failure, cross-compiled for sm90)

_BROKEN_KERNEL = '''
import json
import sys

import triton
import triton.language as tl
from sagetriton_import import import_pack

import_pack()
from sagetriton.installer import crosscompile as cc, selftest
from sagetriton.kernels.build_errors import root_cause


@triton.jit
def _load_tile(X):
    # What a Triton that dropped a name looks like to a kernel (3.9's async_copy_global_to_shared).
    return tl.async_copy_global_to_shared(X)


@triton.jit
def broken_kernel(X):
    tl.store(X, _load_tile(X))


target = cc.parse_target("sm90")
spec = {"name": "broken_kernel", "fn": broken_kernel, "signature": {"X": "*fp32"}, "constexprs": {}}
try:
    triton.compile(cc.launch_source(spec, target), target=target.gpu_target())
    raised = None
except Exception as e:
    raised = {"text": str(e), "root_cause": root_cause(e), "selftest": selftest._short_error(e)}
result = cc.compile_target(target, 128, lambda cfg, d: [spec])
print(json.dumps({"raised": raised, "target": result, "table": cc.format_table({"sm90": result})}))
'''


def test_a_kernel_that_does_not_build_reports_its_root_cause_in_one_line(tmp_path):
    """A Triton CompilationError prints the kernel's source, a caret line and, on the innermost error of a
    chain of nested calls only, the reason: its first line and last line both hide the reason (issue 38:
    "CompilationError: at 10:4: def shared_kv_attention_kernel(...", "CompilationError:     ^"). The
    self-test, the runtime's fallback log and --check-targets report the innermost message instead."""
    script = tmp_path / "broken.py"  # a file: Triton reads a kernel's source through inspect
    script.write_text(_BROKEN_KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(PACK_DIR), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=str(PACK_DIR),
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["raised"] and "^" in r["raised"]["text"]  # the real error: source excerpt and caret
    target = r["target"]
    assert target["ok"] is False
    for line in (r["raised"]["root_cause"], r["raised"]["selftest"], target["error"]):
        assert "async_copy_global_to_shared" in line and "has no attribute" in line, line
        assert "\n" not in line and "^" not in line and "def broken_kernel" not in line, line
        assert len(line) <= 300 + len("broken_kernel: ")
    assert "(in _load_tile, line" in r["raised"]["root_cause"]
    assert target["error"].startswith("broken_kernel: ")
    table_error = r["table"].splitlines()[1].strip()
    assert table_error == target["error"], r["table"]


def test_a_triton_without_ptxas_blackwell_builds_sm90_with_its_ptxas(pack, monkeypatch, tmp_path):
    """Triton 3.9 looks for ``ptxas-blackwell`` even for sm90; where a build lacks it, the pack points
    Triton's knob at the ``ptxas`` it has, so users set nothing. Where the tool exists or the user set
    the knob, nothing changes."""
    from sagetriton.kernels import triton_compat
    from triton import knobs

    tools = type(knobs.nvidia).__dict__
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH", raising=False)
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    triton_compat.ensure_ptxas()  # the installed Triton ships both tools
    assert "TRITON_PTXAS_BLACKWELL_PATH" not in os.environ
    monkeypatch.setattr(tools["ptxas_blackwell"], "default_path", str(tmp_path / "ptxas-blackwell"))  # absent
    triton_compat.ensure_ptxas()
    assert os.environ["TRITON_PTXAS_BLACKWELL_PATH"] == tools["ptxas"].default_path
    assert knobs.nvidia.ptxas_blackwell.path == tools["ptxas"].default_path  # what Triton then runs
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", "/opt/cuda/bin/ptxas")  # the user's choice stays
    triton_compat.ensure_ptxas()
    assert os.environ["TRITON_PTXAS_BLACKWELL_PATH"] == "/opt/cuda/bin/ptxas"


def test_a_tool_quoted_in_the_error_gives_the_reason(pack):
    """ptxas's own diagnostic, not the wrapper's first line; a plain multi-line error keeps its first line."""
    from sagetriton.kernels.build_errors import root_cause
    from triton.runtime.errors import PTXASError

    ptxas = PTXASError("PTXAS error: Internal Triton PTX codegen error\n`ptxas` stderr:\n"
                       "ptxas fatal   : Unresolved extern function 'tanhf'\n")
    assert root_cause(ptxas) == "PTXASError: ptxas fatal : Unresolved extern function 'tanhf'"
    try:
        try:
            raise ptxas
        except PTXASError as e:
            raise RuntimeError("attention_kernel did not build\nsee above") from e
    except RuntimeError as outer:
        assert root_cause(outer) == "PTXASError: ptxas fatal : Unresolved extern function 'tanhf'"
    assert root_cause(ValueError("bad head_dim\n(details)")) == "ValueError: bad head_dim"


_FP32_EXTRA_SCRIPT = """
import json, sys, torch
from sagetriton_import import import_pack
import_pack()
from sagetriton.installer import crosscompile as cc
out = {}
for name in sys.argv[1:]:
    extra = lambda cfg, d, dtype: [s for s in cc.sparse_specs(cfg, d, "cuda", dtype=dtype)
                                   if s["name"] == "extra_tail_kernel"]
    precs = {str(t): [s["constexprs"]["SCORE_PREC"] for s in extra(None, 128, t)]
             for t in (torch.float32, torch.bfloat16)}
    r = cc.compile_target(cc.parse_target(name), 128, lambda cfg, d: extra(cfg, d, torch.float32))
    out[name] = dict(precs=precs, built=sorted(r.get("kernels", {})))
print(json.dumps(out))
"""


def test_the_extra_router_scores_fp32_k_with_three_tf32_products_on_nvidia():
    """fp32 K's centroid scores weigh the extra router's per-token tail: one TF32 product could put them thousands of
    log2 units off at huge logits, so NVIDIA builds take ``tf32x3`` there (16-bit K: exact parts, TF32 unused)."""
    results = _compile_in_child(_FP32_EXTRA_SCRIPT, ("sm80", "sm90"))
    for target, r in results.items():
        assert r["precs"] == {"torch.float32": ["tf32x3"], "torch.bfloat16": ["tf32"]}, (target, r)
        assert r["built"] == ["extra_tail_kernel"], (target, r)
