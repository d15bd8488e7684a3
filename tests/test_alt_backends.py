"""Sage Settings' ``backend`` choice: the kernel's calls on another attention, or SageTriton with a fix named.

SDPA runs everywhere; SageAttention and comfy-kitchen run where installed and usable (skipped, saying
why, elsewhere: comfy-kitchen's INT8 attention needs a CUDA or ROCm GPU).
"""
from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from attention_cases import exact_attention, random_qkv, reference_backend
from sagetriton.kernels import api
from sagetriton.kernels.reference import cosine
from sagetriton.nodes import patching
from sagetriton.nodes.backends import alt_backends
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model, patch_state_of
from sagetriton.nodes.reporting import run_summary


@pytest.fixture
def patcher(comfyui_path):
    import comfy.model_patcher

    reference_backend.calls = 0

    return comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))


def run_once(patched, q, k, v, heads, **kw):
    state = patch_state_of(patched)
    state.begin_run()
    override = patched.model_options["transformer_options"]["optimized_attention_override"]
    out = override(reference_backend, q, k, v, heads, skip_reshape=True, skip_output_reshape=True,
                   transformer_options={}, _inside_attn_wrapper=True, **kw)
    return out, run_summary.finish_run(state)


def test_settings_reject_an_unknown_backend():
    with pytest.raises(ValueError, match="backend='flash' is not one of SageTriton, SageAttention, comfy-kitchen"):
        SageSettings(backend="flash")


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_backend_takes_the_kernels_calls(patcher, monkeypatch, seed, kv_heads):
    def no_kernel(*a, **k):
        raise AssertionError("SageTriton's kernel must not run with backend=SDPA")

    monkeypatch.setattr(api, "attention_forward", no_kernel)
    patched = patch_model(patcher, SageSettings(min_seq_len=0, backend="SDPA"))
    q, k, v = random_qkv(b=1, h=4, lq=24, lk=40, d=32, kv_heads=kv_heads)
    out, summary = run_once(patched, q, k, v, 4, scale=0.2, enable_gqa=kv_heads != 4)
    assert summary["kernel"] == 1 and reference_backend.calls == 0
    assert "calls on the SDPA kernel" in summary["text"]
    assert cosine(out, exact_attention(q, k, v, scale=0.2)) >= 0.99999


def test_a_backend_that_is_not_installed_runs_sagetriton_and_names_the_fix(patcher, monkeypatch, caplog, seed):
    # An NVIDIA machine without the library: installing it is the fix. (The kernels run in the interpreter.)
    monkeypatch.setattr(patching, "machine_vendor", lambda: "nvidia")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sageattention" else find_spec(name, *a))
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        patched = patch_model(patcher, SageSettings(min_seq_len=0, backend="SageAttention"))
    assert "pip install sageattention" in caplog.text and "SageTriton runs instead" in caplog.text
    q, k, v = random_qkv(b=1, h=2, lq=24, lk=24, d=32)
    out, summary = run_once(patched, q, k, v, 2)
    assert "calls on the SageTriton kernel" in summary["text"]
    assert summary["notes"][0].endswith("SageAttention unavailable here → SageTriton"), summary["notes"]
    assert cosine(out, exact_attention(q, k, v)) >= 0.999


@pytest.mark.parametrize("backend", ["SageAttention", "comfy-kitchen"])
def test_without_a_gpu_a_gpu_backend_says_what_runs_instead_and_gives_no_install_advice(
        patcher, monkeypatch, caplog, backend):
    """A CPU install (no Triton interpreter): the calls run on ComfyUI's attention, and that is what the
    log, the run summary (the Patch node's panel) and /sage/status (the Sage Settings node's) say."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    monkeypatch.delenv("TRITON_INTERPRET")
    short = f"{backend} unavailable here → ComfyUI"
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        patched = patch_model(patcher, SageSettings(min_seq_len=0, backend=backend))
    assert "computes on its CPU. ComfyUI's own attention runs instead." in caplog.text, caplog.text
    assert "pip install" not in caplog.text
    q, k, v = random_qkv(b=1, h=2, lq=24, lk=24, d=32)
    _, summary = run_once(patched, q, k, v, 2)
    assert summary["kernel"] == 0 and summary["notes"][0].endswith(short), summary
    assert short in summary["text"]
    from sagetriton.nodes.reporting.status_route import status_payload

    shown = status_payload()["backends"]
    assert shown[backend] == {"ok": False, "why": alt_backends.unavailable_reason(backend), "short": short}
    assert shown["SageTriton"]["ok"] and shown["SDPA"]["ok"]


find_spec = importlib.util.find_spec


@pytest.mark.parametrize("backend", ["SageAttention", "comfy-kitchen"])
def test_installed_backends_run_the_kernels_calls(patcher, seed, backend):
    why = alt_backends.unavailable_reason(backend)
    if why is not None:
        pytest.skip(why)
    patched = patch_model(patcher, SageSettings(min_seq_len=0, backend=backend))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v = (t.to(device) for t in random_qkv(b=1, h=4, lq=256, lk=256, d=64, kv_heads=2))
    out, summary = run_once(patched, q, k, v, 4, enable_gqa=True)
    assert f"calls on the {backend} kernel" in summary["text"] and summary["kernel"] == 1
    assert cosine(out, exact_attention(q, k, v)) >= 0.995


def test_comfy_kitchen_without_a_gpu_is_reported_unavailable():
    if importlib.util.find_spec("comfy_kitchen") is None:
        pytest.skip("comfy_kitchen is not importable here (put its wheel's package on PYTHONPATH to run this)")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: comfy-kitchen may well be available")
    assert "needs a CUDA or ROCm GPU" in alt_backends.unavailable_reason("comfy-kitchen")
    assert "comfy-kitchen" not in alt_backends.available_backends()
