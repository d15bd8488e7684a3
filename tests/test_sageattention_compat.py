"""The drop-in's six functions (``kernels/sageattention_compat.py``) through the Triton interpreter:
SageAttention 2.x's parameters in its order, flash-attn's keywords mapped or refused, every
``pv_accum_dtype`` spelling, ``sageattn_varlen`` on the kernel, and the LSE ring attention merges with,
each against exact attention."""
import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from sagetriton.kernels import sageattention_compat as sa

# Parameter order and defaults of SageAttention 2.2's functions (its core.py), which callers rely on
# positionally and by keyword. ``sageattn`` adds ``attn_mask`` after them (ComfyUI passes it by name).
UPSTREAM = {
    "sageattn": [("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
                 ("sm_scale", None), ("return_lse", False), ("attn_mask", None)],
    "sageattn_qk_int8_pv_fp16_triton": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("quantization_backend", "triton"),
        ("is_causal", False), ("attn_mask", None), ("sm_scale", None), ("smooth_k", True), ("return_lse", False)],
    "sageattn_qk_int8_pv_fp16_cuda": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
        ("qk_quant_gran", "per_thread"), ("sm_scale", None), ("pv_accum_dtype", "fp32"), ("smooth_k", True),
        ("smooth_v", False), ("return_lse", False)],
    "sageattn_qk_int8_pv_fp8_cuda": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
        ("qk_quant_gran", "per_thread"), ("sm_scale", None), ("pv_accum_dtype", "fp32+fp16"), ("smooth_k", True),
        ("smooth_v", False), ("return_lse", False)],
    "sageattn_qk_int8_pv_fp8_cuda_sm90": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
        ("qk_quant_gran", "per_thread"), ("sm_scale", None), ("pv_accum_dtype", "fp32+fp32"), ("smooth_k", True),
        ("return_lse", False)],
    "sageattn_varlen": [
        ("q", None), ("k", None), ("v", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None), ("max_seqlen_q", None),
        ("max_seqlen_k", None), ("is_causal", False), ("sm_scale", None), ("smooth_k", True)],
}
DENSE = [n for n in UPSTREAM if n != "sageattn_varlen"]
# Every spelling SageAttention 2.2 takes per variant (its sm90 fp8 build raises on "fp32"; taken here).
ACCUM = {"sageattn_qk_int8_pv_fp16_cuda": ("fp32", "fp16", "fp16+fp32"),
         "sageattn_qk_int8_pv_fp8_cuda": ("fp32", "fp32+fp32", "fp32+fp16"),
         "sageattn_qk_int8_pv_fp8_cuda_sm90": ("fp32", "fp32+fp32")}


def exact(q, k, v, layout="HND", causal=False, scale=None, mask=None):
    """fp64 attention and its natural-log LSE, (B, H, L) as SageAttention returns it."""
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.double() for t in (q, k, v))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s + mask.double() if mask.is_floating_point() else s.masked_fill(~mask, float("-inf"))
    out = torch.softmax(s, -1) @ v
    return (out.transpose(1, 2) if layout == "NHD" else out), torch.logsumexp(s, -1)


def cos(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def qkv(layout="HND", b=1, h=4, hkv=2, lq=48, lk=48, d=32, dtype=torch.float16):
    def t(heads, n):
        x = torch.randn(b, heads, n, d, dtype=dtype)
        return x.transpose(1, 2).contiguous() if layout == "NHD" else x

    return t(h, lq), t(hkv, lk), t(hkv, lk)


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_signatures_follow_sageattention(name):
    params = list(inspect.signature(getattr(sa, name)).parameters.values())
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default)
           for p in params if p.kind is not p.VAR_KEYWORD]
    assert got == UPSTREAM[name]
    assert params[-1].kind is inspect.Parameter.VAR_KEYWORD  # unknown keywords are accepted
    assert name in sa.__all__


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_every_name_matches_exact_attention_with_its_lse(seed, name, layout):
    q, k, v = qkv(layout)
    out, lse = getattr(sa, name)(q, k, v, tensor_layout=layout, return_lse=True)
    ref, ref_lse = exact(q, k, v, layout)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (1, 4, 48) and lse.dtype == torch.float32
    assert cos(out, ref) > 0.995, name
    assert (lse.double() - ref_lse).abs().max() < 0.05, name  # 25 seeds: at most 0.018


