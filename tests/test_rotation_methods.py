"""The rotation's launch variants (``rotation.METHOD``, issue 42 item 2) against the default one. The
"same rows" variants apply the same Hadamard to the same fp16 rows, so they give the same numbers up to the
fp32 sums' order; the exact-product ones (the inputs' own 16-bit product, fp32 butterflies; "tiled" is
Hopper's default) multiply the unrounded rows, so they are held to the exact rotation instead."""
from __future__ import annotations

import pytest
import sagetriton.kernels as kernels
import sagetriton.kernels.api  # noqa: F401  (kernels.api below)
import torch
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import detect_arch
from sagetriton.kernels.reference import cosine

SAME_ROWS = [m for m in kernels.rotation.METHODS if m != "dot" and not kernels.rotation.unnormalised(m)]
EXACT = [m for m in kernels.rotation.METHODS if kernels.rotation.unnormalised(m)]


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
    # one SM: the looping methods take several tiles per program (a partial last one, and past the end)
    monkeypatch.setattr(kernels.api, "sm_count", lambda device: 1)
    kernels.replay.clear()
    cfg = kernels.api._resolved_config(detect_arch(q.device), q.shape[-1], gran, "int8", None).replace(
        qk_rotation=True)
    out, out_lse = kernels.attention_forward(q, k, v, "HND", False, None, None, lse, cfg, True, False)
    return out, out_lse, cfg


GRANS = [("per_warp", 128), ("per_block", 128), ("per_warp", 96), ("per_block", 64)]


@pytest.mark.parametrize("method", SAME_ROWS)
@pytest.mark.parametrize("gran,D", GRANS)
def test_variant_matches_the_default_rotation(monkeypatch, method, gran, D):
    q, k, v = qkv(D=D)
    base, base_lse, cfg = run(monkeypatch, "dot", q, k, v, gran)
    out, out_lse, _ = run(monkeypatch, method, q, k, v, gran)
    assert cosine(out, base) >= 0.99999 and (out_lse - base_lse).abs().max() < 1e-3
    assert cosine(out, ref.quantized_reference(q, k, v, cfg)[0]) >= 0.9999
    assert cosine(out, ref.exact_attention(q, k, v)[0]) >= 0.9995


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("gran,D", GRANS)
def test_exact_product_is_as_close_as_the_default(monkeypatch, method, gran, D):
    """Outputs as close to fp64 as the default's, and the LSE (which keeps q·mean(K)) off fp64's by about as
    much: logits of massive channels reach ~500 here, and INT8 rounding moves the default's LSE by up to 0.8."""
    q, k, v = qkv(D=D)
    exact, exact_lse = ref.exact_attention(q, k, v)
    base, base_lse, cfg = run(monkeypatch, "dot", q, k, v, gran)
    out, out_lse, _ = run(monkeypatch, method, q, k, v, gran)
    assert cosine(out, base) >= 0.9999
    assert 1 - cosine(out, exact) <= 1.5 * (1 - cosine(base, exact))  # INT8 rounding lands elsewhere
    assert cosine(out, ref.quantized_reference(q, k, v, cfg)[0]) >= 0.9999
    err, base_err = ((x.double() - exact_lse).abs() for x in (out_lse, base_lse))
    assert err.mean() <= 1.5 * base_err.mean() + 1e-3 and err.max() <= 2 * base_err.max() + 1e-3


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("per_block", [False, True])
def test_exact_product_quantizes_the_exactly_rotated_rows(monkeypatch, method, per_block):
    """The launch alone on 16-bit rows: INT8 values and scales of the fp64 rotation of those rows (but for a
    rare ±1 where fp32 sums land on a rounding boundary)."""
    monkeypatch.setattr(kernels.api, "sm_count", lambda device: 1)
    _, k, _ = qkv(L=200)
    block, group = 64, 64 if per_block else 16
    out, scale = kernels.api._quantize_qk(k, group, block, 128, 1.0, per_block=per_block, rotate=128, method=method)
    y = (k.double() @ kernels.rotation.hadamard_block(128, 128)).reshape(k.shape[0] * k.shape[1], -1, 128)
    rows = y.shape[1]
    pad = -rows % block
    amax = torch.nn.functional.pad(y.abs().amax(-1), (0, pad)).reshape(y.shape[0], -1, group).amax(-1)
    want_scale = amax / 127.0
    per_row = want_scale.repeat_interleave(group, dim=1)[:, :rows]
    want = torch.round(y / per_row[..., None]).clamp(-127, 127)
    diff = (out.double() - want).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3
    got = scale if per_block else scale[:, ::group]
    assert torch.allclose(got.double(), want_scale[:, :got.shape[1]], rtol=1e-5)


@pytest.mark.parametrize("method", SAME_ROWS)
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
