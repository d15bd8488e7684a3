"""The models people run now (issue 32), each a tiny random-weight model built through ComfyUI's own
model classes and sampled by ComfyUI's samplers, unpatched and through Patch Model Attention.

Per family: every attention call ComfyUI makes reaches the kernel with its mask (or falls back for
the reason it should), each call is within one call's accuracy of ComfyUI's own attention on the same
inputs, and so is the sampled output (tolerances in ``model_checks``). The kernel runs through the
Triton interpreter with min_seq_len=0, so every eligible call takes it.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import tiny_models
import torch
from model_checks import KernelSpy, assert_calls_close, assert_close, check_every_call, without_masks
from sagetriton.kernels.arch import arch_from_properties
from sagetriton.kernels.reference import rel_l1
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model, patch_state_of
from sagetriton.nodes.reporting import stats
from tiny_models import sample

pytestmark = pytest.mark.usefixtures("comfyui_path", "no_install_report")

ALWAYS_KERNEL = SageSettings(min_seq_len=0)
STEPS = 1  # every attention call of a forward, at the interpreter's cost of one forward


def comfyui_version() -> str:
    try:
        from comfyui_version import __version__
    except ImportError:
        return "unknown"
    return __version__


# The ComfyUI model class each family is built through.
MODEL_CLASSES = {"qwen_image": "QwenImage", "ltxv": "LTXV", "wan22_5b": "WAN22_T2V", "wan22_14b_experts": "WAN21_T2V",
                 "chroma": "Chroma", "flux_kontext": "Flux", "sd35": "SD3", "aura_flow": "AuraFlow",
                 "sd15_real_heads": "SD15", "flux2": "Flux2", "z_image": "ZImage"}
# The first ComfyUI tested here that has the class (0.3.64 has the others).
NEWER = {"Flux2": "0.3.75", "ZImage": "0.3.75"}


def build(family: str):
    import comfy.supported_models

    needed = MODEL_CLASSES[family]
    if not hasattr(comfy.supported_models, needed):
        pytest.skip(f"ComfyUI {comfyui_version()} has no {needed} model class; {NEWER.get(needed, '0.3.64')} has it")
    return getattr(tiny_models, f"tiny_{family}")()


def run_patched(t, monkeypatch, pack, settings=ALWAYS_KERNEL, steps=STEPS, node_id=None):
    """Sample the patched model; returns (output, ComfyUI's calls as checked, kernel spy, run summary)."""
    patched = patch_model(t.patcher, settings, node_id=node_id)
    checked = check_every_call(patched)
    spy = KernelSpy(monkeypatch, pack)
    out = sample(t, patched, steps=steps)
    return out, checked, spy, stats.last_run()


def assert_all_on_kernel(checked, spy, run, what: str) -> None:
    assert run["kernel"] == len(spy.calls) == len(checked) > 0 and run["fallback"] == {}, run["text"]
    # The very calls ComfyUI made, masks included, are the ones the kernel ran.
    assert sorted(spy.calls, key=repr) == sorted((c.call for c in checked), key=repr), what


# family -> (head sizes, key lengths) the kernel must see
FAMILIES = {
    "qwen_image": ({128}, {24}),  # one joint text-image attention: 8 text + 16 image tokens
    "ltxv": ({64}, {32, 8}),  # self-attention over 2x4x4 video tokens; cross-attention to 8 text tokens, masked
    "wan22_5b": ({128}, {16, 8}),  # the 48-channel Wan 2.2 latent: self- and cross-attention
    "chroma": ({128}, {24}),
    "flux_kontext": ({128}, {40}),  # 8 text + 16 image + 16 reference-latent tokens
    "sd35": ({64}, {24, 16}),  # joint attention, and MMDiT-X's extra self-attention on the image tokens
    "aura_flow": ({256}, {32}),  # 8 register + 8 text + 16 image tokens
    "flux2": ({128}, {528}),  # ComfyUI pads Flux.2's text to 512 tokens; 16 image tokens (patch size 1)
    "z_image": ({128}, {32, 64}),  # the refiners on text and on image tokens, each padded to 32; then both
}

# Families whose every attention call follows a RoPE through comfy.ldm.flux.math (on every ComfyUI that has them).
ROPE_EVERY_CALL = {"flux2", "z_image"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_samples_like_the_unpatched_model(family, monkeypatch, pack):
    t = build(family)
    head_dims, k_lens = FAMILIES[family]
    reference = sample(t, steps=STEPS)

    out, checked, spy, run = run_patched(t, monkeypatch, pack)

    assert_all_on_kernel(checked, spy, run, family)
    assert {c.head_dim for c in spy.calls} == head_dims
    assert {c.k_len for c in spy.calls} == k_lens
    assert_calls_close(checked, family, spy.bounds)
    assert_close(out, reference, family, spy.bounds)
    if t.masks:  # the mask reached the kernel and matters there
        assert spy.masked and any(c.mask_effect > 0 for c in checked)
    if family in ROPE_EVERY_CALL:  # ComfyUI's RoPE before each attention call ran in the pack's kernel
        assert run["rope"] == len(checked), run["text"]


GPUS = {"sm90": SimpleNamespace(name="NVIDIA H200", major=9, minor=0),
        "sm89": SimpleNamespace(name="NVIDIA GeForce RTX 4090", major=8, minor=9),
        "gfx1100": SimpleNamespace(name="AMD Radeon RX 7900 XTX", gcnArchName="gfx1100")}


def test_head_dim_256_routes_to_the_narrow_tile(monkeypatch, pack):
    """AuraFlow's head_dim 256 is the widest the kernel takes. Its calls reach the kernel here, and the
    plan each GPU would run them with keeps the fp32 accumulator in registers: 64-row tiles of 4 warps
    (32 keys per tile on AMD)."""
    t = build("aura_flow")
    patched = patch_model(t.patcher, ALWAYS_KERNEL)
    spy = KernelSpy(monkeypatch, pack)
    sample(t, patched, steps=STEPS)
    assert {c.head_dim for c in spy.calls} == {256} and stats.last_run()["fallback"] == {}

    planner = patch_state_of(patched).planner
    for gpu, props in GPUS.items():
        arch = arch_from_properties(props, is_hip=gpu.startswith("gfx"))
        narrow = planner.plan(arch, 256).config
        assert (narrow.block_m, narrow.num_warps) == (64, 4), (gpu, narrow)
        assert narrow.block_n == (32 if arch.vendor == "amd" else 64), (gpu, narrow)


@pytest.mark.slow  # 4 heads at three head sizes: about a minute in the interpreter on 2 cores
def test_sd15_head_sizes_40_80_160(monkeypatch, pack):
    """SD1.5's head sizes are not powers of two (the kernel pads them to 64/128/256). The text
    cross-attention (2 tokens here) is put below min_seq_len: those calls must fall back, for that
    reason, while the 4-token self-attention of the 160-wide level still takes the kernel."""
    t = build("sd15_real_heads")
    g = torch.Generator().manual_seed(3)
    t.positive, t.negative = ([[torch.randn(1, 2, tiny_models.TEXT_DIM, generator=g), {}]] for _ in range(2))
    reference = sample(t, steps=STEPS)

    out, checked, spy, run = run_patched(t, monkeypatch, pack, SageSettings(min_seq_len=3))

    cross = [c for c in checked if c.call.k_len == 2]
    assert {c.head_dim for c in spy.calls} == {40, 80, 160}
    assert run["kernel"] == len(spy.calls) == len(checked) - len(cross) > 0
    assert run["fallback"] == {"key length < 3": len(cross)} and cross
    assert_calls_close([c for c in checked if c not in cross], "sd15", spy.bounds)
    assert all(c.rel_l1 == 0 for c in cross)  # ComfyUI's own attention ran them
    assert_close(out, reference, "sd15", spy.bounds)


def test_sd2_fp32_attention_falls_back_bit_exact(monkeypatch, pack):
    """SD2.x asks for fp32 attention (ComfyUI's SD20 config: its fp16 attention overflows): every call
    must go to ComfyUI's own attention, which then gives exactly the unpatched result."""
    cfg = tiny_models._unet_config(64, tiny_models.TEXT_DIM, None, True, transformer_depth=(1, 1))
    patcher = tiny_models._build("SD20", cfg, torch.float16, 0)
    assert patcher.model.model_config.unet_config["attn_precision"] == torch.float32  # ComfyUI's own setting
    like = tiny_models.tiny_sd15()  # conditioning and latent of the same shapes
    t = tiny_models.TinyModel("sd2", patcher, like.latent, like.positive, like.negative, (64,))
    reference = sample(t, steps=STEPS)

    out, checked, spy, run = run_patched(t, monkeypatch, pack)

    assert spy.calls == [] and run["kernel"] == 0 and checked
    assert run["fallback"] == {"fp32 attn_precision requested": len(checked)}
    assert torch.equal(out, reference)


# --- Masks: they reach the kernel, and the patched output follows the masked model ---------------------------

def _qwen_image_with_text_mask():
    t = tiny_models.tiny_qwen_image()
    for cond in (t.positive, t.negative):
        cond[0][1]["attention_mask"] = tiny_models._text_mask(5)
    t.masks = True
    return t


MASKED = {
    "ltxv": lambda: build("ltxv"),  # text padding mask in cross-attention
    "qwen_image": _qwen_image_with_text_mask,
}


@pytest.mark.parametrize("family", list(MASKED))
def test_masks_are_never_dropped(family, monkeypatch, pack):
    t = MASKED[family]()
    reference = sample(t, steps=STEPS)
    mask_effect = rel_l1(sample(without_masks(t), steps=STEPS), reference)
    if mask_effect == 0:
        pytest.skip(f"ComfyUI {comfyui_version()}'s {family} model does not pass the text mask to attention, "
                    "so there is nothing to drop; needs a ComfyUI whose model applies it")

    out, checked, spy, run = run_patched(t, monkeypatch, pack)

    assert_all_on_kernel(checked, spy, run, family)
    masked = [c for c in checked if c.call.masked]
    assert masked and spy.masked == len(masked)
    # Each masked call: close to the masked result, far from the unmasked one.
    assert_calls_close(checked, family, spy.bounds)
    # The whole sample too: the kernel's error is far below what dropping the mask would change.
    assert rel_l1(out, reference) < mask_effect / 5, (rel_l1(out, reference), mask_effect)


# --- Large activations: Qwen-Image's values beyond fp16's range ----------------------------------------------

@pytest.mark.parametrize("choice", [{"pv_accum_dtype": "fp32"}, {"pv_accum_dtype": "fp16"}, {"pv_precision": "int8"},
                                    {"pv_precision": "fp8"}], ids=lambda c: "-".join(c.values()))
def test_qwen_image_values_beyond_fp16_range(choice, monkeypatch, pack):
    """Qwen-Image's text stream carries activations past fp16's 65504 in bf16 (users' black images with
    fp16 P·V accumulation). With the text values scaled there, every call stays as close as on ordinary
    inputs: with fp16 accumulation too, and with 8-bit P·V."""
    t = build("qwen_image")
    attn = t.patcher.model.diffusion_model.transformer_blocks[0].attn
    with torch.no_grad():
        attn.add_v_proj.weight.mul_(3e5)
        attn.add_v_proj.bias.mul_(3e5)
    largest_v = []
    real_proj = attn.add_v_proj.forward

    def text_values(x):
        v = real_proj(x)
        largest_v.append(v.abs().max().item())
        return v

    monkeypatch.setattr(attn.add_v_proj, "forward", text_values)
    reference = sample(t, steps=STEPS)
    assert max(largest_v) > 65504  # the text values really are out of fp16's range

    out, checked, spy, run = run_patched(t, monkeypatch, pack, SageSettings(min_seq_len=0, **choice))

    assert_all_on_kernel(checked, spy, run, "qwen_image")
    assert_calls_close(checked, f"qwen_image, {choice}", spy.bounds)
    assert_close(out, reference, f"qwen_image, {choice}", spy.bounds)


# --- Wan 2.2 A14B: two experts, two Patch nodes, two KSamplerAdvanced ----------------------------------------

def test_wan22_two_experts_sampled_in_sequence(monkeypatch, pack):
    """ComfyUI's Wan 2.2 14B template: the high-noise expert denoises the first steps and hands its
    latent with the leftover noise to the low-noise expert. Each expert has its own Patch node, and each
    node reports its own expert's calls."""
    import nodes as comfy_nodes

    high, low = build("wan22_14b_experts")
    steps, switch = 2, 1

    def two_experts(high_model, low_model):
        sampler = comfy_nodes.KSamplerAdvanced()
        (mid,) = sampler.sample(high_model, "enable", 7, steps, high.cfg, "euler", "simple", high.positive,
                                high.negative, {"samples": high.latent}, 0, switch, "enable")
        (out,) = sampler.sample(low_model, "disable", 7, steps, low.cfg, "euler", "simple", low.positive,
                                low.negative, mid, switch, 10000, "disable")
        return out["samples"]

    reference = two_experts(high.patcher, low.patcher)
    patched = {"high": patch_model(high.patcher, ALWAYS_KERNEL, node_id="high"),
               "low": patch_model(low.patcher, ALWAYS_KERNEL, node_id="low")}
    checked = {node: check_every_call(model) for node, model in patched.items()}
    spy = KernelSpy(monkeypatch, pack)
    out = two_experts(patched["high"], patched["low"])

    runs = stats.runs_by_node()
    for node in ("high", "low"):  # one step each: self- and cross-attention of its one block
        assert runs[node]["kernel"] == len(checked[node]) == 2 and runs[node]["fallback"] == {}, runs[node]["text"]
        assert_calls_close(checked[node], f"wan 2.2 {node}-noise expert", spy.bounds)
    assert len(spy.calls) == 4
    assert_close(out, reference, "wan 2.2 two experts", spy.bounds)
    # The experts really differ: the result is not what the high-noise expert alone would give.
    assert rel_l1(two_experts(high.patcher, high.patcher), reference) > 0.01
