"""RoPE in the pack's kernel: ComfyUI's own math and bits, only for patched models' forwards.

The kernel runs through the Triton interpreter, whose float -> bf16 conversion truncates and whose fused
multiply-add rounds twice, where a GPU rounds once to nearest: outputs of either are compared within one
step of their dtype here, and gpu_check compares bits on the GPU. The rest must be ComfyUI's bits.
"""
from __future__ import annotations

import contextlib
import logging
import sys

import pytest
import torch
from compile_child import compile_in_child
from sagetriton.kernels import failures as process_memory
from sagetriton.kernels import rope
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model
from sagetriton.nodes.reporting import stats
from sagetriton.nodes.routing import rope_hooks
from tiny_models import sample

pytestmark = pytest.mark.usefixtures("comfyui_path")

COMFY_ATTENTION = SageSettings(min_seq_len=1 << 20)  # every attention call to ComfyUI's own


def comfy_math():
    import comfy.ldm.flux.math as fm  # noqa: F401  (ComfyUI's modules, imported by the comfyui_path fixture)

    return sys.modules["comfy.ldm.flux.math"]


def original(name: str):
    fn = getattr(comfy_math(), name)
    return getattr(fn, "sagetriton_original", fn)


def flux_freqs(length: int, axes=(4, 6, 6), batch: int = 1, seed: int = 0) -> torch.Tensor:
    """Flux's RoPE matrices (B, 1, L, D/2, 2, 2) from ComfyUI's own ``rope``, for random positions."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 64, (batch, length, len(axes)), generator=g).float()
    return torch.cat([comfy_math().rope(pos[..., i], d, 10000) for i, d in enumerate(axes)], dim=-3).unsqueeze(1)


def comfy_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """ComfyUI 0.3.64's RoPE (``attention``'s inline version): products and sum each rounded in fp32."""
    x_ = x.to(freqs.dtype).reshape(*x.shape[:-1], -1, 1, 2)
    return (freqs[..., 0] * x_[..., 0] + freqs[..., 1] * x_[..., 1]).reshape(*x.shape).type_as(x)


def assert_rope_equal(out: torch.Tensor, ref: torch.Tensor, exact: bool = True):
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    if out.dtype == torch.bfloat16 or not exact:  # the interpreter's roundings (module docstring)
        step = ref.float().abs().clamp_min(2 ** -14) * torch.finfo(ref.dtype).eps
        assert ((out.float() - ref.float()).abs() <= step).all()
        assert (out != ref).float().mean() < 0.6
    else:
        assert torch.equal(out, ref)


@pytest.mark.parametrize("dtype, axes", [(torch.float16, (4, 6, 6)), (torch.bfloat16, (4, 6, 6)),
                                         (torch.float32, (4, 6, 6)), (torch.float16, (4, 10, 10))])
def test_flux_layout_pair_is_comfyuis_math(dtype, axes):
    """Flux's (B, H, L, D) q and k in one launch; head size 24 has 12 pairs, not a power of two."""
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 3, 37, sum(axes), generator=g).to(dtype) for _ in range(2))
    freqs = flux_freqs(37, axes=axes, batch=2)
    rq, rk = rope.apply(q, freqs, k)
    assert_rope_equal(rq, comfy_rope(q, freqs))
    assert_rope_equal(rk, comfy_rope(k, freqs))
    assert not torch.equal(rq, q)  # it rotated something


def test_wan_layout_strided_input_and_3d():
    """Wan's (B, L, H, D) with (1, L, 1, D/2, 2, 2) matrices; a strided view (q out of a fused qkv); 3-D."""
    g = torch.Generator().manual_seed(2)
    freqs = flux_freqs(29, axes=(16, 24, 24)).movedim(1, 2)
    qkv = torch.randn(2, 29, 3, 4, 64, generator=g).half()
    x = qkv[:, :, 1]  # strided, last dimension contiguous
    assert rope.unsupported(x, freqs) is None and not x.is_contiguous()
    assert_rope_equal(rope.apply(x, freqs, fma=True), original("apply_rope1")(x, freqs), exact=False)
    x3 = torch.randn(29, 4, 64, generator=g).half()
    assert_rope_equal(rope.apply(x3, freqs[0]), comfy_rope(x3, freqs[0]))


