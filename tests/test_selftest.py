"""The self-test pieces on CPU (Triton interpreter): variant lists, accuracy verdicts, speed table."""
import pytest
import torch


@pytest.fixture
def st(pack):
    from sagetriton.installer import selftest

    return selftest


def test_variants_follow_what_the_gpu_can_run(st):
    from sagetriton.kernels.arch import ArchInfo

    rdna3 = ArchInfo("amd", "gfx1100", "rdna3", "RX 7900 XTX", 32, None)
    rdna4 = ArchInfo("amd", "gfx1201", "rdna4", "RX 9070 XT", 32, "e4m3fn")
    v4 = st.variants_for(rdna4)  # 3 granularities x ((fp16, fp8, fp8+residual) x 3 accumulators + int8)
    assert len(v4) == 30 and {v["pv_precision"] for v in v4} == {"fp16", "fp8", "fp8+residual", "int8"}
    assert {v["pv_accum_dtype"] for v in v4 if v["pv_precision"] == "int8"} == {"fp32"}
    v3 = st.variants_for(rdna3)
    assert len(v3) == 12 and {v["pv_precision"] for v in v3} == {"fp16", "int8"}  # gfx11: no fp8 matrix units
    assert st.default_variant(rdna4)["pv_precision"] == "fp8"
    assert st.name_of(st.default_variant(rdna3)) == "per_warp/fp16/fp32"


def test_accuracy_passes_the_real_kernel_and_catches_a_broken_one(st, monkeypatch):
    v = {"qk_quant_gran": "per_warp", "pv_precision": "fp8", "pv_accum_dtype": "fp32"}
    cpu = torch.device("cpu")
    good = st.accuracy(v, st.CPU_ACCURACY_SHAPES, cpu, torch.float16)
    assert good["ok"] and good["cosine"] > 0.999 and good["rel_l1"] < 0.06, good

    # A miscompiled kernel (here: keys in the wrong order) must fail the self-test.
    real = st._sageattn()
    monkeypatch.setattr(st, "_sageattn", lambda: lambda q, k, v, **kw: real(q, k.flip(2), v, **kw))
    bad = st.accuracy(v, st.CPU_ACCURACY_SHAPES, cpu, torch.float16)
    assert not bad["ok"] and "inaccurate" in bad["error"]
    monkeypatch.setattr(st, "_sageattn", lambda: lambda q, k, v, **kw: torch.full_like(q, float("nan")))
    assert not st.accuracy(v, st.CPU_ACCURACY_SHAPES, cpu, torch.float16)["ok"]

    def raises():
        raise RuntimeError("triton.compiler.errors.CompilationError: at 12:4")

    monkeypatch.setattr(st, "_sageattn", raises)
    b = st.build_variant(v, 64, cpu, torch.float16, tokens=32)
    assert not b["ok"] and "CompilationError" in b["error"] and "oom" not in b


def test_speed_table_and_crossover_on_cpu(st):
    from sagetriton.kernels.arch import CPU_ARCH

    r = st.measure_crossovers(CPU_ARCH, torch.device("cpu"), torch.float16, head_dims=(32, 16), lengths=(32, 64),
                              heads=1, batch=2)
    assert [t["seq_len"] for t in r["timings"]] == [32, 64] and r["sdpa"] == "default"
    assert all(t["kernel_ms"] > 0 and t["sdpa_ms"] > 0 for t in r["timings"])
    assert (r["head_dim"], r["batch"]) == (32, 2) and list(r["by_head_dim"]) == ["16"]
    assert r["by_head_dim"]["16"]["head_dim"] == 16 and len(r["by_head_dim"]["16"]["timings"]) == 2
    text = st.format_crossover(r)
    assert "tokens" in text and "crossover:" in text and "head_dim 16, batch 2 x 1 heads" in text


