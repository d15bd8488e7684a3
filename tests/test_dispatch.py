"""Dispatcher rules without ComfyUI: argument binding, layouts, kernel vs fallback, fallbacks, RDNA4.

The kernel really runs (Triton interpreter on CPU tensors); ``reference_backend`` plays the part of
the ComfyUI backend (``func``) the override receives.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from attention_cases import comfy_args, exact_attention, normalized_mask, random_qkv, reference_backend
from sagetriton.kernels import failures
from sagetriton.kernels.arch import arch_from_properties
from sagetriton.kernels.reference import cosine
from sagetriton.nodes.backends import fallback
from sagetriton.nodes.config.install_report import NoReport
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.reporting import stats
from sagetriton.nodes.routing import dispatch
from sagetriton.nodes.routing.dispatch import PatchState, bind_call, kernel_inputs

ALWAYS_KERNEL = SageSettings(min_seq_len=0)
RDNA4 = arch_from_properties(SimpleNamespace(name="AMD Radeon RX 9070 XT", gcnArchName="gfx1201:sramecc-:xnack-"),
                             is_hip=True)
AMPERE = arch_from_properties(SimpleNamespace(name="NVIDIA A100", major=8, minor=0), is_hip=False)


@pytest.fixture(autouse=True)
def _clean_state():
    reference_backend.calls = 0
    failures.reset()
    yield
    failures.reset()


def run_state(settings=ALWAYS_KERNEL, **kw) -> PatchState:
    state = PatchState(settings, **kw)
    state.begin_run()
    return state


def call_override(state, q, k, v, skip_reshape=True, skip_output_reshape=False, mask=None, heads=None, **extra):
    heads = heads or q.shape[1]
    args = comfy_args(q, k, v, skip_reshape)
    kwargs = dict(skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape, transformer_options={},
                  _inside_attn_wrapper=True, **extra)
    if mask is not None:
        kwargs["mask"] = mask
    return state.dispatch(reference_backend, (*args, heads), kwargs)


def as_bhld(out, skip_output_reshape, heads):
    if skip_output_reshape:
        return out
    b, lq, width = out.shape
    return out.view(b, lq, heads, width // heads).transpose(1, 2)


# --- binding -----------------------------------------------------------------------------------------
def test_binding_accepts_heads_and_mask_positionally_or_by_keyword():
    q, k, v = random_qkv(lq=8, lk=8, d=16)
    mask = torch.zeros(8, 8)
    positional = bind_call((q, k, v, 2, mask), {"skip_reshape": True})
    keywords = bind_call((q, k, v), {"heads": 2, "mask": mask, "skip_reshape": True, "attn_precision": None})
    for call in (positional, keywords):
        assert (call.heads, call.batch, call.q_len, call.k_len, call.head_dim, call.kv_heads) == (2, 2, 8, 8, 16, 2)
        assert call.mask is mask and call.skip_reshape and not call.skip_output_reshape
    with pytest.raises(TypeError):
        bind_call((q, k), {})


def test_kernel_gets_strided_views_not_copies():
    q, k, v = random_qkv(lq=8, lk=8, d=16)
    qf, kf, vf = comfy_args(q, k, v, skip_reshape=False)
    call = bind_call((qf, kf, vf, 2), {})
    kq, kk, kv, layout = kernel_inputs(call)
    assert layout == "NHD" and kq.shape == (2, 8, 2, 16)
    for view, source in ((kq, qf), (kk, kf), (kv, vf)):
        assert view.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()
        assert not view.is_contiguous()  # really a view into the fused buffer


# --- kernel path -------------------------------------------------------------------------------------
@pytest.mark.parametrize("skip_reshape,skip_output_reshape", [(True, False), (True, True), (False, False),
                                                               (False, True)])
def test_kernel_output_matches_exact_attention_in_every_layout(seed, skip_reshape, skip_output_reshape):
    q, k, v = random_qkv(lq=24, lk=20, d=64)
    state = run_state()
    out = call_override(state, q, k, v, skip_reshape, skip_output_reshape)
    assert reference_backend.calls == 0 and state.run.kernel == 1
    expected_shape = (2, 2, 24, 64) if skip_output_reshape else (2, 24, 128)
    assert out.shape == expected_shape and out.dtype == q.dtype
    assert cosine(as_bhld(out, skip_output_reshape, 2), exact_attention(q, k, v)) >= 0.999
    # Written in the memory order ComfyUI returns: contiguous, and (B, L, H·D) is a view of the
    # kernel's own buffer, not a transposed copy of it.
    assert out.is_contiguous()
    if not skip_output_reshape:
        assert out._base is not None and out._base.shape == (2, 24, 2, 64)


@pytest.mark.parametrize("kind", ["2d_float", "3d_float", "4d_float", "4d_bool", "key_padding", "int64_caption",
                                  "int32_bias", "uint8"])
def test_masks_run_in_the_kernel_with_sdpa_semantics(seed, kind):
    q, k, v = random_qkv(b=2, lq=16, lk=16, d=32, dtype=torch.bfloat16)
    masks = {
        "2d_float": torch.randn(16, 16),
        "3d_float": torch.randn(2, 16, 16),
        "4d_float": torch.randn(2, 2, 16, 16),
        "4d_bool": torch.rand(2, 1, 16, 16) > 0.3,
        "key_padding": torch.cat([torch.zeros(2, 1, 1, 11), torch.full((2, 1, 1, 5), -torch.inf)], -1),
        # Integer masks (Lumina 2's raw caption mask on ComfyUI 0.3.75): added to the scores like a float mask
        "int64_caption": torch.cat([torch.ones(2, 11, dtype=torch.int64), torch.zeros(2, 5, dtype=torch.int64)], -1)
        .view(2, 1, 1, 16),
        "int32_bias": torch.randint(-3, 4, (2, 16, 16), dtype=torch.int32),
        "uint8": torch.randint(0, 3, (16, 16), dtype=torch.uint8),
    }
    mask = masks[kind]
    if mask.dtype.is_floating_point:
        mask = mask.to(torch.bfloat16)
    elif mask.dtype == torch.bool:
        mask[..., 0] = True  # no fully masked rows in this test
    state = run_state()
    out = call_override(state, q, k, v, mask=mask)
    assert state.run.kernel == 1 and reference_backend.calls == 0
    assert cosine(as_bhld(out, False, 2), exact_attention(q, k, v, normalized_mask(mask))) >= 0.999


def test_gqa_and_scale_keywords_reach_the_kernel(seed):
    q, k, v = random_qkv(h=4, kv_heads=2, lq=16, lk=16, d=32)
    state = run_state()
    out = call_override(state, q, k, v, skip_output_reshape=True, enable_gqa=True, scale=0.1)
    assert state.run.kernel == 1
    assert cosine(out, exact_attention(q, k, v, scale=0.1)) >= 0.999


# --- fallbacks ---------------------------------------------------------------------------------------
FALLBACK_CASES = {
    "low_precision_attention": (dict(low_precision_attention=False),
                                "accuracy-critical call (low_precision_attention=False)"),
    "unknown_kwarg": (dict(window_size=4), "unsupported argument 'window_size'"),
    "fp32_inputs": (dict(dtype=torch.float32), "dtype float32"),
    "fp32_attn_precision": (dict(attn_precision=torch.float32), "fp32 attn_precision requested"),
    "complex_mask": (dict(mask=torch.zeros(16, 16, dtype=torch.complex64)), "mask dtype complex64"),
    "mask_per_batch_and_head": (dict(mask=torch.zeros(4, 16, 16, dtype=torch.float16)),
                               "mask shape not broadcastable to (B, H, Lq, Lk)"),
    "short_keys": (dict(settings=SageSettings(min_seq_len=17)), "key length < 17"),
}


@pytest.mark.parametrize("case", sorted(FALLBACK_CASES))
def test_fallback_reasons_route_to_comfyui_backend(case):
    extra, reason = FALLBACK_CASES[case]
    extra = dict(extra)
    dtype = extra.pop("dtype", torch.float16)
    state = run_state(extra.pop("settings", ALWAYS_KERNEL))
    q, k, v = random_qkv(lq=16, lk=16, d=32, dtype=dtype)
    mask = extra.pop("mask", None)
    out = call_override(state, q, k, v, mask=mask, **extra)
    assert reference_backend.calls == 1 and state.run.kernel == 0
    assert dict(state.run.fallback) == {reason: 1}
    assert out.shape == (2, 16, 64)


def test_non_gpu_device_falls_back_outside_interpreter_mode(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # read at call time: CPU tensors are now "not a GPU"
    state = run_state()
    q, k, v = random_qkv(lq=8, lk=8, d=16)
    call_override(state, q, k, v)
    assert dict(state.run.fallback) == {"cpu device is not a CUDA/ROCm GPU": 1}


def test_one_warning_per_reason_per_run(caplog):
    state = run_state()
    q, k, v = random_qkv(lq=8, lk=8, d=16, dtype=torch.float32)
    with caplog.at_level(logging.INFO, logger="SageTriton"):
        for _ in range(3):
            call_override(state, q, k, v)
        state.begin_run()
        call_override(state, q, k, v)
    warnings = [r for r in caplog.records if "falls back (dtype float32)" in r.getMessage()]
    assert len(warnings) == 2 and all(r.levelno == logging.WARNING for r in warnings)


def test_policy_fallbacks_log_at_info(caplog):
    state = run_state(SageSettings(min_seq_len=1000))
    q, k, v = random_qkv(lq=8, lk=8, d=16)
    with caplog.at_level(logging.INFO, logger="SageTriton"):
        call_override(state, q, k, v)
    [record] = [r for r in caplog.records if "key length < 1000" in r.getMessage()]
    assert record.levelno == logging.INFO


def test_kernel_failure_falls_back_and_disables_the_variant(monkeypatch, caplog, pack):
    real = pack.kernels.sageattn

    def broken(*args, **kwargs):
        raise RuntimeError("simulated compile failure")

    monkeypatch.setattr(pack.kernels, "sageattn", broken)
    state = run_state()
    q, k, v = random_qkv(lq=16, lk=16, d=32)
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        out = call_override(state, q, k, v)
    assert reference_backend.calls == 1 and out.shape == (2, 16, 64)
    assert any("simulated compile failure" in r.getMessage() and "disabled" in r.getMessage() for r in caplog.records)
    assert len(dispatch.disabled_variants()) == 1

    monkeypatch.setattr(pack.kernels, "sageattn", real)
    call_override(state, q, k, v)  # same variant: stays disabled until restart
    assert state.run.kernel == 0
    assert dict(state.run.fallback) == {"kernel failed (variant disabled until restart)": 2}
    call_override(state, *random_qkv(lq=16, lk=16, d=32, dtype=torch.bfloat16))  # another variant still works
    assert state.run.kernel == 1


def test_unsupported_choice_is_downgraded_once_visibly(caplog):
    state = run_state(SageSettings(min_seq_len=0, pv_precision="fp8"), arch=AMPERE)
    q, k, v = random_qkv(lq=16, lk=16, d=32)
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        call_override(state, q, k, v)
        call_override(state, q, k, v)
    assert state.run.kernel == 2 and state.last_plan.config.pv_precision == "fp16"
    assert len(state.planner.notes) == 1 and "fp8" in state.planner.notes[0]
    assert len([r for r in caplog.records if "fp8" in r.getMessage()]) == 1


# --- fallback kinds and RDNA4 ----------------------------------------------------------------------
class SdpaSpy:
    """Wraps torch SDPA to record which backends were allowed and the query rows of each call."""

    def __init__(self, monkeypatch):
        self.calls = []
        self._real = torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", self)

    def __call__(self, q, *args, **kwargs):
        b = torch.backends.cuda
        self.calls.append({"rows": q.shape[-2], "dtype": q.dtype, "math": b.math_sdp_enabled(),
                           "flash": b.flash_sdp_enabled(), "efficient": b.mem_efficient_sdp_enabled(),
                           "cudnn": b.cudnn_sdp_enabled()})
        return self._real(q, *args, **kwargs)

    @property
    def math_only(self) -> bool:
        return all(c["math"] and not (c["flash"] or c["efficient"] or c["cudnn"]) for c in self.calls)


def test_rdna4_fallback_is_math_only_sdpa_in_query_chunks(monkeypatch, seed):
    assert RDNA4.family == "rdna4" and RDNA4.arch == "gfx1201"
    q, k, v = random_qkv(lq=40, lk=24, d=32)
    rows = 8
    budget = 2 * 2 * 24 * 4 * 2 * rows  # exactly `rows` query rows of fp32 scores + probabilities per chunk
    state = run_state(SageSettings(), arch=RDNA4, score_budget_bytes=budget)  # table crossover (1024) > 24 keys
    spy = SdpaSpy(monkeypatch)
    mask = torch.randn(40, 24).to(torch.float16)
    flash_before = torch.backends.cuda.flash_sdp_enabled()
    out = call_override(state, q, k, v, mask=mask)
    assert reference_backend.calls == 0  # ComfyUI's own backend (possibly SDPA flash) is never used on RDNA4
    assert [c["rows"] for c in spy.calls] == [8] * 5 and spy.math_only
    assert torch.backends.cuda.flash_sdp_enabled() == flash_before  # the math-only context ended with the call
    assert dict(state.run.fallback) == {"key length < 1024": 1}
    assert cosine(as_bhld(out, False, 2), exact_attention(q, k, v, normalized_mask(mask))) >= 0.9999


def test_rdna4_keeps_an_earlier_override_but_only_with_math_sdpa(monkeypatch):
    seen = []

    def other_pack_override(func, *args, **kwargs):
        seen.append(torch.backends.cuda.flash_sdp_enabled())
        return func(*args, **kwargs)

    state = run_state(SageSettings(), arch=RDNA4, previous_override=other_pack_override)
    call_override(state, *random_qkv(lq=8, lk=8, d=16))
    assert seen == [False] and reference_backend.calls == 1


@pytest.mark.parametrize("choice", ["sdpa", "math"])
def test_fallback_choice_replaces_comfyui_backend(monkeypatch, choice, seed):
    spy = SdpaSpy(monkeypatch)
    state = run_state(SageSettings(min_seq_len=100, fallback=choice))
    q, k, v = random_qkv(lq=16, lk=16, d=32)
    out = call_override(state, q, k, v, skip_output_reshape=True)
    assert reference_backend.calls == 0 and len(spy.calls) == 1
    assert spy.math_only == (choice == "math")
    assert cosine(out, exact_attention(q, k, v)) >= 0.9999


def test_fp32_attn_precision_is_honoured_by_our_fallbacks(monkeypatch, seed):
    spy = SdpaSpy(monkeypatch)
    state = run_state(SageSettings(fallback="math", min_seq_len=100))
    q, k, v = random_qkv(lq=16, lk=16, d=32)
    out = call_override(state, q, k, v, skip_output_reshape=True, attn_precision=torch.float32)
    call_override(state, q, k, v, skip_output_reshape=True)  # short keys, default precision
    assert [c["dtype"] for c in spy.calls] == [torch.float32, torch.float16]
    assert out.dtype == torch.float16 and cosine(out, exact_attention(q, k, v)) >= 0.99999


def test_query_chunk_rows_respects_budget():
    assert fallback.query_chunk_rows(1, 24, 100_000, 100_000, 512 * 2**20) == 27
    assert fallback.query_chunk_rows(1, 1, 10, 10, 1 << 40) == 10
    assert fallback.query_chunk_rows(8, 64, 10, 10**7, 1) == 1


def test_resolve_fallback_kind():
    assert fallback.resolve_fallback_kind("auto", AMPERE) == "comfy"
    assert fallback.resolve_fallback_kind("sdpa", AMPERE) == "sdpa"
    assert {fallback.resolve_fallback_kind(c, RDNA4) for c in ("auto", "sdpa", "math")} == {"math"}


# --- stats -------------------------------------------------------------------------------------------
def test_process_totals_count_every_call():
    before = stats.attention_stats()
    state = run_state(SageSettings(min_seq_len=100))
    call_override(state, *random_qkv(lq=8, lk=8, d=16))
    after = stats.attention_stats()
    assert after["fallback"]["key length < 100"] == before["fallback"].get("key length < 100", 0) + 1
    assert after["kernel"] == before["kernel"]


def _forbid_checks(monkeypatch, binding: bool = True):
    """From here on, argument binding (optional) and the call checks raise: a call that reaches them fails."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a repeated call went through the full checks")

    monkeypatch.setattr(dispatch, "call_fallback_reason", forbidden)
    if binding:
        monkeypatch.setattr(dispatch, "bind_call", forbidden)


