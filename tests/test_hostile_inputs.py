"""Hostile inputs: every kernel variant against torch SDPA in float64 (CPU), not only our references.

Masked rows (boolean, -inf, -finfo.max, -1e30, -1e9, rows mixing -inf and -finfo.max), logits far
beyond any real model's, NaN/Inf in q, k or v, scales of either sign, and bad ``config=`` values.
Shapes are tiny (the interpreter); 96 keys are two key tiles, so the running-max bookkeeping
between tiles is exercised too.

The pack's choices where SDPA has none to copy, checked below:
- a row with no live key (boolean mask all False, or -inf everywhere) is 0, as torch's math SDPA
  gives on the CPU (some fused GPU SDPA kernels give NaN there);
- a row masked everywhere with a finite value too large for float32 to keep the logits beside it
  (-1e9 and beyond) is the mean of V, as float32 SDPA gives; float64 SDPA keeps the logits up to
  ~1e17 (only -1e30 and -finfo.max swallow them there too);
- a NaN or ±inf ``sm_scale`` is a ValueError (SDPA's output would be all NaN).
"""
import math

import pytest
import sagetriton.kernels as kernels
import torch
import torch.nn.functional as F
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import KernelConfig
from sagetriton.kernels.reference import cosine

sageattn = kernels.sageattn
VARIANTS = [(g, pv) for g in ("per_block", "per_warp", "per_thread") for pv in ("fp16", "fp8", "fp8+residual", "int8")]
FMAX = torch.finfo(torch.float32).max
LQ, LK, D = 8, 96, 32


def sdpa64(q, k, v, mask=None, scale=None):
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.double()
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale)


def qkv(B=1, H=2, lq=LQ, lk=LK, d=D, dtype=torch.float16):
    g = torch.Generator().manual_seed(39)
    return tuple(torch.randn(B, H, n, d, generator=g).to(dtype) for n in (lq, lk, lk))


def hostile_mask():
    """One additive mask, a hostile case per query row."""
    m = torch.zeros(LQ, LK)
    m[1] = -FMAX  # ComfyUI's padding value, every key
    m[2] = -1e30
    m[3, :64] = float("-inf")  # first key tile -inf, the rest -finfo.max: SDPA averages the -max keys
    m[3, 64:] = -FMAX
    m[4, :64] = -FMAX  # the reverse
    m[4, 64:] = float("-inf")
    m[5] = float("-inf")  # nothing live: 0
    m[6, 80:] = -FMAX  # ordinary padding
    m[7] = -1e9
    return m


def run(q, k, v, gran, pv, **kw):
    res = sageattn(q, k, v, qk_quant_gran=gran, pv_precision=pv, **kw)
    out = res[0] if isinstance(res, tuple) else res
    assert out.dtype == q.dtype and out.shape == q.shape
    return res


def assert_rows_close(out, want, rows, min_cos=0.999):
    for r in rows:
        c = cosine(out[..., r, :], want[..., r, :])
        assert c >= min_cos, f"row {r}: cosine {c:.6f}"
        assert torch.allclose(out[..., r, :].double(), want[..., r, :], atol=0.05, rtol=0.05), f"row {r}"


@pytest.mark.parametrize("gran,pv", VARIANTS)
def test_masked_rows_follow_sdpa(gran, pv):
    """-finfo.max / -1e30 rows average V (INT8 P·V returned zeros), mixed -inf/-max rows average their
    -max keys, an all -inf row is 0, all as float64 SDPA; a -1e9 row is V's mean, as float32 SDPA."""
    q, k, v = qkv()
    mask = hostile_mask()
    out = run(q, k, v, gran, pv, attn_mask=mask)
    assert torch.isfinite(out).all()
    want = sdpa64(q, k, v, mask)
    assert_rows_close(out, want, [0, 1, 2, 3, 4, 6])
    assert (out[:, :, 5] == 0).all() and (want[:, :, 5] == 0).all()
    assert torch.allclose(out[:, :, 1].double(), v.double().mean(2), atol=0.02)
    assert torch.allclose(out[:, :, 3].double(), v[:, :, 64:].double().mean(2), atol=0.02)
    want32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert torch.allclose(want32[:, :, 7].double(), v.double().mean(2), atol=1e-3)
    assert_rows_close(out, want32.double(), [7])


