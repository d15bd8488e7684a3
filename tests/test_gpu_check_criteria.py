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
