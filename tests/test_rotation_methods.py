"""The rotation's launch variants (``rotation.METHOD``, issue 42 item 2) against the default one: the same
Hadamard on the same fp16 rows, so the same numbers up to the fp32 sums' order."""
from __future__ import annotations

import pytest
import sagetriton.kernels as kernels
import sagetriton.kernels.api  # noqa: F401  (kernels.api below)
import torch
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import detect_arch
from sagetriton.kernels.reference import cosine

VARIANTS = [m for m in kernels.rotation.METHODS if m != "dot"]


def qkv(B=1, H=4, H_KV=2, L=144, D=128):
    """Massive channels in Q and K, a key offset per channel (smoothing), GQA, a partial last block."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, h, L, D, generator=g) for h in (H, H_KV, H_KV))
    q[..., [3, 40]] *= 30
    k[..., [3, 40]] *= 30
    k += 3 * torch.randn(D, generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def run(monkeypatch, method, q, k, v, gran, lse=True):
    monkeypatch.setattr(kernels.rotation, "METHOD", method)
    kernels.replay.clear()
    cfg = kernels.api._resolved_config(detect_arch(q.device), q.shape[-1], gran, "int8", None).replace(
        qk_rotation=True)
    out, out_lse = kernels.attention_forward(q, k, v, "HND", False, None, None, lse, cfg, True, False)
    return out, out_lse, cfg


@pytest.mark.parametrize("method", VARIANTS)
@pytest.mark.parametrize("gran,D", [("per_warp", 128), ("per_block", 128), ("per_warp", 96), ("per_block", 64)])
def test_variant_matches_the_default_rotation(monkeypatch, method, gran, D):
    q, k, v = qkv(D=D)
    base, base_lse, cfg = run(monkeypatch, "dot", q, k, v, gran)
    out, out_lse, _ = run(monkeypatch, method, q, k, v, gran)
    assert cosine(out, base) >= 0.99999 and (out_lse - base_lse).abs().max() < 1e-3
    assert cosine(out, ref.quantized_reference(q, k, v, cfg)[0]) >= 0.9999
    assert cosine(out, ref.exact_attention(q, k, v)[0]) >= 0.9995


@pytest.mark.parametrize("method", VARIANTS)
@pytest.mark.parametrize("per_block", [False, True])
def test_variant_quantizes_to_the_same_int8(method, per_block):
    """The launch alone: INT8 values equal but for a rare ±1 where a sum lands on a rounding boundary, and
    the same scales (their maxima may move by as little)."""
    q, k, _ = qkv(L=200)
    x = k.float() - k.float().mean(dim=2, keepdim=True)
    block = 64
    outs = {}
    for method_ in ("dot", method):
        outs[method_] = kernels.api._quantize_qk(x, 64 if per_block else 16, block, 128, 1.0, per_block=per_block,
                                                 rotate=128, method=method_)
    (a, sa), (b, sb) = outs["dot"], outs[method]
    diff = (a.int() - b.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3
    assert torch.allclose(sa, sb, rtol=1e-5)


def test_split_falls_back_where_slices_would_be_too_narrow():
    assert kernels.rotation.split_slices("split4", 128, 128) == 4
    assert kernels.rotation.split_slices("split4", 256, 128) == 1  # two Hadamard blocks: unsplit
    assert kernels.rotation.split_slices("split4", 32, 32) == 1  # 8-wide dots
    assert kernels.rotation.split_slices("split2", 32, 32) == 2
