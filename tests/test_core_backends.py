"""ComfyUI's attention registry and the backend a Patch node replaces, on the tested ComfyUI (0.3.64).

0.3.64 has the registry (``register_attention_function`` / ``get_attention_function``) but neither
per-model backends nor core's "Model Attention Backend" node; those are emulated from the current
source's documented behaviour (``current_comfy``). The kernel runs through the Triton interpreter.
"""
from __future__ import annotations

import pytest
import torch
from attention_cases import exact_attention, random_qkv
from current_comfy import Holder, current_wrap_attn, set_model_optimized_attention
from sagetriton.kernels.reference import cosine
from sagetriton.nodes import core_backends
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model, patch_state_of
from sagetriton.nodes.reporting import run_summary, stats
from sagetriton.nodes.routing import containers


@pytest.fixture
def comfy(comfyui_path):
    import comfy.ldm.modules.attention as attention
    import comfy.model_patcher

    return attention, comfy.model_patcher


def tiny_patcher(model_patcher):
    return model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))


def call_through(attention, patcher, q, k, v, heads=2, **kw):
    """One attention call as a model makes it: ComfyUI's global backend, the patcher's transformer_options."""
    options = patcher.model_options.get("transformer_options", {})
    return attention.optimized_attention(q, k, v, heads, skip_reshape=True, skip_output_reshape=True,
                                         transformer_options=options, **kw)


def test_the_pack_registers_sagetriton_in_comfyuis_registry(comfy, seed):
    attention, _ = comfy
    func = attention.get_attention_function("sagetriton")
    assert core_backends.register_with_core() == "sagetriton"  # a second import does not register twice
    assert attention.get_attention_function("sagetriton") is func
    q, k, v = random_qkv(b=1, h=2, lq=24, lk=24, d=32)
    before = stats.attention_stats()["kernel"]
    out = func(q, k, v, 2, skip_reshape=True, skip_output_reshape=True)  # the kernel's default on CPU: every call
    assert stats.attention_stats()["kernel"] == before + 1
    assert cosine(out, exact_attention(q, k, v)) >= 0.999


def test_core_backend_node_can_pick_sagetriton_by_name_incl_containers(comfy, seed, monkeypatch):
    """What "Model Attention Backend" does with a registered name: the per-model override it installs runs
    our kernel, for tensors and for current ComfyUI's holders (through the copied container_function)."""
    attention, model_patcher = comfy
    patcher = tiny_patcher(model_patcher)
    set_model_optimized_attention(patcher, attention.get_attention_function("sagetriton"))
    q, k, v = random_qkv(b=1, h=2, lq=24, lk=24, d=32)
    before = stats.attention_stats()["kernel"]
    out = call_through(attention, patcher, q, k, v)
    assert cosine(out, exact_attention(q, k, v)) >= 0.999
    current_global = current_wrap_attn(attention.optimized_attention.__wrapped__)
    holders = tuple(Holder(t) for t in (q, k, v))
    out = current_global(*holders, 2, skip_reshape=True, skip_output_reshape=True,
                         transformer_options=patcher.model_options["transformer_options"])
    assert all(h.tensor is None for h in holders)
    assert cosine(out, exact_attention(q, k, v)) >= 0.999
    assert stats.attention_stats()["kernel"] == before + 2


class Spy:
    def __init__(self, func):
        self.func, self.calls = func, 0
        self.__name__ = "spy"

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.func(*args, **kwargs)


def test_patch_node_replaces_a_per_model_backend_and_falls_back_on_it(comfy, seed):
    attention, model_patcher = comfy
    base = tiny_patcher(model_patcher)
    pytorch = Spy(attention.get_attention_function("pytorch"))
    set_model_optimized_attention(base, pytorch)
    patched = patch_model(base, SageSettings(min_seq_len=64))
    state = patch_state_of(patched)
    assert state.composition["replaced"] == "spy, set per model (Model Attention Backend node)"
    set_model_optimized_attention(base, attention.get_attention_function("pytorch"))
    patched = patch_model(base, SageSettings(min_seq_len=64))
    state = patch_state_of(patched)
    assert state.composition == {"replaced": "pytorch, set per model (Model Attention Backend node)",
                                 "fallback": "pytorch, set per model (Model Attention Backend node)",
                                 "backend": "SageTriton"}
    # Short calls go to the backend the model had: the spied one.
    spied = patch_model(tiny_patcher(model_patcher), SageSettings(min_seq_len=64))
    set_model_optimized_attention(spied, pytorch)
    spied = patch_model(spied, SageSettings(min_seq_len=64))
    patch_state_of(spied).begin_run()
    q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=32)
    out = call_through(attention, spied, q, k, v)
    assert pytorch.calls == 1
    torch.testing.assert_close(out, exact_attention(q, k, v).to(q.dtype), rtol=2e-3, atol=2e-3)
    summary = run_summary.finish_run(patch_state_of(spied))
    assert "fallbacks run on spy, set per model (Model Attention Backend node)" \
        in summary["text"]


def test_the_replaced_backend_is_named_for_the_global_flag_and_other_overrides(comfy):
    attention, model_patcher = comfy
    registry = attention.REGISTERED_ATTENTION_FUNCTIONS
    global_name = core_backends.registry_name_of(attention.optimized_attention, registry)
    assert global_name is not None  # on CPU: sub_quad or pytorch, whichever ComfyUI chose
    state = patch_state_of(patch_model(tiny_patcher(model_patcher), SageSettings(fallback="sdpa")))
    assert state.composition == {"replaced": f"ComfyUI's global attention ({global_name})",
                                 "fallback": "PyTorch SDPA (Sage Settings fallback=sdpa)", "backend": "SageTriton"}

    def other_pack_override(func, *args, **kwargs):
        return func(*args, **kwargs)

    base = tiny_patcher(model_patcher)
    base.model_options["transformer_options"]["optimized_attention_override"] = other_pack_override
    state = patch_state_of(patch_model(patch_model(base)))  # a second Patch node replaces the first, not stacks
    assert state.previous_override is other_pack_override
    assert state.composition["replaced"] == ("another node's override "
                                             f"({__name__}.test_the_replaced_backend_is_named_for_the_global_flag_and"
                                             "_other_overrides.<locals>.other_pack_override)")


def test_container_fallback_without_a_previous_override_uses_the_global_backend(comfy, seed, monkeypatch):
    """No ``func`` comes with holders: the fallback is ComfyUI's global attention, holders taken first
    where the global backend (as on 0.3.64) knows nothing of them."""
    attention, model_patcher = comfy
    spy = Spy(attention.optimized_attention)
    monkeypatch.setattr(containers, "comfy_backend", lambda: spy)
    patched = patch_model(tiny_patcher(model_patcher), SageSettings(min_seq_len=64))
    patch_state_of(patched).begin_run()
    q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=32)
    current_global = current_wrap_attn(attention.optimized_attention.__wrapped__)
    out = current_global(*(Holder(t) for t in (q, k, v)), 2, skip_reshape=True, skip_output_reshape=True,
                         transformer_options=patched.model_options["transformer_options"])
    assert spy.calls == 1
    torch.testing.assert_close(out, exact_attention(q, k, v).to(q.dtype), rtol=2e-3, atol=2e-3)