def test_repeated_calls_skip_binding_and_checks_with_the_same_result_and_counts(monkeypatch, seed):
    """A call signature seen before is decided by one lookup: fallbacks are neither bound nor checked,
    kernel calls not checked; outputs and counts are those of the full path."""
    state = run_state(SageSettings(min_seq_len=20))
    short = [random_qkv(lq=8, lk=8, d=16), random_qkv(lq=8, lk=8, d=16, dtype=torch.float32)]
    long = random_qkv(lq=8, lk=24, d=16)
    first = [call_override(state, *t, skip_reshape=r) for t in short for r in (True, False)]
    first_kernel = call_override(state, *long)
    before = stats.attention_stats()
    _forbid_checks(monkeypatch, binding=False)  # the kernel path still binds (cheaply) to launch
    again_kernel = call_override(state, *long)
    assert torch.equal(first_kernel, again_kernel)
    _forbid_checks(monkeypatch)
    again = [call_override(state, *t, skip_reshape=r) for t in short for r in (True, False)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert reference_backend.calls == 8 and state.run.kernel == 2
    # Each signature keeps its own reason: fp32 calls are not "too short", even at a known short length.
    assert dict(state.run.fallback) == {"key length < 20": 4, "dtype float32": 4}
    after = stats.attention_stats()
    assert after["kernel"] == before["kernel"] + 1
    assert after["fallback"]["dtype float32"] == before["fallback"]["dtype float32"] + 2


def test_repeated_calls_keep_going_through_an_earlier_override(monkeypatch, seed):
    """Another pack's override that was there before ours sees every fallback, the cached ones too."""
    seen = []

    def other_pack_override(func, *args, **kwargs):
        seen.append(args[1].shape)
        return func(*args, **kwargs)

    state = run_state(SageSettings(min_seq_len=100), previous_override=other_pack_override)
    q, k, v = random_qkv(lq=8, lk=8, d=16)
    call_override(state, q, k, v)
    _forbid_checks(monkeypatch)
    call_override(state, q, k, v)
    assert len(seen) == 2 and reference_backend.calls == 2
    assert dict(state.run.fallback) == {"key length < 100": 2}


def test_new_settings_decide_again():
    state = run_state(SageSettings(min_seq_len=100))
    qkv = random_qkv(lq=8, lk=8, d=16)
    call_override(state, *qkv)
    state.settings = SageSettings(min_seq_len=0)
    call_override(state, *qkv)
    assert state.run.kernel == 1 and dict(state.run.fallback) == {"key length < 100": 1}


class ChangingReport(NoReport):
    """A report whose measured crossover changes, as when first start finishes install.py's measurement."""

    def __init__(self, crossover):
        self.value, self.changes = crossover, 0

    def crossover(self, arch, cfg, head_dim=128):
        return self.value

    def generation(self):
        return self.changes


def test_a_new_report_decides_again():
    report = ChangingReport(crossover=40)
    state = run_state(SageSettings(), report=report)
    qkv = random_qkv(lq=36, lk=36, d=16)  # 2 x 2 heads x 36²: more work than 48 x 10²
    call_override(state, *qkv)
    report.value = 10
    call_override(state, *qkv)  # the report's generation did not change: the decision stands
    report.changes += 1
    call_override(state, *qkv)
    assert dict(state.run.fallback) == {"key length < 40": 2} and state.run.kernel == 1
    assert state.last_plan.min_seq_len == 10


def test_saving_or_dropping_the_report_changes_its_generation(rep):
    from sagetriton.nodes.config.install_report import InstallReport

    before = InstallReport().generation()
    rep.invalidate_cache()
    assert InstallReport().generation() != before


def test_a_variant_disabled_elsewhere_stops_a_cached_kernel_decision():
    state = run_state()
    qkv = random_qkv(lq=16, lk=16, d=32)
    call_override(state, *qkv)
    failures.memory.variants[next(iter(state._calls.entries.values())).variant] = "failed in another model"
    call_override(state, *qkv)
    assert state.run.kernel == 1 and dict(state.run.fallback) == {"kernel failed (variant disabled until restart)": 1}


def test_full_precision_steps_are_decided_per_call_under_one_signature():
    schedule = torch.tensor([10.0, 5.0, 1.0, 0.0])
    state = run_state(SageSettings(min_seq_len=0, full_precision_first_steps=1))
    qkv = random_qkv(lq=16, lk=16, d=16)
    for sigma in (10.0, 5.0, 10.0, 1.0):
        opts = {"sample_sigmas": schedule, "sigmas": torch.tensor([sigma, sigma])}
        args = comfy_args(*qkv, True)
        state.dispatch(reference_backend, (*args, 2), dict(skip_reshape=True, transformer_options=opts))
    assert state.run.kernel == 2 and dict(state.run.fallback) == {"full-precision step": 2}


def test_the_call_cache_is_bounded(monkeypatch):
    from sagetriton.nodes.routing import call_cache

    monkeypatch.setattr(call_cache, "MAX_ENTRIES", 2)
    state = run_state(SageSettings(min_seq_len=100))
    for lk in (8, 9, 10):
        call_override(state, *random_qkv(lq=8, lk=lk, d=16))
    assert len(state._calls) <= 2 and dict(state.run.fallback) == {"key length < 100": 3}


# --- install.py's self-test report -----------------------------------------------------------------
class MeasuredReport(NoReport):
    """Answers shaped like kernels.report's for a GPU where install.py measured things."""

    def __init__(self, crossover=None, failed=(), sdpa_safe=None, long_failed=False):
        self._crossover, self._failed, self._sdpa_safe = crossover, set(failed), sdpa_safe
        self._long_failed = long_failed

    def crossover(self, arch, cfg, head_dim=128):
        return self._crossover(head_dim) if callable(self._crossover) else self._crossover

    def variant_failed(self, arch, cfg):
        return f"{cfg.qk_quant_gran}/{cfg.pv_precision}/{cfg.pv_accum_dtype}" in self._failed

    def sdpa_default_safe(self, arch):
        return self._sdpa_safe

    def long_sequence_kernel_failed(self, arch):
        return self._long_failed


def test_measured_crossover_replaces_the_table_value():
    state = run_state(SageSettings(), report=MeasuredReport(crossover=10))
    call_override(state, *random_qkv(lq=36, lk=8, d=16))
    call_override(state, *random_qkv(lq=36, lk=36, d=16))  # 2 x 2 heads x 36²: more work than 48 x 10²
    assert state.run.kernel == 1 and dict(state.run.fallback) == {"key length < 10": 1}
    assert state.last_plan.min_seq_len == 10


def test_crossover_is_looked_up_per_head_size():
    state = run_state(SageSettings(), report=MeasuredReport(crossover=lambda d: 4 if d <= 16 else 40))
    call_override(state, *random_qkv(lq=16, lk=16, d=16))
    call_override(state, *random_qkv(lq=16, lk=16, d=32))
    assert state.run.kernel == 1 and dict(state.run.fallback) == {"key length < 40": 1}


def test_calls_with_less_work_than_the_crossover_measurement_fall_back():
    """The crossover was measured with 2 x 24 heads: past it in length but with less work per call (SDXL's
    2 x 10 heads at 4,096 tokens), host time can outweigh the kernel's gain, so those calls go to SDPA."""
    state = run_state(SageSettings(), report=MeasuredReport(crossover=10))
    call_override(state, *random_qkv(b=1, h=4, lq=16, lk=16, d=16))  # 4 x 16² < 48 x 10²
    call_override(state, *random_qkv(b=2, h=6, lq=20, lk=20, d=16))  # 12 x 20² = 48 x 10²
    assert state.run.kernel == 1
    assert dict(state.run.fallback) == {"work per call < 48 x 10² (batch x heads x Lq x Lk)": 1}
    # A key length the user set is taken as given, whatever the work per call.
    state = run_state(SageSettings(min_seq_len=10), report=MeasuredReport(crossover=10))
    call_override(state, *random_qkv(b=1, h=4, lq=16, lk=16, d=16))
    assert state.run.kernel == 1 and not state.run.fallback


def test_variant_that_failed_the_self_test_is_replaced_by_a_working_one(caplog):
    report = MeasuredReport(failed={"per_thread/fp16/fp32", "per_warp/fp16/fp32"})
    state = run_state(SageSettings(min_seq_len=0, qk_quant_gran="per_thread"), report=report)
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        call_override(state, *random_qkv(lq=16, lk=16, d=32))
    assert state.run.kernel == 1
    assert (state.last_plan.config.qk_quant_gran, state.last_plan.config.pv_precision) == ("per_block", "fp16")
    assert any("per_thread/fp16/fp32 failed the install self-test" in r.getMessage() for r in caplog.records)


def test_long_sequence_kernel_that_failed_the_self_test_is_not_configured(caplog):
    hopper = arch_from_properties(SimpleNamespace(name="NVIDIA H200", major=9, minor=0), is_hip=False)
    assert run_state(SageSettings()).planner.plan(hopper, 128).config.shared_kv_min_len == 4608
    state = run_state(SageSettings(), report=MeasuredReport(long_failed=True))
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        cfg = state.planner.plan(hopper, 128).config
    assert cfg.shared_kv_min_len == 0 and cfg.pv_precision == "fp8"  # same variant, portable kernel only
    assert any("long-sequence (Gluon) kernel failed the install self-test on sm90" in r.getMessage()
               for r in caplog.records)


def test_no_working_variant_means_fallback():
    grans, accs = ("per_block", "per_warp", "per_thread"), ("fp32", "fp16+fp32", "fp16")
    report = MeasuredReport(failed={f"{g}/{p}/{a}" for g in grans for p in ("fp16", "fp8") for a in accs})
    state = run_state(SageSettings(min_seq_len=0), report=report)
    call_override(state, *random_qkv(lq=8, lk=8, d=16))
    assert reference_backend.calls == 1
    assert dict(state.run.fallback) == {"no kernel variant passed the install self-test": 1}


def test_rdna4_honours_explicit_sdpa_only_where_the_probe_found_it_safe():
    assert fallback.resolve_fallback_kind("sdpa", RDNA4, sdpa_default_safe=True) == "sdpa"
    assert fallback.resolve_fallback_kind("sdpa", RDNA4, sdpa_default_safe=None) == "math"
    assert fallback.resolve_fallback_kind("auto", RDNA4, sdpa_default_safe=True) == "math"


# --- what reaches the launch -------------------------------------------------------------------------
HOPPER = arch_from_properties(SimpleNamespace(name="NVIDIA H200", major=9, minor=0), is_hip=False)
ATTENTION_KERNELS = {"attention_kernel", "shared_kv_attention_kernel", "shared_kv_split_kernel"}


@pytest.fixture
def launches(monkeypatch, pack):
    """The kernel launches of the calls made in the test, recorded instead of run (the cross-compile
    check's hook), as outside the interpreter: where the Gluon kernel is planned."""
    from sagetriton.installer.crosscompile import record_launches
    from sagetriton.kernels import checks, hopper_host, host, host_quant

    for m in (checks, host, host_quant, hopper_host):
        monkeypatch.setattr(m, "interpreter_enabled", lambda: False)
    with record_launches() as recorded:
        yield recorded


def attention_launches(recorded) -> dict:
    return {s["name"]: s for s in recorded if s["name"] in ATTENTION_KERNELS}


def assert_portable_launch_runs(spec, cfg):
    c, o = spec["constexprs"], spec["options"]
    assert (c["BLOCK_M"], c["BLOCK_N"], c["K_TMA"]) == (cfg.block_m, cfg.block_n, cfg.use_tma)
    assert (o["num_warps"], o["num_stages"], o.get("maxnreg", 0)) == (cfg.num_warps, cfg.num_stages,
                                                                       cfg.max_registers)


def test_the_arch_override_reaches_the_launch(launches):
    """A simulated A100 on CPU tensors: the launch gets the A100's tiles, not the CPU's."""
    from sagetriton.kernels.arch import resolve_config

    state = run_state(arch=AMPERE)
    call_override(state, *random_qkv(lq=64, lk=64, d=64))
    assert state.run.kernel == 1
    cfg = resolve_config(AMPERE, 64)[0]
    assert state.last_plan.config == cfg and (cfg.block_m, cfg.num_warps, cfg.num_stages) == (128, 8, 3)
    (spec,) = attention_launches(launches).values()
    assert spec["name"] == "attention_kernel"
    assert_portable_launch_runs(spec, cfg)


def test_long_sequences_on_hopper_reach_the_gluon_kernel(launches):
    from sagetriton.kernels import hopper_gluon

    if not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    state = run_state(arch=HOPPER)
    n = state.planner.plan(HOPPER, 128).config.shared_kv_min_len
    assert n == 4608
    call_override(state, *random_qkv(b=1, h=2, lq=n, lk=n, d=128, dtype=torch.bfloat16))
    names = set(attention_launches(launches))
    assert names and names <= {"shared_kv_attention_kernel", "shared_kv_split_kernel"}, names


def test_a_gluon_kernel_that_failed_the_self_test_never_reaches_the_launch(launches):
    """The report says the Gluon kernel failed its accuracy self-test: every call, however long, runs the
    portable kernel with Hopper's config (the kernel library must not resolve a config of its own)."""
    from sagetriton.kernels.arch import resolve_config

    state = run_state(arch=HOPPER, report=MeasuredReport(long_failed=True))
    call_override(state, *random_qkv(b=1, h=2, lq=4608, lk=4608, d=128, dtype=torch.bfloat16))
    assert state.run.kernel == 1
    cfg = state.last_plan.config
    assert cfg == resolve_config(HOPPER, 128)[0].replace(shared_kv_min_len=0)
    (spec,) = attention_launches(launches).values()
    assert spec["name"] == "attention_kernel"
    assert_portable_launch_runs(spec, cfg)
    assert (cfg.block_n, cfg.max_registers, cfg.use_tma) == (128, 168, True)  # Hopper's, not the CPU's


def test_sageattn_takes_a_resolved_config_or_options_not_both(pack):
    from sagetriton.kernels import sageattn
    from sagetriton.kernels.arch import KernelConfig

    q, k, v = random_qkv(lq=8, lk=8, d=16)
    with pytest.raises(ValueError, match="not both"):
        sageattn(q, k, v, config=KernelConfig(), qk_quant_gran="per_block")


def test_call_signatures_tell_positional_and_keyword_forms_apart():
    from sagetriton.nodes.routing.call_cache import call_signature

    q, k, v = random_qkv(lq=8, lk=8, d=16)
    mask = torch.zeros(8, 8)
    forms = [((q, k, v, 2), {}), ((q, k, v, 2, None), {}), ((q, k, v, 2, mask), {}), ((q, k, v, 2), {"mask": mask}),
             ((q, k, v), {"heads": 2}), ((q, k, v, 2), {"mask": None}), ((q, k, v, 2, mask.half()), {})]
    keys = [call_signature(a, kw) for a, kw in forms]
    assert len(set(keys)) == len(keys)
    # what never changes a decision leaves the signature alone: the wrapper's marker, transformer_options,
    # and the mask's values
    assert call_signature((q, k, v, 2, mask), {"transformer_options": {"a": 1}, "_inside_attn_wrapper": True}) \
        == call_signature((q, k, v, 2, torch.ones(8, 8)), {})
    assert call_signature((torch.zeros(3), k), {}) is None and call_signature(([1], k, v), {}) is None


# --- a caller's malformed call is not a kernel failure (issue 40 item 4) -----------------------------------
def test_width_not_divisible_by_heads_goes_to_comfyui_and_keeps_the_kernel_on():
    state = run_state()
    q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=16)
    good = comfy_args(q, k, v, skip_reshape=False)  # (1, 16, 32): 2 heads of 16
    bad = [torch.cat([t, t[..., :1]], -1) for t in good]  # width 33: no whole number of heads
    with pytest.raises(RuntimeError):  # what ComfyUI's attention raises for it (a view that does not fit)
        state.dispatch(reference_backend, (*bad, 2), {})
    assert dispatch.disabled_variants() == {}
    out = state.dispatch(reference_backend, (*good, 2), {})
    assert state.run.kernel == 1 and out.shape == (1, 16, 32)  # the same variant and size class: still on


