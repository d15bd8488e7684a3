"""The rotation's "tiled" launches (Hopper's default, ``KernelConfig.rotation_tiles``) against the portable
"dot" ones. "dot" rounds each row, divided by its max, to fp16 before the product; "tiled" multiplies the
16-bit rows as they are, so it is held to fp64 and to the exact rotation's INT8 values."""
from __future__ import annotations

import pytest
import sagetriton.kernels as kernels
import sagetriton.kernels.api  # noqa: F401  (kernels.api below)
import sagetriton.kernels.devices  # noqa: F401  (kernels.devices below)
import torch
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import detect_arch
from sagetriton.kernels.reference import cosine

EXACT = ["tiled"]


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
    monkeypatch.setattr(kernels.devices, "sm_count", lambda device: 1)
    kernels.replay.clear()
    cfg = kernels.api._resolved_config(detect_arch(q.device), q.shape[-1], gran, "int8", None).replace(
        qk_rotation=True)
    out, out_lse = kernels.attention_forward(q, k, v, "HND", False, None, None, lse, cfg, True, False)
    return out, out_lse, cfg


GRANS = [("per_warp", 128), ("per_block", 128), ("per_warp", 96), ("per_block", 64)]


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
    monkeypatch.setattr(kernels.devices, "sm_count", lambda device: 1)
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


def test_auto_follows_the_config_and_falls_back_where_tiles_cannot_run(monkeypatch):
    """"auto" runs "tiled" only where the config asks for it; fp32 inputs or padded head dims take "dot" (they
    give the same numbers as "dot" then)."""
    pick = kernels.rotation.method_for
    bf16, fp32 = torch.bfloat16, torch.float32
    assert pick(True, bf16, bf16, 128, 128) == "tiled" and pick(False, bf16, bf16, 128, 128) == "dot"
    assert pick(True, fp32, fp32, 128, 128) == pick(True, bf16, bf16, 96, 128) == "dot"
    assert pick(True, bf16, fp32, 128, 128) == "dot"
    from sagetriton.kernels.arch import _FAMILIES
    assert [f for f, (_, d) in _FAMILIES.items() if d.get("rotation_tiles")] == ["hopper"]
    for D, dtype in ((96, torch.bfloat16), (128, torch.float32)):
        q, k, v = (t.to(dtype) for t in qkv(D=D, L=80))
        cfg = kernels.api._resolved_config(detect_arch(q.device), D, "per_warp", "int8", None).replace(
            qk_rotation=True)
        outs = []
        for tiles in (False, True):
            kernels.replay.clear()
            outs.append(kernels.attention_forward(q, k, v, "HND", False, None, None, False,
                                                  cfg.replace(rotation_tiles=tiles), True, False)[0])
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_q_launch_keeps_the_lse_bias_to_fp32(monkeypatch, dtype):
    """The Q launch's LSE bias, q·mean(K)·bias_mult, which the tiled launch takes from a small product of the
    16-bit rows with K's mean split into three 16-bit parts: within fp32 sums of fp64's, with massive channels
    (a mean rounded to 16 bits, or the rotated rows against an unrotated mean, misses by 1e-3 and more)."""
    from sagetriton.kernels import host_quant, quant

    monkeypatch.setattr(kernels.devices, "sm_count", lambda device: 1)  # several tiles per program, a partial one
    q, k, v = (t.to(dtype) for t in qkv(L=200))
    B, H, L, D = q.shape
    H_KV = k.shape[1]
    parts, n_parts, k_tokens = host_quant._kv_stats(k, v, True, quant.V_NONE, D)
    assert k_tokens == L  # 200 keys: the mean of every one
    final = torch.empty((4, B * H_KV, D), dtype=torch.float32)
    bias = torch.full((B * H, L), float("nan"), dtype=torch.float32)
    mult = 0.0883883
    kernels.api._quantize_qk(q, 16, 64, D, 1.0, quant.MEAN_DOT, (parts, n_parts, L, k_tokens, final), H // H_KV,
                             bias=bias, bias_mult=mult, finalize=(True, quant.V_NONE, 1.0, False), rotate=128,
                             method="tiled")
    mean = k.double().mean(2).repeat_interleave(H // H_KV, dim=1)  # (B, H, D): query head h reads K head h // 2
    terms = q.double() * mean[:, :, None, :]
    want = (terms.sum(-1) * mult).reshape(B * H, L)
    scale = (terms.abs().sum(-1) * mult).reshape(B * H, L)  # what fp32 sums of the products are relative to
    err = (bias.double() - want).abs()
    assert (err <= 1e-5 * scale).all(), (err / scale).max()
    assert want.abs().max() > 10  # the massive channels make the bias large