def test_what_the_kernel_does_not_take():
    x, freqs = torch.randn(1, 2, 8, 16).half(), flux_freqs(8)
    assert "needs gradients" in rope.unsupported(x.float().requires_grad_(), freqs)
    assert "freqs shape" in rope.unsupported(x, flux_freqs(9))  # other lengths: ComfyUI slices them itself
    assert "freqs shape" in rope.unsupported(x, flux_freqs(8, batch=3))  # would broadcast x up
    assert "shape" in rope.unsupported(torch.randn(1, 2, 8, 15).half(), freqs)
    assert "strides" in rope.unsupported(x.transpose(-1, -2), freqs)
    assert "dtypes" in rope.unsupported(x, freqs.double())
    assert rope.unsupported(object(), freqs) == "not plain tensors"
    with pytest.raises(ValueError, match="y: shape"):
        rope.apply(x, freqs, torch.randn(1, 2, 4, 16).half())


@pytest.fixture
def rope_calls():
    def count():
        return rope_hooks.calls()
    yield count
    process_memory.reset()


@pytest.mark.parametrize("family", ["flux", "wan21"])
def test_patched_forwards_rotate_in_the_kernel_and_others_do_not(family, tiny, rope_calls):
    t = tiny(family)
    reference = sample(t)
    before = rope_calls()
    patched = patch_model(t.patcher, COMFY_ATTENTION)
    assert rope_hooks.install()  # ComfyUI's functions are wrapped...
    out = sample(t, patched)
    during = rope_calls() - before
    assert during > 0
    run = stats.last_run()  # the run summary counts them, and says so
    assert run["rope"] == during and f"RoPE: {during} calls on SageTriton's kernel" in run["text"]
    assert torch.equal(sample(t), reference)  # ...and do nothing for the unpatched model
    assert rope_calls() - before == during
    # Every attention call on ComfyUI's attention: at most the RoPE's last-bit roundings (module docstring) differ.
    assert torch.nn.functional.cosine_similarity(out.flatten().double(), reference.flatten().double(), dim=0) > 0.99999

    off = patch_model(t.patcher, COMFY_ATTENTION.replace(fast_rope=False))
    assert torch.equal(sample(t, off), reference)
    assert rope_calls() - before == during
    assert stats.last_run()["rope"] == 0 and "RoPE" not in stats.last_run()["text"]


def test_install_wraps_once_and_only_comfyuis_functions(tiny):
    tiny("flux")
    places = rope_hooks.install()
    assert "comfy.ldm.flux.layers.attention" in places and "comfy.ldm.wan.model.apply_rope1" in places
    assert rope_hooks.install() == places
    fm = comfy_math()
    for name in rope_hooks.SIGNATURES:
        wrapped = getattr(fm, name)
        assert wrapped.sagetriton_original.__module__ == "comfy.ldm.flux.math"
        assert not hasattr(wrapped.sagetriton_original, "sagetriton_original")


def test_a_failing_kernel_logs_once_and_comfyui_rotates(tiny, monkeypatch, caplog, rope_calls):
    t = tiny("flux")
    reference = sample(t)

    def broken(*args, **kwargs):
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(rope, "apply", broken)
    before = rope_calls()
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        out = sample(t, patch_model(t.patcher, COMFY_ATTENTION))
    warnings = [r for r in caplog.records if "RoPE kernel failed" in r.getMessage()]
    assert len(warnings) == 1 and "PassManager::run failed" in warnings[0].getMessage()
    assert rope_calls() == before
    assert torch.equal(out, reference)


ROPE_TARGETS = ("sm80", "sm90", "sm120", "gfx1100", "gfx1201", "gfx942")
_ROPE_ASM_SCRIPT = """
import json, re, sys
from sagetriton_import import import_pack
import_pack()
import triton
from sagetriton.installer import crosscompile as cc
FMA = r"\\b(fma\\.rn\\.f32|v_fma_f32|v_fmac_f32|v_pk_fma_f32)"
VECTOR = (r"\\b(ld\\.global\\.v4|st\\.global\\.v4|buffer_load_b128|buffer_store_b128|"
          r"buffer_load_dwordx4|buffer_store_dwordx4)")
MEMORY = r"\\b(ld\\.global|st\\.global|buffer_load|buffer_store|global_load|global_store)\\w*"
out = {}
for name in sys.argv[1:]:
    target = cc.parse_target(name)
    for spec in cc.rope_specs(128):
        k = triton.compile(cc.launch_source(spec, target), target=target.gpu_target(),
                           options=dict(spec.get("options") or {}))
        text = k.asm.get("ptx") or k.asm["amdgcn"]
        asm = "\\n".join(line.split("//")[0].split(";")[0] for line in text.splitlines())
        out[name + " " + spec["name"]] = {"fma": len(re.findall(FMA, asm)), "memory": len(re.findall(MEMORY, asm)),
                                          "vector": len(re.findall(VECTOR, asm))}
print(json.dumps(out))
"""