@pytest.mark.parametrize("gran,pv", VARIANTS)
def test_boolean_mask_with_an_empty_row_and_lse(gran, pv):
    q, k, v = qkv()
    mask = torch.rand(LQ, LK, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[2] = False
    mask[5, :64] = False  # the first key tile holds nothing live for this row
    out, lse = run(q, k, v, gran, pv, attn_mask=mask, return_lse=True)
    want = sdpa64(q, k, v, mask)
    assert (out[:, :, 2] == 0).all() and (want[:, :, 2] == 0).all() and torch.isneginf(lse[:, :, 2]).all()
    assert_rows_close(out, want, [r for r in range(LQ) if r != 2])
    _, exact_lse = ref.exact_attention(q, k, v, attn_mask=mask)
    live = torch.isfinite(exact_lse)
    assert torch.allclose(lse.double()[live], exact_lse[live], atol=0.05)


@pytest.mark.parametrize("gran,pv", VARIANTS)
def test_huge_logits(gran, pv):
    """q and k x3000 in fp16: base-2 logits ~3e7, where INT8 P·V zeroed every row. Materialized
    logits (a mask, per_thread scales) give SDPA's answer: the kernel equals its own quantized
    arithmetic (``quantized_reference``) and float64 SDPA wherever INT8 rounding of Q and K cannot
    reorder the top keys (top two logits 1 % apart). The unmasked per_warp/per_block loop (one FMA per
    logit) is exact below 2^21 (base 2; 2^18 with fp8 P); beyond, its rows are NaN, never a silent 0: the nodes'
    non-finite guard then runs SDPA for the call."""
    q, k, v = qkv(lq=16)
    q, k = (q * 3000).half(), (k * 3000).half()
    cfg = KernelConfig(gran, "fp8" if pv == "fp8+residual" else pv, "fp32", "e4m3fn" if "fp8" in pv else None,
                       64, 64, 4, 1, v_residual=pv == "fp8+residual")
    want = sdpa64(q, k, v)
    top = (q.double() @ k.double().transpose(-1, -2)).topk(2, dim=-1).values
    clear = (top[..., 0] - top[..., 1]) > 0.01 * top[..., 0].abs()
    assert clear.sum() >= 16
    zero = torch.zeros(16, LK)
    out = run(q, k, v, gran, pv, attn_mask=zero)
    assert torch.isfinite(out).all()
    assert cosine(out, ref.quantized_reference(q, k, v, cfg, attn_mask=zero)[0]) >= 0.999
    assert cosine(out[clear], want[clear]) >= 0.999
    out = run(q, k, v, gran, pv)
    if gran == "per_thread":
        assert torch.isfinite(out).all() and cosine(out[clear], want[clear]) >= 0.999
    else:
        assert torch.isnan(out).all()


@pytest.mark.parametrize("gran,pv", VARIANTS)
def test_nan_and_inf_inputs_give_non_finite_rows_like_sdpa(gran, pv):
    """NaN in q (one row), k (one key: every row of its head) and v (one channel of every row), Inf in
    v, one batch each: wherever SDPA is non-finite, so is the kernel (INT8 P·V rounded the NaN away),
    and the untouched batch stays accurate."""
    q, k, v = qkv(B=5)
    q[0, 0, 3, 4] = float("nan")
    k[1, 1, 70, 2] = float("nan")
    v[2, 0, 10, 5] = float("nan")
    v[3, 1, 90, 6] = float("inf")
    out = run(q, k, v, gran, pv)
    want = sdpa64(q, k, v)
    bad = ~torch.isfinite(want)
    assert bad[:4].any(dim=(1, 2, 3)).all()
    assert (~torch.isfinite(out))[bad].all()
    assert torch.isfinite(out[4]).all() and cosine(out[4], want[4]) >= 0.999


@pytest.mark.parametrize("gran,pv", VARIANTS)
@pytest.mark.parametrize("scale", [-1.0])
def test_negative_scales(gran, pv, scale):
    """The per_warp/per_block row max was taken on the integers, assuming a positive scale (cosine 0.5
    on the GPU); fp16 P·V with -1 was all NaN."""
    q, k, v = qkv()
    out = run(q, k, v, gran, pv, sm_scale=scale)
    assert cosine(out, sdpa64(q, k, v, scale=scale)) >= 0.999


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scales_are_refused(scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="sm_scale must be finite"):
        sageattn(q, k, v, sm_scale=scale)
    with pytest.raises(ValueError, match="sm_scale must be finite"):
        kernels.attention_forward(q, k, v, "HND", False, scale, None, False, KernelConfig(), True, False)
    with pytest.raises(TypeError, match="sm_scale"):
        sageattn(q, k, v, sm_scale="0.1")


def test_is_causal_must_be_a_bool():
    q, k, v = qkv()
    for bad in ("no", 1, None):
        with pytest.raises(TypeError, match="is_causal"):
            sageattn(q, k, v, is_causal=bad)


@pytest.mark.parametrize("field,value,err", [
    ("block_m", -1, ValueError), ("block_n", -64, ValueError), ("block_m", 0, ValueError),
    ("num_warps", 0, ValueError), ("block_m", 48, ValueError), ("num_stages", 0, ValueError),
    ("fp8_format", "e5m2", ValueError), ("qk_quant_gran", "per_tensor", ValueError),
    ("pv_precision", "fp8+residual", ValueError), ("pv_precision", "int4", ValueError),
    ("pv_accum_dtype", "fp64", ValueError), ("use_tma", "yes", TypeError), ("max_registers", -1, ValueError),
])
def test_bad_config_fields_are_named(field, value, err):
    q, k, v = qkv()
    cfg = KernelConfig().replace(**{field: value})
    with pytest.raises(err, match=f"config.{field}"):
        sageattn(q, k, v, config=cfg)


def test_config_must_be_a_kernel_config():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="KernelConfig"):
        sageattn(q, k, v, config={"block_m": 64})
    with pytest.raises(ValueError, match="fp8_format"):
        sageattn(q, k, v, config=KernelConfig(pv_precision="fp8"))
    with pytest.raises(ValueError, match="block_n"):
        sageattn(q, k, v, config=KernelConfig(pv_precision="int8", block_n=16))
    with pytest.raises(ValueError, match="v_residual"):
        sageattn(q, k, v, config=KernelConfig(pv_precision="int8", v_residual=True))


