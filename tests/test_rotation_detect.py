"""The Q/K rotation only where it pays (issue 42): heads whose keys have outlier channels or tokens are
rotated, the others quantized as without the rotation, decided on the device from the statistics pass."""
from __future__ import annotations

import pytest
import sagetriton.kernels as kernels
import sagetriton.kernels.api  # noqa: F401  (kernels.api below)
import torch
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import detect_arch
from sagetriton.kernels.reference import cosine


@pytest.fixture(autouse=True)
def detection_on(monkeypatch):
    """The detection is off by default (it cost more than it saved on the H200, docs/RESULTS.md); these
    tests keep it correct as an option."""
    monkeypatch.setattr(kernels.rotation, "DETECT", True)


def mixed_heads(L=256, D=64):
    """GQA, 4 query heads on 2 key heads: key head 0 (query heads 0, 1) with massive channels in Q and K,
    key head 1 with an offset per channel (smoothing's job, not the rotation's)."""
    g = torch.Generator().manual_seed(0)
    q, v = torch.randn(1, 4, L, D, generator=g), torch.randn(1, 2, L, D, generator=g)
    k = torch.randn(1, 2, L, D, generator=g)
    q[:, :2, :, [3, 40]] *= 30
    k[:, 0, :, [3, 40]] *= 30
    k[:, 1] += 5 * torch.randn(D, generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def run(q, k, v, rotation: bool):
    base = kernels.api._resolved_config(detect_arch(q.device), q.shape[-1], "per_warp", "int8", None)
    cfg = base.replace(qk_rotation=rotation)
    out, lse = kernels.attention_forward(q, k, v, "HND", False, None, None, True, cfg, True, False)
    return out, lse, cfg


@pytest.mark.parametrize("outlier", ["massive_channels", "outlier_key_token"])
def test_only_heads_with_outliers_are_rotated(monkeypatch, outlier):
    q, k, v = mixed_heads()
    if outlier == "outlier_key_token":  # one key at 100 in one channel instead, away from the mean's sample
        q, k = q.clone(), k.clone()
        q[:, :2] = torch.randn(q[:, :2].shape).bfloat16()
        k[:, 0] = torch.randn(k[:, 0].shape).bfloat16()
        k[:, 0, 200, 7] = 100.0
    assert ref.rotated_heads(k.float()).tolist() == [[True, False]]
    detected, lse, cfg = run(q, k, v, rotation=True)
    unrotated, _, _ = run(q, k, v, rotation=False)
    monkeypatch.setattr(kernels.rotation, "DETECT", False)
    every_head, _, _ = run(q, k, v, rotation=True)
    # The same bits as the unrotated call on the smooth heads, as rotating every head on the outlier ones.
    assert torch.equal(detected[:, 2:], unrotated[:, 2:]) and not torch.equal(every_head[:, 2:], unrotated[:, 2:])
    assert torch.equal(detected[:, :2], every_head[:, :2])
    monkeypatch.setattr(kernels.rotation, "DETECT", True)
    qref, qref_lse = ref.quantized_reference(q, k, v, cfg)
    assert cosine(detected, qref) >= 0.9999 and (lse - qref_lse).abs().max() < 3e-2
    assert cosine(detected[:, :2], ref.exact_attention(q, k, v)[0][:, :2]) >= 0.9995


def test_random_inputs_are_not_rotated():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 192, 128, generator=g).bfloat16() for _ in range(3))
    assert not ref.rotated_heads(k.float()).any()
    assert torch.equal(run(q, k, v, True)[0], run(q, k, v, False)[0])