def test_compiled_rope_rounds_as_comfyui_and_moves_whole_rows():
    """Cross-compiled as the installer's ``--check-targets`` builds it: no fused multiply-add where ComfyUI
    rounds each product (the interpreter cannot show this), one where it fuses; every load and store is a
    16-byte vector on every family."""
    found = compile_in_child(_ROPE_ASM_SCRIPT, ROPE_TARGETS, timeout=600)
    assert len(found) == 2 * len(ROPE_TARGETS)
    for build, facts in found.items():
        assert (facts["fma"] > 0) == build.endswith("_fma"), (build, facts)
        assert facts["memory"] > 0 and facts["vector"] == facts["memory"], (build, facts)


def test_running_out_of_memory_once_does_not_turn_the_kernel_off(tiny, monkeypatch, rope_calls):
    t = tiny("flux")
    real, failures = rope.apply, []

    def out_of_memory_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(rope, "apply", out_of_memory_once)
    before = rope_calls()
    sample(t, patch_model(t.patcher, COMFY_ATTENTION))
    assert failures and process_memory.memory.rope is None and rope_calls() > before


def test_a_self_test_failure_keeps_comfyuis_rope(tiny, rope_calls):
    """install.py found the RoPE kernel wrong on this GPU: patched models keep ComfyUI's RoPE."""
    from sagetriton.nodes.config.install_report import NoReport

    class RopeFailed(NoReport):
        def rope_kernel_failed(self, arch):
            return True

    t = tiny("flux")
    reference = sample(t)
    before = rope_calls()
    assert torch.equal(sample(t, patch_model(t.patcher, COMFY_ATTENTION, report=RopeFailed())), reference)
    assert rope_calls() == before
    sample(t, patch_model(t.patcher, COMFY_ATTENTION, report=NoReport()))
    assert rope_calls() > before


def in_patched_forward(fn):
    """``fn()`` as a patched model's forward runs it: inside the APPLY_MODEL wrapper ``patch_model`` adds."""
    from sagetriton.nodes.routing.dispatch import PatchState

    wrapper = rope_hooks.make_apply_model_wrapper(PatchState(COMFY_ATTENTION))
    return wrapper(lambda _x: fn(), torch.zeros(1))


def test_longer_freqs_are_cut_to_the_input_as_comfyui_cuts_them(tiny, rope_calls):
    """Flux.2 on current ComfyUI hands ``apply_rope1`` more positions than the input has; ComfyUI uses the
    first ones, and so does the kernel instead of leaving the call to ComfyUI."""
    from sagetriton.kernels import reference

    tiny("flux")
    rope_hooks.install()
    x, freqs = torch.randn(1, 2, 8, 16).half(), flux_freqs(11)
    before = rope_calls()
    out = in_patched_forward(lambda: comfy_math().apply_rope1(x, freqs))
    assert rope_calls() == before + 1
    assert_rope_equal(out, reference.rope(x, freqs[:, :, :8], fma=True), exact=False)


def test_queries_and_keys_of_other_lengths_each_get_their_own_positions(tiny, rope_calls):
    """Keys longer than the queries (a cache of keys): each rotated with its own first positions, and a key
    longer than the positions goes to ComfyUI without turning the kernel off."""
    from sagetriton.kernels import reference

    tiny("flux")
    rope_hooks.install()
    q, k, freqs = torch.randn(1, 2, 8, 16).half(), torch.randn(1, 2, 12, 16).half(), flux_freqs(12)
    before = rope_calls()
    oq, ok = in_patched_forward(lambda: comfy_math().apply_rope(q, k, freqs))
    assert rope_calls() == before + 1
    assert_rope_equal(oq, reference.rope(q, freqs[:, :, :8], fma=True), exact=False)
    assert_rope_equal(ok, reference.rope(k, freqs, fma=True), exact=False)

    with contextlib.suppress(RuntimeError):  # ComfyUI's own RoPE cannot broadcast 8 positions to 12 keys
        in_patched_forward(lambda: comfy_math().apply_rope(q, k, freqs[:, :, :8]))
    assert process_memory.memory.rope is None
    after = rope_calls()
    in_patched_forward(lambda: comfy_math().apply_rope(q, k, freqs))
    assert rope_calls() == after + 1