@pytest.mark.parametrize("name", DENSE)
def test_flash_attn_keywords_are_mapped_not_ignored(seed, name):
    """yunchang's ring steps pass ``causal`` and ``softmax_scale``; SageAttention 2.2 drops them silently
    (cos 0.48-0.74 on such calls). Here they mean what flash-attn means, and the neutral ones pass."""
    q, k, v = qkv("NHD")
    fn = getattr(sa, name)
    flash = dict(dropout_p=0.0, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax=False,
                 deterministic=False, some_future_option=1)
    out, lse = fn(q, k, v, tensor_layout="NHD", return_lse=True, softmax_scale=0.31, causal=True, **flash)
    direct, direct_lse = fn(q, k, v, tensor_layout="NHD", return_lse=True, sm_scale=0.31, is_causal=True)
    assert torch.equal(out, direct) and torch.equal(lse, direct_lse)
    ref, ref_lse = exact(q, k, v, "NHD", causal=True, scale=0.31)
    assert cos(out, ref) > 0.995
    # The logits' INT8 error grows with the scale (1.75x the default here): 25 seeds gave at most 0.059.
    assert (lse.double() - ref_lse).abs().max() < 0.12


@pytest.mark.parametrize("keyword, value", [("dropout_p", 0.1), ("window_size", (16, 0)), ("softcap", 30.0),
                                            ("alibi_slopes", torch.ones(4)), ("return_softmax", True)])
def test_what_the_kernel_cannot_do_is_refused_by_name(keyword, value):
    q, k, v = qkv()
    for name in DENSE:
        with pytest.raises(ValueError, match=keyword):
            getattr(sa, name)(q, k, v, **{keyword: value})


def test_contradicting_keywords_are_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="softmax_scale"):
        sa.sageattn(q, k, v, sm_scale=0.2, softmax_scale=0.3)
    with pytest.raises(ValueError, match="causal"):
        sa.sageattn(q, k, v, is_causal=True, causal=False)


@pytest.mark.parametrize("name", sorted(ACCUM))
def test_every_pv_accum_dtype_spelling_runs(seed, name):
    q, k, v = qkv()
    ref, _ = exact(q, k, v)
    for accum in ACCUM[name]:
        assert cos(getattr(sa, name)(q, k, v, pv_accum_dtype=accum), ref) > 0.995, accum
    with pytest.raises(ValueError, match="pv_accum_dtype"):
        getattr(sa, name)(q, k, v, pv_accum_dtype="fp8")
    with pytest.raises(ValueError, match="qk_quant_gran"):
        getattr(sa, name)(q, k, v, qk_quant_gran="per_block")


def test_sageattn_applies_the_mask_comfyui_passes(seed):
    """ComfyUI core's attention_sage passes ``attn_mask=``; SageAttention 2.2 ignores it."""
    q, k, v = qkv("NHD", h=2, hkv=2)
    mask = torch.randn(1, 1, 48, 48).to(torch.float16)
    ref, _ = exact(q, k, v, "NHD", mask=mask)
    assert cos(sa.sageattn(q, k, v, tensor_layout="NHD", attn_mask=mask, is_causal=False), ref) > 0.995
    keep = torch.rand(1, 1, 48, 48) > 0.3
    keep[..., 0] = True
    ref, _ = exact(q, k, v, "NHD", mask=keep)
    assert cos(sa.sageattn(q, k, v, tensor_layout="NHD", attn_mask=keep), ref) > 0.995


@pytest.mark.parametrize("lengths", [([20, 7, 33], [20, 7, 33]), ([16, 16], [24, 24]), ([5, 40], [30, 12])])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_runs_each_sequence_on_the_kernel(seed, lengths, causal):
    lq, lk = lengths
    if causal and lq != lk:
        pytest.skip("causal varlen: query and key lengths equal per sequence (as SageAttention documents)")
    h, hkv, d = 4, 2, 32
    q = torch.randn(sum(lq), h, d, dtype=torch.bfloat16)
    k = torch.randn(sum(lk), hkv, d, dtype=torch.bfloat16)
    v = torch.randn(sum(lk), hkv, d, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), is_causal=causal, sm_scale=0.2)
    assert out.shape == q.shape and out.dtype == q.dtype
    for i in range(len(lq)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        ref, _ = exact(q[None, qs], k[None, ks], v[None, ks], "NHD", causal=causal, scale=0.2)
        assert cos(out[qs], ref[0]) > 0.995, i


def test_varlen_refuses_offsets_that_do_not_cover_the_tokens():
    q = torch.randn(10, 2, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        sa.sageattn_varlen(q, q, q, torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 4, 10]), 5, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        sa.sageattn_varlen(q, q, q, torch.tensor([0, 10]), torch.tensor([0.0, 10.0]), 10, 10)
