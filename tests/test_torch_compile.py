"""A patched model compiled as ComfyUI's TorchCompileModel node compiles it (``set_torch_compile_wrapper``), in
either order: it samples on the kernel, with the uncompiled patched model's result and counts (issue 49).

The attention override is a graph break (the dispatcher runs eagerly); RoPE in a compiled forward is ComfyUI's,
which the compiler fuses, and the run summary and the panel say so. The CPU tests compile with the "eager"
backend (dynamo's tracing, where the failure was; the same arithmetic, so the same bits) and once with inductor;
bench/compile_models.py measures inductor on a GPU.
"""
from __future__ import annotations

import pytest
import torch
from sagetriton.kernels.reference import rel_l1
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model
from sagetriton.nodes.reporting import stats
from sagetriton.nodes.reporting.panel_text import run_lines
from sagetriton.nodes.reporting.run_summary import ROPE_COMPILED
from tiny_models import sample

pytestmark = pytest.mark.usefixtures("comfyui_path", "no_install_report")

SETTINGS = SageSettings(min_seq_len=16)  # self-attention on the kernel, 8-token cross-attention falls back
COMFY_ROPE = SageSettings(min_seq_len=16, fast_rope=False)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(model, backend: str):
    """``model`` compiled as ComfyUI's TorchCompileModel node does it (a clone with the compile wrapper)."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    m = model.clone()
    set_torch_compile_wrapper(model=m, backend=backend)
    return m


def patched_and_compiled(t, order: str, backend: str = "eager"):
    if order == "patch_then_compile":
        return compiled(patch_model(t.patcher, SETTINGS), backend)
    return patch_model(compiled(t.patcher, backend), SETTINGS)


@pytest.mark.parametrize("order", ["patch_then_compile", "compile_then_patch"])
@pytest.mark.parametrize("family", ["flux", "wan21"])
def test_a_compiled_patched_model_samples_on_the_kernel(tiny, family, order):
    t = tiny(family)
    # Uncompiled, with ComfyUI's RoPE as the compiled graph has it (the interpreter's bf16 RoPE is a step off)
    reference = sample(t, patch_model(t.patcher, COMFY_ROPE), steps=2)
    eager_run = stats.last_run()
    assert eager_run["kernel"] > 0

    out = sample(t, patched_and_compiled(t, order), steps=2)
    run = stats.last_run()
    assert torch.equal(out, reference)
    assert (run["kernel"], run["fallback"]) == (eager_run["kernel"], eager_run["fallback"])
    # RoPE: ComfyUI's inside the compiled graph, and the summary says why there were no RoPE calls on ours
    assert run["rope"] == 0 and run["rope_off"] == ROPE_COMPILED
    assert f"RoPE: {ROPE_COMPILED}" in run["text"]


def test_inductor_compiled_patched_model_stays_close(tiny):
    """Inductor, ComfyUI's default backend: its fused kernels round the model's other ops differently (rel L1
    8e-4 here, as much as compiling the unpatched model moves it: 7.6e-4)."""
    t = tiny("wan21")
    reference = sample(t, patch_model(t.patcher, COMFY_ROPE), steps=2)
    eager_kernel = stats.last_run()["kernel"]
    out = sample(t, patched_and_compiled(t, "patch_then_compile", "inductor"), steps=2)
    assert stats.last_run()["kernel"] == eager_kernel > 0
    assert rel_l1(out, reference) < 5e-3


def test_uncompiled_runs_keep_the_rope_kernel_and_say_nothing_of_compile(tiny):
    t = tiny("flux")
    patched = patch_model(t.patcher, SETTINGS)
    sample(t, compiled(patched, "eager"), steps=1)
    assert stats.last_run()["rope_off"] == ROPE_COMPILED
    sample(t, patched, steps=1)  # the same patch, the compile node bypassed
    run = stats.last_run()
    assert run["rope"] > 0 and run["rope_off"] is None and "torch.compile" not in run["text"]


def test_the_panel_says_rope_is_left_to_the_compiler():
    run = {"kernel": 57, "fallback": {}, "rope": 0, "rope_off": ROPE_COMPILED}
    assert run_lines(run) == ["last run: 57 kernel · 0 fallback", "RoPE: ComfyUI's, compiled by torch.compile"]


def test_fullgraph_stops_at_the_override_saying_why(tiny):
    """The override is a graph break: a fullgraph compile cannot hold it, and dynamo's error names the fix."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper
    from sagetriton.nodes.routing.override import GRAPH_BREAK

    t = tiny("wan21")
    m = patch_model(t.patcher, SETTINGS).clone()
    set_torch_compile_wrapper(model=m, backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="compile without fullgraph=True") as raised:
        sample(t, m, steps=1)
    assert GRAPH_BREAK in str(raised.value)