def test_long_sequence_kernel_is_checked_only_where_the_default_config_has_one(st, monkeypatch):
    """Hopper's Gluon kernel is built and checked at install time; a build error the runtime would
    swallow (falling back to the portable kernel) or wrong numbers turn it off in the report."""
    from types import SimpleNamespace

    from sagetriton.kernels import api, failures, hopper_gluon
    from sagetriton.kernels.arch import ArchInfo
    from sagetriton.kernels.tail_split import plan_tail

    hopper = ArchInfo("nvidia", "sm90", "hopper", fp8="e4m3fn")
    rdna4 = ArchInfo("amd", "gfx1201", "rdna4", fp8="e4m3fn")
    gpu = SimpleNamespace(type="cuda")
    assert st.long_sequence_kernel(rdna4, gpu, torch.bfloat16) is None  # no long-sequence kernel there
    assert st.long_sequence_kernel(hopper, torch.device("cpu"), torch.float16) is None  # nothing to build

    seen = []
    monkeypatch.setattr(st, "accuracy", lambda v, shapes, device, dtype: seen.append(shapes) or
                        {"ok": True, "cosine": 0.99925, "rel_l1": 0.038})
    monkeypatch.setattr(hopper_gluon, "AVAILABLE", True)
    monkeypatch.setattr(failures.memory, "gluon", None)
    monkeypatch.setattr(api, "sm_count", lambda device: 132)
    ok = st.long_sequence_kernel(hopper, gpu, torch.bfloat16)
    (b, h, lq, lk, d), = seen[0]
    assert ok["ok"] and ok["min_tokens"] == 4608 and lq > 4608 and lk % 128 and d == 128
    # Whole CTAs and a split last wave (kernels/tail_split.py): both kernels and the merge run.
    n_whole, splits = plan_tail(b * h * -(-lq // 192), 132, -(-lk // 128))
    assert n_whole > 0 and splits > 1
    assert "ok, cosine 0.99925" in st.format_long_sequence_kernel(ok)

    # The runtime swallowed a compiler error and ran the portable kernel: accurate, but reported as off.
    monkeypatch.setattr(failures.memory, "gluon", "CompilationError: at 3:4")
    off = st.long_sequence_kernel(hopper, gpu, torch.bfloat16)
    assert off["ok"] is False and "CompilationError" in off["error"]
    assert "OFF, the portable kernel serves those calls" in st.format_long_sequence_kernel(off)
    monkeypatch.setattr(hopper_gluon, "AVAILABLE", False)
    assert "no Gluon" in st.long_sequence_kernel(hopper, gpu, torch.bfloat16)["error"]
    assert st.format_long_sequence_kernel(None) is None


def test_pv_choice_times_the_8bit_paths_that_passed_and_picks_the_faster(st):
    from sagetriton.kernels.arch import ArchInfo

    h200 = ArchInfo("nvidia", "sm90", "hopper", "NVIDIA H200", 132, "e4m3fn")
    rdna3 = ArchInfo("amd", "gfx1100", "rdna3", "RX 7900 XTX", 32, None)
    every = {st.name_of(v) for a in (h200, rdna3) for v in st.variants_for(a)}
    assert [v["pv_precision"] for v in st.pv_candidates(h200, 128, every)] == ["fp8", "int8"]
    assert [v["pv_precision"] for v in st.pv_candidates(rdna3, 128, every)] == ["fp16", "int8"]  # no fp8 units
    int8_name = st.name_of(st.pv_candidates(h200, 128, every)[1])
    # Only variants that were built and self-tested compete (a --quick report tested the default alone).
    assert [v["pv_precision"] for v in st.pv_candidates(h200, 128, every - {int8_name})] == ["fp8"]
    assert st.choose_pv({"fp8": 1.8, "int8": 2.5}) == "fp8" and st.choose_pv({"fp8": 2.1, "int8": 1.6}) == "int8"
    assert st.choose_pv({"fp8": float("nan"), "int8": 2.5}) == "int8" and st.choose_pv({}) is None

    # The real measurement on the interpreter: every candidate timed on the same inputs, the fastest named.
    cpu = ArchInfo("nvidia", "sm90", "hopper", "simulated H200 (interpreter)", 132, "e4m3fn")
    r = st.measure_pv_choice(cpu, torch.device("cpu"), torch.float16, every, head_dims=(32,), seq_len=64, heads=1,
                             batch=1)
    e = r["by_head_dim"]["32"]
    assert set(e["ms"]) == {"fp8", "int8"} and all(t > 0 for t in e["ms"].values())
    assert e["choice"] == min(e["ms"], key=e["ms"].get)
    text = st.format_pv_choice(r)
    assert "head_dim 32: " + e["choice"] in text and "1x1x64" in text
    # One candidate left (int8 failed its self-test): nothing to choose, nothing timed.
    assert st.measure_pv_choice(cpu, torch.device("cpu"), torch.float16, every - {int8_name}, head_dims=(32,),
                                seq_len=64, heads=1, batch=1) is None


def _row(n, kernel_ms, sdpa_ms):
    return {"seq_len": n, "kernel_ms": kernel_ms, "sdpa_ms": sdpa_ms, "kernel_tops": 1.0, "sdpa_tops": 1.0}


def test_a_row_slower_than_a_longer_length_is_timed_again(st):
    """One slow row held the crossover above every shorter length: on an H200 a host-bound 6,144 (1.91 ms,
    longer than 8,192's 1.82) moved it from 4,608 to 8,192, and Flux's calls to SDPA."""
    asked = []

    def time_length(n):
        asked.append(n)
        return _row(n, 1.12, 1.40)

    timings = [_row(4608, 0.69, 0.79), _row(6144, 1.91, 1.35), _row(8192, 1.82, 2.39)]
    st.retime_implausible(timings, time_length)
    assert asked == [6144]
    assert timings[1]["kernel_ms"] == 1.12 and timings[1]["sdpa_ms"] == 1.35 and timings[1]["retimed"]
    assert "retimed" not in timings[0] and "retimed" not in timings[2]
    assert st.crossover_from_timings(timings)["seq_len"] == 4608
    assert "(timed twice)" in st.format_crossover({"timings": timings, "head_dim": 128})


def test_a_row_slow_twice_keeps_the_crossover_where_it_was(st):
    timings = [_row(4608, 0.69, 0.79), _row(6144, 1.91, 1.35), _row(8192, 1.82, 2.39)]
    st.retime_implausible(timings, lambda n: _row(n, 1.95, 1.34))
    assert timings[1]["kernel_ms"] == 1.91 and timings[1]["sdpa_ms"] == 1.34
    assert st.crossover_from_timings(timings)["seq_len"] == 8192


def test_a_failed_second_timing_keeps_the_first(st):
    def fails(n):
        raise RuntimeError("out of memory")

    timings = [_row(4608, 0.69, 0.79), _row(6144, 1.91, 1.35), {"seq_len": 8192, "error": "x"}, _row(16384, 1.5, 9.0)]
    st.retime_implausible(timings, fails)
    assert timings[1]["kernel_ms"] == 1.91 and "retimed" not in timings[1]


def test_rope_kernel_check_reports_wrong_bits_and_build_errors(st, monkeypatch):
    """install.py builds the RoPE kernel and compares its bits with ComfyUI's RoPE (``reference.rope``);
    wrong bits or a build error turn the pack's RoPE off in the report. Here on the CPU, with kernels
    standing in for the real one (the interpreter's roundings differ from a GPU's; gpu_check compares the
    real kernel's bits on the GPU)."""
    from sagetriton.kernels import reference, rope

    assert st.rope_kernel(torch.device("cpu"), torch.float16) is None  # GPU only
    assert st.format_rope_kernel(None) is None
    cpu = torch.device("cpu")

    def exact(x, freqs, y=None, fma=False):
        out = reference.rope(x, freqs, fma)
        return (out, reference.rope(y, freqs, fma)) if y is not None else out

    monkeypatch.setattr(rope, "apply", exact)
    ok = st.check_rope_kernel(cpu, torch.float16)
    assert ok["ok"] is True and "error" not in ok
    assert "ok, ComfyUI's bits" in st.format_rope_kernel(ok)

    monkeypatch.setattr(rope, "apply", lambda x, freqs, y=None, fma=False: exact(x, freqs, y, not fma))
    wrong = st.check_rope_kernel(cpu, torch.float16)
    assert wrong["ok"] is False and wrong["error"].startswith("not ComfyUI's bits: q and k")
    assert "OFF, ComfyUI's own RoPE runs" in st.format_rope_kernel(wrong)

    def broken(*args, **kwargs):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(rope, "apply", broken)
    failed = st.check_rope_kernel(cpu, torch.float16)
    assert failed["ok"] is False and "PassManager::run failed" in failed["error"] and failed["oom"] is False