def _hostile_cases():
    q, k, v = qkv()
    yield "masks", (q, k, v), dict(attn_mask=hostile_mask()[[0, 1, 2, 3, 4, 5, 6]].repeat(2, 1)[:LQ])
    bool_mask = torch.ones(LQ, LK, dtype=torch.bool)
    bool_mask[2] = False
    yield "bool", (q, k, v), dict(attn_mask=bool_mask)
    yield "huge", ((q * 3000).half(), (k * 3000).half(), v), {}
    qn = q.clone()
    qn[0, 1, 4, 0] = float("nan")
    vi = v.clone()
    vi[0, 0, 3, 1] = float("inf")
    yield "nan", (qn, k, vi), {}
    yield "negative scale", (q, k, v), dict(sm_scale=-0.7)


@pytest.mark.parametrize("name,inputs,kw", list(_hostile_cases()), ids=lambda x: x if isinstance(x, str) else "")
def test_references_agree_with_float64_sdpa(name, inputs, kw):
    """``exact_attention`` is float64 SDPA (it returned the sum of V on -finfo.max rows);
    ``quantized_reference`` follows it on every hostile case (it returned 0 there), INT8 P·V included."""
    q, k, v = inputs
    mask, scale = kw.get("attn_mask"), kw.get("sm_scale")
    want = sdpa64(q, k, v, mask, scale)
    exact, _ = ref.exact_attention(q, k, v, attn_mask=mask, sm_scale=scale)
    assert torch.equal(torch.isnan(exact), torch.isnan(want)) and torch.equal(torch.isinf(exact), torch.isinf(want))
    ok = torch.isfinite(want)
    assert torch.allclose(exact[ok], want[ok], atol=1e-12, rtol=1e-9)
    for pv in ("fp16", "int8"):
        got, _ = ref.quantized_reference(q, k, v, KernelConfig("per_warp", pv), attn_mask=mask, sm_scale=scale)
        assert (~torch.isfinite(got))[~ok].all(), pv
        rows = ok.all(-1)
        if name == "huge":  # INT8 rounding of Q and K may reorder top keys closer than 1 %
            top = (q.double() @ k.double().transpose(-1, -2)).topk(2, dim=-1).values
            rows &= (top[..., 0] - top[..., 1]) > 0.01 * top[..., 0].abs()
        assert cosine(got[rows], want[rows]) >= 0.999, pv


def test_scale_zero_averages_v():
    q, k, v = qkv()
    out = sageattn(q, k, v, sm_scale=0.0)
    assert torch.allclose(out.double(), v.double().mean(2, keepdim=True).expand_as(out), atol=2e-3)
    assert math.isclose(cosine(out, sdpa64(q, k, v, scale=0.0)), 1.0, abs_tol=1e-5)