def test_zero_heads_reach_comfyuis_attention():
    state = run_state()
    reached = []

    def comfy_backend(q, k, v, heads, *args, **kwargs):  # ComfyUI's attention divides the width by heads
        reached.append(heads)
        return q.shape[-1] // heads

    q, k, v = comfy_args(*random_qkv(b=1, h=2, lq=16, lk=16, d=16), skip_reshape=False)
    with pytest.raises(ZeroDivisionError):
        state.dispatch(comfy_backend, (q, k, v, 0), {})
    assert reached == [0] and dispatch.disabled_variants() == {}
    assert "unrecognised call signature" in state.run.fallback


@pytest.mark.parametrize("change", ["k_batch", "v_length", "k_width"])
def test_mismatched_qkv_shapes_do_not_turn_the_kernel_off(change):
    state = run_state()
    q, k, v = comfy_args(*random_qkv(b=2, h=2, lq=16, lk=16, d=16), skip_reshape=False)
    k, v = k.contiguous(), v.contiguous()
    if change == "k_batch":
        k = k[:1]
    elif change == "v_length":
        v = v[:, :8]
    else:
        k = torch.cat([k, k[..., :1]], -1)
    try:
        state.dispatch(reference_backend, (q, k, v, 2), {})
    except RuntimeError:
        pass  # ComfyUI's attention refuses it too: the caller's error
    assert dispatch.disabled_variants() == {}


