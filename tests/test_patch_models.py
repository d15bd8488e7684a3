"""Patch Model Attention on real ComfyUI models (tiny, random weights), sampled by ComfyUI's samplers.

The kernel runs through the Triton interpreter (min_seq_len=0 so every call is eligible).
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from model_checks import KernelSpy, assert_calls_close, check_every_call, without_masks
from sagetriton.kernels.arch import arch_from_properties
from sagetriton.kernels.reference import cosine, rel_l1
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import OVERRIDE_KEY, patch_model, patch_state_of
from sagetriton.nodes.reporting import stats
from sagetriton.nodes.reporting.run_summary import WRAPPER_KEY, notify_browser
from tiny_models import BUILDERS, sample

pytestmark = pytest.mark.usefixtures("comfyui_path")

ALWAYS_KERNEL = SageSettings(min_seq_len=0)
RDNA4 = arch_from_properties(SimpleNamespace(name="AMD Radeon RX 9070 XT", gcnArchName="gfx1201:sramecc-:xnack-"),
                             is_hip=True)


@pytest.fixture(autouse=True)
def no_install_report(monkeypatch, tmp_path, pack):
    """Hermetic: no self-test report from this checkout's earlier runs; a test may write its own."""
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path / "report"))
    pack.installer.report.invalidate_cache()
    yield pack.installer.report
    pack.installer.report.invalidate_cache()


def overrides_of(model) -> dict:
    return {k: v for k, v in model.model_options.get("transformer_options", {}).items() if k == OVERRIDE_KEY}


@pytest.mark.parametrize("family", list(BUILDERS))
def test_patched_model_samples_like_the_original(family, tiny, monkeypatch, pack):
    t = tiny(family)
    reference = sample(t)
    totals_before = stats.attention_stats()
    spy = KernelSpy(monkeypatch, pack)

    patched = patch_model(t.patcher, ALWAYS_KERNEL)
    checked = check_every_call(patched)  # each call against ComfyUI's own attention on the same inputs
    out = sample(t, patched)

    run = stats.last_run()
    assert run["kernel"] == len(spy.calls) == len(checked) > 0 and run["fallback"] == {}, run["text"]
    assert stats.attention_stats()["kernel"] - totals_before["kernel"] == len(spy.calls)
    assert sorted(spy.calls, key=repr) == sorted((c.call for c in checked), key=repr)  # masks included
    assert_calls_close(checked, family, spy.bounds)
    if t.masks:  # the masks reach the kernel, and they matter: to each call and to the picture
        assert spy.masked > 0 and any(c.mask_effect > 0 for c in checked)
        assert rel_l1(out, reference) < rel_l1(sample(without_masks(t)), reference) / 5
    assert torch.isfinite(out).all()
    assert not torch.equal(out, reference)  # the quantized kernel really computed it...
    assert cosine(out, reference) >= 0.999  # ...and the result is the same picture

    # The input MODEL is untouched: no override, and sampling it again gives the unpatched result.
    assert overrides_of(t.patcher) == {}
    assert torch.equal(sample(t), reference)


def test_nodes_through_ksampler(tiny, pack, caplog):
    from sagetriton.nodes.ui.registry import NODE_CLASS_MAPPINGS

    import nodes as comfy_nodes

    t = tiny("flux")
    settings_node = NODE_CLASS_MAPPINGS["SageTritonSettings"]()
    patch_node = NODE_CLASS_MAPPINGS["SageTritonPatchModelAttention"]()
    defaults = {name: spec[1]["default"] for name, spec in settings_node.INPUT_TYPES()["required"].items()}
    (settings,) = settings_node.build(**{**defaults, "min_seq_len": 0, "qk_quant_gran": "per_thread"})
    (patched,) = patch_node.patch(t.patcher, settings, unique_id="42")

    latent = {"samples": t.latent}
    args = (7, 2, t.cfg, "euler", "simple", t.positive, t.negative, latent)
    (reference,) = comfy_nodes.KSampler().sample(t.patcher, *args)
    with caplog.at_level(logging.INFO, logger="SageTriton"):
        (out,) = comfy_nodes.KSampler().sample(patched, *args)

    run = stats.last_run()
    assert run["node_id"] == "42" and run["kernel"] > 0 and run["fallback"] == {}
    assert run["config"]["qk_quant_gran"] == "per_thread"
    assert "calls on the SageTriton kernel" in run["text"]
    ours = [r.getMessage() for r in caplog.records if r.name == "SageTriton"]
    assert ours == [f"[SageTriton] {run['text']}"]  # one line per run
    assert not notify_browser("42")  # no ComfyUI server in this process: nothing to tell
    assert cosine(out["samples"], reference["samples"]) >= 0.999


def test_patch_node_without_settings_uses_arch_defaults(tiny):
    from sagetriton.nodes.ui.patch_node import SageTritonPatchModelAttention

    t = tiny("wan21")
    (patched,) = SageTritonPatchModelAttention().patch(t.patcher)
    sample(t, patched, steps=1)
    run = stats.last_run()
    # The CPU (interpreter) row of the table: crossover 0, so the kernel takes every call.
    assert run["kernel"] > 0 and run["settings"] == SageSettings().as_dict()


def test_full_precision_first_and_last_steps_fall_back(tiny):
    t = tiny("flux")
    patched = patch_model(t.patcher, SageSettings(min_seq_len=0, full_precision_first_steps=1,
                                                  full_precision_last_steps=1))
    sample(t, patched, steps=3)
    run = stats.last_run()
    per_step = run["kernel"]  # only the middle step ran the kernel
    assert per_step > 0 and run["fallback"] == {"full-precision step": 2 * per_step}


