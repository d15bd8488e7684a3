"""Issue 51: a ``sageattn`` call validates its arguments once (host time every call pays), and the custom op,
which a traced graph enters without ``sageattn``'s checks, still checks what the eager entry checks."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
from sagetriton.kernels import api, checks, custom_op, host, sageattn
from sagetriton.kernels.arch import CPU_ARCH, default_config

CHECKS = ("_check_inputs", "_check_scale", "_check_shapes", "check_config")


@pytest.fixture
def counted(monkeypatch):
    """Calls of each check, wherever the kernels' modules reach it; launches are not run (none is needed)."""
    calls = Counter()
    for name in CHECKS:
        real = getattr(checks, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        for module in (api, host, custom_op, checks):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, spy)
    previous = api.set_launch_hook(lambda *a: None)
    yield calls
    api.set_launch_hook(previous)


def _qkv(requires_grad=False):
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float16) for _ in range(3))
    return q.requires_grad_(requires_grad), k, v


@pytest.mark.parametrize("path", ["eager", "custom_op"])
def test_a_call_checks_its_arguments_once(pack, counted, path):
    """Eager calls run the host pipeline directly; inputs that need gradients go through the custom op."""
    q, k, v = _qkv(requires_grad=path == "custom_op")
    out = sageattn(q, k, v, sm_scale=0.5, config=default_config(CPU_ARCH, 16))
    assert out.shape == q.shape and (out.grad_fn is not None) == (path == "custom_op")
    assert counted == Counter({name: 1 for name in CHECKS}), counted


def test_the_custom_op_called_alone_checks_what_sageattn_checks(pack, counted):
    """What a traced graph runs: the op without ``sageattn`` in front of it. Same errors, same types."""
    q, k, v = _qkv()
    cfg = default_config(CPU_ARCH, 16)
    args = dict(layout="HND", is_causal=False, sm_scale=0.5, attn_mask=None, return_lse=False)

    def op(q, k, v, cfg=cfg, **over):
        a = {**args, **over}
        return torch.ops.sagetriton.attention(q, k, v, a["layout"], a["is_causal"], a["sm_scale"], a["attn_mask"],
                                              a["return_lse"], *custom_op._op_config(cfg), True, False, "HND")

    out, _ = op(q, k, v)
    assert out.shape == q.shape
    assert counted == Counter({name: 1 for name in CHECKS}), counted  # checked once, there
    bad_cfg = dataclasses.replace(cfg, block_m=7)
    for through_op, through_sageattn, error, text in [
            (lambda: op(q, k, v, sm_scale=math.nan), lambda: sageattn(q, k, v, sm_scale=math.nan, config=cfg),
             ValueError, "sm_scale must be finite"),
            (lambda: op(q, k.float(), v), lambda: sageattn(q, k.float(), v, config=cfg),
             TypeError, "q, k and v must share one dtype"),
            (lambda: op(q, k, v, layout="BHLD"), lambda: sageattn(q, k, v, tensor_layout="BHLD", config=cfg),
             ValueError, "tensor_layout must be 'HND'"),
            (lambda: op(q, k[..., :8], v), lambda: sageattn(q, k[..., :8], v, config=cfg),
             ValueError, "q, k and v must share head_dim"),
            (lambda: op(q, k, v, cfg=bad_cfg), lambda: sageattn(q, k, v, config=bad_cfg),
             ValueError, r"config.block_m=7 is not one of")]:
        with pytest.raises(error, match=text):
            through_op()
        with pytest.raises(error, match=text):  # the eager entry names it the same way
            through_sageattn()