# --- a caller's bad argument is the caller's, never a kernel fault (issue 49 items 3 and 5) ------------------
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1", torch.tensor(0.1)],
                         ids=["nan", "inf", "string", "0-dim tensor"])
def test_a_bad_scale_goes_to_comfyui_and_turns_nothing_off(scale):
    state = run_state()
    q, k, v = random_qkv(lq=16, lk=16, d=32)
    try:
        call_override(state, q, k, v, scale=scale)  # SDPA (ComfyUI's attention here) computes what it computes
    except TypeError:
        assert scale == "0.1"  # ...or raises what it raises
    assert reference_backend.calls == 1 and state.run.kernel == 0
    assert dict(state.run.fallback) == {dispatch.BAD_SCALE: 1}
    assert dispatch.disabled_variants() == {}
    call_override(state, q, k, v, scale=0.1)  # the same variant and size class, a good scale: the kernel
    assert state.run.kernel == 1


def test_arguments_the_kernel_refuses_past_the_checks_turn_nothing_off():
    """65,536 heads of head_dim 1: past the dispatcher's checks, refused by ``sageattn`` before any launch
    (the GPU's grid limit). The call is the caller's: ComfyUI's attention takes it, the variant stays on."""
    state = run_state()
    heads = dispatch_grid_limit() + 1
    q, k, v = random_qkv(b=1, h=heads, lq=4, lk=4, d=1)
    out = call_override(state, q, k, v, heads=heads)
    assert out.shape == (1, 4, heads) and reference_backend.calls == 1
    assert list(state.run.fallback) == [dispatch.REFUSED_ARGUMENTS] and dispatch.disabled_variants() == {}


def dispatch_grid_limit() -> int:
    from sagetriton.kernels.api import GRID_Y_LIMIT

    return GRID_Y_LIMIT


@pytest.mark.parametrize("empty", ["q_tokens", "k_tokens", "batch"])
def test_an_empty_call_is_reported_as_empty(empty):
    state = run_state()
    b, lq, lk = {"q_tokens": (1, 0, 16), "k_tokens": (1, 16, 0), "batch": (0, 16, 16)}[empty]
    q, k, v = random_qkv(b=b, lq=lq, lk=lk, d=32)
    try:
        call_override(state, q, k, v)
    except RuntimeError:
        pass  # SDPA's answer to keys of no tokens
    assert dict(state.run.fallback) == {dispatch.EMPTY_CALL: 1} and dispatch.disabled_variants() == {}