def test_min_seq_len_routes_short_sequences(tiny):
    t = tiny("wan21")  # self-attention has 32 keys, cross-attention 8 text tokens
    patched = patch_model(t.patcher, SageSettings(min_seq_len=16))
    sample(t, patched, steps=1)
    run = stats.last_run()
    assert run["kernel"] > 0 and run["fallback"] == {"key length < 16": run["kernel"]}


def test_composes_with_an_existing_override_and_repatching_replaces(tiny):
    t = tiny("wan21")
    seen = []

    def other_pack_override(func, *args, **kwargs):
        seen.append(func.__name__)
        return func(*args, **kwargs)

    base = t.patcher.clone()
    base.model_options.setdefault("transformer_options", {})[OVERRIDE_KEY] = other_pack_override

    everything_falls_back = patch_model(base, SageSettings(min_seq_len=10**6))
    out = sample(t, everything_falls_back, steps=1)
    run = stats.last_run()
    assert run["kernel"] == 0 and len(seen) == sum(run["fallback"].values()) > 0
    assert cosine(out, sample(t, base, steps=1)) > 0.99999

    seen.clear()
    patched = patch_model(base, ALWAYS_KERNEL)
    sample(t, patched, steps=1)
    assert seen == [] and stats.last_run()["kernel"] > 0

    # A second patch node replaces the first one instead of stacking on it.
    repatched = patch_model(patched, SageSettings(min_seq_len=10**6))
    assert patch_state_of(repatched).previous_override is other_pack_override
    outer = repatched.wrappers["outer_sample"]
    assert len(outer[WRAPPER_KEY]) == 1
    assert overrides_of(base)[OVERRIDE_KEY] is other_pack_override  # inputs stay as they were


def test_rdna4_simulation_routes_fallbacks_to_math_sdpa_chunks(tiny, monkeypatch):
    t = tiny("wan21")
    reference = sample(t, steps=1)
    allowed = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa_spy(q, *args, **kwargs):
        b = torch.backends.cuda
        allowed.append((q.shape[-2], b.math_sdp_enabled(), b.flash_sdp_enabled() or b.mem_efficient_sdp_enabled()
                        or b.cudnn_sdp_enabled()))
        return real_sdpa(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa_spy)
    # Budget for 8 query rows of a (B=2, H=2, Lk=32) score matrix per chunk.
    patched = patch_model(t.patcher, SageSettings(), arch=RDNA4, score_budget_bytes=2 * 2 * 32 * 8 * 8)
    out = sample(t, patched, steps=1)

    run = stats.last_run()
    assert run["arch"] == "gfx1201" and run["kernel"] == 0
    assert run["fallback"] == {"key length < 1024": sum(run["fallback"].values())}
    assert allowed and all(math_on and not others_on for _, math_on, others_on in allowed)
    # One step, cond and uncond batched: self-attention (32 queries) in 4 chunks, cross-attention (8 keys) in one.
    assert sorted(rows for rows, _, _ in allowed) == [8, 8, 8, 8, 32]
    assert cosine(out, reference) > 0.9999


def test_older_comfyui_is_refused_with_the_minimum_version(tiny, monkeypatch):
    import comfy.ldm.modules.attention as attention

    monkeypatch.delattr(attention, "wrap_attn")  # what ComfyUI < 0.3.60 looks like
    with pytest.raises(RuntimeError, match=r"0\.3\.60"):
        patch_model(tiny("wan21").patcher)


def test_patch_survives_downstream_clones_and_leaves_other_models_alone(tiny):
    flux, wan = tiny("flux"), tiny("wan21")
    patched = patch_model(wan.patcher, ALWAYS_KERNEL)
    downstream = patched.clone()  # what every later model node (LoRA, model sampling, ...) does
    downstream.model_options["transformer_options"]["some_other_pack"] = True
    sample(wan, downstream, steps=1)
    assert stats.last_run()["kernel"] > 0

    before = stats.attention_stats()
    sample(flux, steps=1)  # another MODEL of the same graph: never routed through us
    assert stats.attention_stats() == before


def test_install_report_sets_crossover_and_avoids_failed_variants(tiny, no_install_report):
    from sagetriton.kernels.arch import CPU_ARCH

    report = no_install_report
    measured = report.new_report(report.report_key(CPU_ARCH))
    # wan21: 2 x 2 heads x 32² in self-attention (more work than 48 x 9²), 8 text tokens in cross-attention.
    measured["crossover"] = {"seq_len": 9}
    measured["disabled_variants"] = [report.variant_name("per_warp", "fp16", "fp32")]  # the CPU row's default
    report.save_report(measured)

    t = tiny("wan21")
    sample(t, patch_model(t.patcher), steps=1)
    run = stats.last_run()
    assert run["kernel"] > 0 and run["fallback"] == {"key length < 9": run["kernel"]}
    assert run["config"]["qk_quant_gran"] != "per_warp"
    assert any("failed the install self-test" in note for note in run["notes"])


def test_a_run_too_short_for_the_kernel_says_to_leave_the_model_unpatched(tiny):
    """Every call shorter than the crossover (SDXL at 1024² on an H200): the patch only costs host time,
    and the run's summary says so; a run where some calls took the kernel does not."""
    from sagetriton.nodes.reporting.run_summary import UNPATCH_HINT

    t = tiny("sd15")
    sample(t, patch_model(t.patcher, SageSettings(min_seq_len=1 << 20)), steps=1)
    run = stats.last_run()
    assert run["kernel"] == 0 and run["fallback_total"] > 0 and UNPATCH_HINT in run["text"]
    sample(t, patch_model(t.patcher, SageSettings(min_seq_len=0)), steps=1)
    assert stats.last_run()["kernel"] > 0 and UNPATCH_HINT not in stats.last_run()["text"]
