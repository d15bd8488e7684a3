"""What bench/gpu_check.py asks of huge logits (q, k x3000), checked on the CPU with the torch references.

At logits around 1e7 every row is nearly one-hot, and INT8 rounding of Q and K may reorder keys whose
logits are within a few %: the check must pass the method's own answer and fp64's, and fail a row that is
neither (or a partly NaN row), so that a GPU run cannot pass a wrong kernel or fail a right one."""

import pytest
import torch
from sagetriton.kernels import reference as ref
from sagetriton.kernels.arch import CPU_ARCH, default_config

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def gpu_check(bench_script):
    return bench_script("gpu_check")


@pytest.fixture(scope="module")
def huge():
    g = torch.Generator().manual_seed(39)
    q, k, v = (torch.randn(1, 2, n, 128, generator=g).to(torch.bfloat16) for n in (300, 333, 333))
    k = k + 2 * torch.randn(128, generator=g).to(torch.bfloat16)
    big_q, big_k = (q.float() * 3000).to(q.dtype), (k.float() * 3000).to(k.dtype)
    return big_q, big_k, v, default_config(CPU_ARCH, 128).with_pv_choice("fp16")


def test_the_methods_answer_passes_and_reorders_some_rows(gpu_check, huge):
    q, k, v, cfg = huge
    ok, detail = gpu_check.huge_logit_rows(ref.quantized_reference(q, k, v, cfg)[0], q, k, v, cfg)
    assert ok, detail
    assert "as the method only 0," not in detail, "the case no longer reorders any row: it tests nothing"


def test_fp64s_answer_passes(gpu_check, huge):
    q, k, v, cfg = huge
    ok, detail = gpu_check.huge_logit_rows(ref.exact_attention(q, k, v)[0], q, k, v, cfg)
    assert ok, detail


@pytest.mark.parametrize("damage", ["another key's value", "half a row NaN"])
def test_a_wrong_row_fails(gpu_check, huge, damage):
    q, k, v, cfg = huge
    out = ref.quantized_reference(q, k, v, cfg)[0].clone()
    if damage == "another key's value":
        top = (q.double() @ k.double().transpose(-1, -2))[0, 0, 7].argsort()[0]  # the row's lowest logit
        out[0, 0, 7] = v[0, 0, top]
    else:
        out[0, 1, 9, :64] = float("nan")
    ok, detail = gpu_check.huge_logit_rows(out, q, k, v, cfg)
    assert not ok, detail


@pytest.fixture(scope="module")
def sparse_check(bench_script):
    return bench_script("sparse_check")


@pytest.fixture(scope="module")
def sparse_huge(sparse_check):
    """sparse_check's hostile input on the CPU (NHD, fp32 at x3000) and the method's fp64 answer."""
    sparse_check.DEVICE = "cpu"
    q, k, v = sparse_check.smooth_qkv(300, H=2, H_KV=2, seed=11)
    q, k, v = q.float() * 3000, k.float() * 3000, v.float()
    from sagetriton.kernels import sparse_reference as sref

    return q, k, v, sref.sparse_reference(q, k, v, 1.0)


def _ranked(q, k, row, head):
    return (q.double()[0, row, head] @ k.double()[0, :, head].T).argsort(descending=True)


def test_sparse_huge_logits_pass_fp64s_answer_and_a_near_winners(sparse_check, sparse_huge):
    q, k, v, ref_out = sparse_huge
    assert sparse_check.huge_logit_rows(ref_out, q, k, v, ref_out)[0]
    logits = q.double()[0, :, 0] @ k.double()[0, :, 0].T
    top = logits.topk(2, dim=-1).values
    close = ((top[:, 0] - top[:, 1]) < 0.02 * top[:, 0].abs()).nonzero()
    assert len(close), "no row has a near-tie: the case tests nothing"
    row = int(close[0])
    out = ref_out.clone()
    out[0, row, 0] = v[0, _ranked(q, k, row, 0)[1], 0]  # the runner-up's value, as INT8 rounding may pick
    ok, detail = sparse_check.huge_logit_rows(out, q, k, v, ref_out)
    assert ok and "1 a near-winner's" in detail, detail
    out[0, 40:50, 1] = float("nan")  # whole rows NaN: the overflow guard's answer
    assert sparse_check.huge_logit_rows(out, q, k, v, ref_out)[0]


@pytest.mark.parametrize("damage", ["the lowest key's value", "half a row NaN"])
def test_sparse_huge_logits_fail_a_wrong_row(sparse_check, sparse_huge, damage):
    q, k, v, ref_out = sparse_huge
    out = ref_out.clone()
    if damage == "the lowest key's value":
        out[0, 7, 0] = v[0, _ranked(q, k, 7, 0)[-1], 0]
    else:
        out[0, 9, 1, :64] = float("nan")
    ok, detail = sparse_check.huge_logit_rows(out, q, k, v, ref_out)
    assert not ok, detail
