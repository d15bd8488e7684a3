"""Issue 31 item 9: the library API names the argument and the fix (ValueError / TypeError) before any
arithmetic; calls past the GPU's grid limit are split; a failed launch turns a variant off for that shape only."""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from attention_cases import comfy_args, random_qkv, reference_backend
from sagetriton.kernels import api, failures, sageattn
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.routing import dispatch
from sagetriton.nodes.routing.dispatch import PatchState


def _qkv(b=1, h=2, hkv=2, lq=8, lk=8, d=16):
    return (torch.randn(b, h, lq, d, dtype=torch.float16), torch.randn(b, hkv, lk, d, dtype=torch.float16),
            torch.randn(b, hkv, lk, d, dtype=torch.float16))


@pytest.mark.parametrize("shape, name", [(dict(h=0, hkv=0), "H (q's heads) is 0"),
                                         (dict(hkv=0), "Hkv (k's heads) is 0"),
                                         (dict(d=0), "D (q's head_dim) is 0")])
def test_zero_sizes_are_named(pack, shape, name):
    with pytest.raises(ValueError, match="^" + re.escape(name)):
        sageattn(*_qkv(**shape))


@pytest.mark.parametrize("convert", [lambda t: t.tolist(), lambda t: t.numpy()], ids=["list", "numpy"])
def test_non_tensor_inputs_are_a_type_error(pack, convert):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got (list|ndarray)"):
        sageattn(q, convert(k), v)
    with pytest.raises(TypeError, match="attn_mask must be a torch.Tensor or None"):
        sageattn(q, k, v, attn_mask=np.ones((8, 8), dtype=bool))


def test_list_valued_option_is_named(pack):
    with pytest.raises(TypeError, match=r"pv_precision must be a string or None, got list \['fp16'\]"):
        sageattn(*_qkv(), pv_precision=["fp16"])


def test_mask_on_another_device_is_named(pack):
    q, k, v = _qkv()
    mask = torch.ones(8, 8, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="attn_mask is on meta, q on cpu: move it with .to"):
        sageattn(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("return_lse", [False, True])
def test_batch_heads_over_the_grid_limit_is_split(pack, return_lse):
    """B·H = 3 x 30,000 programs on grid y: every launch stays within 65,535 and covers every head."""
    grids = []

    def record(kernel, grid, args, constexprs, options):  # the launches, not run (nothing to compute here)
        grids.append((kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), tuple(grid)))

    previous = api.set_launch_hook(record)
    try:
        q, k, v = _qkv(b=3, h=30000, hkv=30000, lq=1, lk=1, d=16)
        mask = torch.ones(3, 1, 1, 1, dtype=torch.bool)
        res = sageattn(q, k, v, attn_mask=mask, return_lse=return_lse)
    finally:
        api.set_launch_hook(previous)
    out = res[0] if return_lse else res
    assert out.shape == q.shape and (not return_lse or res[1].shape == (3, 30000, 1))
    assert grids and all(max(g[1:], default=1) <= api.GRID_Y_LIMIT for _, g in grids), grids
    attention = [g for name, g in grids if name == "attention_kernel"]
    assert sum(g[1] for g in attention) == 3 * 30000 and len(attention) == 2  # 2 x 30,000 + 1 x 30,000


def test_heads_alone_over_the_limit_is_a_clear_error(pack):
    q = torch.empty(1, 1, 70000, 16, dtype=torch.float16)  # NHD: 70,000 heads of one token
    previous = api.set_launch_hook(lambda *a: None)  # should a launch come, it is not run
    try:
        with pytest.raises(ValueError, match="70000 query heads exceed 65535"):
            sageattn(q, q, q, tensor_layout="NHD")
    finally:
        api.set_launch_hook(previous)


def test_a_launch_failure_disables_the_variant_for_that_shape_class_only(pack, caplog):
    """A launch that fails for long keys only (as a grid limit would) leaves the short calls on the kernel."""
    failures.reset()

    def failing_for_long_keys(kernel, grid, args, constexprs, options):
        if kernel is pack.kernels.attention.attention_kernel and args[-2] >= 64:  # LK
            raise RuntimeError("simulated launch failure")
        kernel[grid](*args, **constexprs, **options)

    previous = api.set_launch_hook(failing_for_long_keys)
    try:
        state = PatchState(SageSettings(min_seq_len=0))
        state.begin_run()
        for lk in (64, 16, 64, 16):
            q, k, v = random_qkv(lq=16, lk=lk, d=32)
            kwargs = dict(skip_reshape=True, skip_output_reshape=False, transformer_options={},
                          _inside_attn_wrapper=True)
            with caplog.at_level(logging.WARNING, logger="SageTriton"):
                state.dispatch(reference_backend, (*comfy_args(q, k, v, True), q.shape[1]), kwargs)
    finally:
        api.set_launch_hook(previous)
        disabled = dispatch.disabled_variants()
        failures.reset()
    assert len(disabled) == 1
    assert state.run.kernel == 2  # both short calls, before and after the long one failed
    assert dict(state.run.fallback) == {"kernel failed (variant disabled until restart)": 2}
