"""Conformance with current ComfyUI's attention calling conventions (0.38.x), on the CPU.

The tested ComfyUI (0.3.64) predates q, k, v containers, so this file carries its own emulation of
the current ``wrap_attn`` as its source documents it (written here, not copied): q, k, v may arrive
as single-owner holders (``peek``/``take``); an override with a ``container_function`` attribute is
called as ``container_function(*args, **kwargs)`` with the holders and no ``func``; any other override
gets the taken tensors as ``override(func, *args, **kwargs)``; ``_inside_attn_wrapper`` marks calls made
from inside. Every call convention is replayed through the Patch node's override, the kernel runs in
the Triton interpreter, and the result is compared with exact attention.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
from attention_cases import comfy_args, exact_attention, random_qkv, reference_backend
from current_comfy import Holder, PreferredAttentionLayer, current_wrap_attn, layer_config_tensor
from sagetriton.kernels import api, failures, host
from sagetriton.kernels.reference import cosine
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.routing import containers, dispatch
from sagetriton.nodes.routing.dispatch import PatchState
from sagetriton.nodes.routing.override import make_attention_override

ALWAYS_KERNEL = SageSettings(min_seq_len=0)


global_backend = current_wrap_attn(reference_backend)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    reference_backend.calls = 0
    failures.reset()
    monkeypatch.setattr(containers, "comfy_backend", lambda: global_backend)  # the emulated ComfyUI's global
    yield
    failures.reset()


def patched_options(settings=ALWAYS_KERNEL, previous=None):
    state = PatchState(settings, previous_override=previous)
    state.begin_run()
    return state, {"optimized_attention_override": make_attention_override(state)}


def model_call(q, k, v, heads, options, skip_reshape, skip_output_reshape=False, use_holders=True, **extra):
    """One attention call as a current model makes it (projections -> holders -> the global backend)."""
    args = comfy_args(q, k, v, skip_reshape)
    if use_holders:
        args = tuple(Holder(t) for t in args)
    out = global_backend(*args, heads, skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape,
                         transformer_options=options, preferred_attention=None, **extra)
    if use_holders:
        assert all(h.tensor is None for h in args), "every holder must be consumed, as the protocol expects"
    return out


def as_bhld(out, skip_output_reshape, heads):
    if skip_output_reshape:
        return out
    b, lq, width = out.shape
    return out.view(b, lq, heads, width // heads).transpose(1, 2)


CONVENTIONS = [  # (skip_reshape, skip_output_reshape, kv_heads, extra kwargs)
    (True, False, 4, {}),
    (True, True, 4, {"scale": 0.2}),
    (False, False, 4, {}),
    (False, True, 4, {"scale": 0.05}),
    (True, False, 2, {"enable_gqa": True}),
    (True, True, 1, {"enable_gqa": True, "scale": 0.1}),
    (False, False, 2, {"enable_gqa": True}),  # GQA in (B, L, H·D): k and v are narrower than q
    (False, True, 1, {"enable_gqa": True, "scale": 0.3}),
]


@pytest.mark.parametrize("use_holders", [True, False], ids=["containers", "tensors"])
@pytest.mark.parametrize("skip_reshape,skip_output_reshape,kv_heads,extra", CONVENTIONS)
def test_every_convention_matches_exact_attention(seed, use_holders, skip_reshape, skip_output_reshape, kv_heads,
                                                  extra):
    q, k, v = random_qkv(b=1, h=4, lq=40, lk=72, d=32, kv_heads=kv_heads)
    state, options = patched_options()
    for _ in range(2):  # the first call of a variant keeps the floats, the second drops them early
        out = model_call(q, k, v, 4, options, skip_reshape, skip_output_reshape, use_holders, **extra)
        assert cosine(as_bhld(out, skip_output_reshape, 4), exact_attention(q, k, v, scale=extra.get("scale"))) \
            >= 0.999
    assert state.run.kernel == 2 and reference_backend.calls == 0


@pytest.mark.parametrize("use_holders", [True, False], ids=["containers", "tensors"])
@pytest.mark.parametrize("skip_reshape", [True, False])
def test_exact_layers_go_to_comfyui_unquantized(seed, use_holders, skip_reshape):
    q, k, v = random_qkv(b=1, h=4, lq=24, lk=24, d=32, kv_heads=2)
    state, options = patched_options()
    out = model_call(q, k, v, 4, options, skip_reshape, False, use_holders, enable_gqa=True,
                     low_precision_attention=False)
    assert reference_backend.calls == 1 and state.run.kernel == 0
    assert dict(state.run.fallback) == {"accuracy-critical call (low_precision_attention=False)": 1}
    torch.testing.assert_close(as_bhld(out, False, 4), exact_attention(q, k, v).to(q.dtype), rtol=0, atol=0)


def test_fallback_keeps_an_earlier_container_backend_untaken(seed):
    """A backend installed before us (core's Model Attention Backend with comfy-kitchen) gets the holders
    themselves for the calls we do not take, so its own early release still works."""
    seen = []

    def kitchen_like(q, k, v, heads, **kwargs):
        seen.append(all(isinstance(t, Holder) for t in (q, k, v)))
        return reference_backend(q.take(), k.take(), v.take(), heads, **kwargs)

    def previous(_func, *args, **kwargs):  # what set_model_optimized_attention installs
        return reference_backend(*args, **kwargs)

    previous.container_function = kitchen_like
    q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=32)
    state, options = patched_options(SageSettings(min_seq_len=64), previous=previous)
    out = model_call(q, k, v, 2, options, True, True)
    assert seen == [True] and dict(state.run.fallback) == {"key length < 64": 1}
    torch.testing.assert_close(out, exact_attention(q, k, v).to(q.dtype), rtol=0, atol=0)


def test_the_kernel_path_frees_the_floats_before_the_attention_kernel(monkeypatch, seed):
    """Handed over in holders, q and k (and v once converted to 8 bits) are gone when the attention kernel
    is launched; passed as tensors, the caller keeps them."""
    alive = []
    real = host._launch_attention

    def spy(plan, qz, *a, **kw):
        gc.collect()
        alive.append(tuple(r() is not None for r in refs))
        return real(plan, qz, *a, **kw)

    monkeypatch.setattr(host, "_launch_attention", spy)
    settings = SageSettings(min_seq_len=0, pv_precision="int8")
    state, options = patched_options(settings)
    for _ in range(2):
        q, k, v = random_qkv(b=1, h=2, lq=32, lk=32, d=32)
        expected = exact_attention(q, k, v)
        holders = tuple(Holder(t) for t in (q, k, v))
        refs = [weakref.ref(t) for t in (q, k, v)]
        del q, k, v
        out = global_backend(*holders, 2, skip_reshape=True, skip_output_reshape=True, transformer_options=options)
        assert cosine(out, expected) >= 0.99
    # First call of the variant: kept (a compile error could still fall back); then released.
    assert alive == [(True, True, True), (False, False, False)]
    assert state.run.kernel == 2


def test_layers_with_a_preferred_attention_are_overridden_and_reported(seed, comfyui_path):
    """Current core: a checkpoint can name a layer's attention (comfy-kitchen INT8); core runs it unless
    the model has an override, and drops the preference before calling the override. The Patch node
    overrides such layers and says so in the run summary."""
    import comfy.model_patcher
    from sagetriton.nodes.patching import patch_model, patch_state_of
    from sagetriton.nodes.reporting.run_summary import finish_run

    kitchen_calls = []

    def kitchen_int8(*args, **kwargs):  # the layer's preferred backend on this emulated machine
        kitchen_calls.append(1)
        return reference_backend(*args, **kwargs)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.diffusion_model = torch.nn.ModuleList(
                [PreferredAttentionLayer({"comfy_kitchen_int8": kitchen_int8}) for _ in range(3)])

    model = Model()
    checkpoint = {f"diffusion_model.{i}.config": layer_config_tensor({"attention": "comfy_kitchen_int8"})
                  for i in range(2)}  # two of the three layers name it
    model.load_state_dict(checkpoint)
    layer = model.diffusion_model[0]
    assert layer.function is kitchen_int8 and model.diffusion_model[2].function is None
    patcher = comfy.model_patcher.ModelPatcher(model, torch.device("cpu"), torch.device("cpu"))

    q, k, v = random_qkv(b=1, h=4, lq=24, lk=24, d=32)
    args = comfy_args(q, k, v, True)
    global_backend(*args, 4, skip_reshape=True, transformer_options={}, preferred_attention=layer)
    assert len(kitchen_calls) == 1  # unpatched, core runs the layer's own backend

    patched = patch_model(patcher, ALWAYS_KERNEL)
    state = patch_state_of(patched)
    state.begin_run()
    out = global_backend(*args, 4, skip_reshape=True, transformer_options=patched.model_options["transformer_options"],
                         preferred_attention=layer)
    assert len(kitchen_calls) == 1 and state.run.kernel == 1  # the override took the call
    assert cosine(as_bhld(out, False, 4), exact_attention(q, k, v)) >= 0.999
    summary = finish_run(state)
    assert summary["preferred_overridden"] == {"comfy_kitchen_int8": 2}
    assert "overrode the checkpoint's preferred attention of 2 layers (comfy_kitchen_int8)" in summary["text"]


@pytest.mark.parametrize("case", ["bad scale", "past the checks"])
def test_a_callers_bad_arguments_in_containers_turn_nothing_off(case):
    """Issue 49 item 3 on the container path: a NaN scale is refused by the checks, 65,536 heads of one
    channel by ``sageattn`` before any launch (the grid limit); both go to ComfyUI's attention, nothing is disabled."""
    heads = api.GRID_Y_LIMIT + 1 if case == "past the checks" else 2
    q, k, v = random_qkv(b=1, h=heads, lq=4, lk=4, d=1 if case == "past the checks" else 32)
    state, options = patched_options()
    extra = {"scale": float("nan")} if case == "bad scale" else {}
    model_call(q, k, v, heads, options, True, True, **extra)
    reason = dispatch.BAD_SCALE if case == "bad scale" else dispatch.REFUSED_ARGUMENTS
    assert reference_backend.calls == 1 and state.run.kernel == 0 and list(state.run.fallback) == [reason]
    assert dispatch.disabled_variants() == {}
