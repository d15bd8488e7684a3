"""The sparse kernel's exact-block loop, two listed blocks per step (``kernels/sparse_tile.py``), and an
odd count's last block alone: every P·V format and both K scalings, on lists with odd and even
counts, against the fp64 reference (through the interpreter). The GPUs' choice of the step
(``sparse_launch.exact_pairs``) is forced here both ways."""
import pytest
import sagetriton.kernels as kernels
import torch
from sagetriton.kernels import sparse_launch
from sagetriton.kernels import sparse_reference as sref
from sagetriton.kernels.arch import ArchInfo, default_config
from test_sparse import budget, gpu_config, rel, smooth_qkv

# (length, options): every block routed (7 full blocks: three pairs and one alone; 7 full and the ragged
# last one), the router's own counts with a short last block (1-3) and by top-k (5-6).
CASES = ((448, dict(tau=-1e9)), (460, dict(tau=-1e9)), (460, dict(tau=0.7)), (512, dict(topk_ratio=0.45)))


def full_block_counts(q, k, T, kw) -> torch.Tensor:
    """Listed blocks per (head, query block) that run through the unchecked loop (the ragged last is apart)."""
    exact = sref.route_reference(q, k, kw.get("tau", 1.3), topk_ratio=kw.get("topk_ratio"))["exact"]
    n = exact.sum(-1)
    return n - exact[..., -1].long() if T % 64 else n


@pytest.fixture(params=[True, False], ids=["pairs", "single"])
def pairs(request, monkeypatch):
    monkeypatch.setitem(sparse_launch.TUNING, "attn_pairs", request.param)
    return request.param


@pytest.mark.parametrize("gran", ["per_block", "per_thread"])  # one K scale per 64-key block / per token
@pytest.mark.parametrize("pv", ["fp16", "fp16_tile", "fp8", "fp8+residual", "int8"])
def test_odd_and_even_block_counts_match_the_reference_in_every_pv_mode(pv, gran, monkeypatch):
    monkeypatch.setitem(sparse_launch.TUNING, "attn_pairs", True)  # one block per step: test_sparse.py's tests
    cfg = gpu_config(gran, "fp16" if pv == "fp16_tile" else pv, False)
    if pv == "fp16_tile":
        cfg = cfg.replace(pv_accum_dtype="fp16")
    counts = []
    for T, kw in CASES:
        q, k, v = smooth_qkv(T, H=2, H_KV=1, seed=T, dtype=torch.bfloat16)
        counts.append(full_block_counts(q, k, T, kw).flatten())
        out, lse = kernels.sparse_attn(q, k, v, config=cfg, return_lse=True, **kw)
        ref, ref_lse = sref.sparse_reference(q, k, v, return_lse=True, **kw)
        assert rel(out, ref) <= budget(q, k, v, config=cfg), (T, kw, rel(out, ref))
        torch.testing.assert_close(lse, ref_lse, atol=0.05, rtol=0)
    counts = torch.cat(counts)
    # the loop's every shape ran: one block alone, one pair, pairs with and without a block alone
    assert {1, 2, 3, 5, 6, 7} <= set(counts.tolist()), sorted(set(counts.tolist()))


@pytest.mark.parametrize("pv", ["fp8", "int8"])
def test_a_nan_value_in_either_block_of_a_pair_reaches_its_rows(pv, pairs):
    """V's NaN channel reaches every row through whichever block of a pair holds it (the pair's one
    tile sum), with one K scale per block and per token."""
    for gran in ("per_block", "per_thread"):
        cfg = gpu_config(gran, pv, False)
        for token in (10, 70):  # the first / second block of the first pair
            q, k, v = smooth_qkv(256, H=1, H_KV=1, seed=21, dtype=torch.bfloat16)
            v[0, token, 0, 1] = float("nan")
            out = kernels.sparse_attn(q, k, v, tau=-1e9, config=cfg)
            assert torch.isnan(out[..., 1]).all() and torch.isfinite(out[..., 2:]).all(), (gran, token)


def test_pairs_are_chosen_where_the_step_was_built_in_registers(monkeypatch):
    def choice(family, pv, k_scalar=True):
        arch = ArchInfo("nvidia", "sm90" if family == "hopper" else "sm89", family, fp8="e4m3fn")
        cfg = default_config(arch, 128)
        return sparse_launch.exact_pairs(sparse_launch.sparse_config(cfg.with_pv_choice(pv)), k_scalar)

    assert choice("hopper", "fp8") and choice("hopper", "int8") and choice("hopper", "fp8+residual")
    assert not choice("hopper", "fp16") and not choice("hopper", "fp8", k_scalar=False)
    assert not choice("ada", "int8") and not choice("ada", "fp8")
    monkeypatch.setitem(sparse_launch.TUNING, "attn_pairs", True)
    assert choice("ada", "int8")
