"""The long-sequence kernel's last-wave split: its plan, and its shares' merge in turn (``merge_rows``,
through the interpreter) against exact softmax attention.

The Gluon kernel itself needs a Hopper GPU (bench/gpu_check.py runs it there, split and whole);
what each of its shares merges is exactly what is built here from torch: its finished output rows,
the row max in base-2 units and the row sum of P.
"""
import math

import pytest
import torch
import triton
import triton.language as tl
from sagetriton.kernels import tail_split
from sagetriton.kernels.arch import default_config
from sagetriton.kernels.tail_split import merge_rows, plan_tail


def test_whole_waves_are_not_split():
    assert plan_tail(1980, 132, 256) == (1980, 1)  # 15.0 waves
    assert plan_tail(132, 132, 256) == (132, 1)


def test_a_partial_last_wave_is_split_into_at_most_two_waves_of_shares():
    n_whole, splits = plan_tail(2052, 132, 256)  # 32K tokens, 12 heads: 15.5 waves
    assert n_whole == 1980 and splits > 1
    tail_units = (2052 - n_whole) * splits
    assert tail_units <= tail_split.MAX_UNITS_PER_SM * 132  # bounds the workspace
    # The tail now costs at most two thirds of a whole CTA's time, against a whole one unsplit.
    assert math.ceil(tail_units / 132) / splits <= 2 / 3
    n_whole, splits = plan_tail(4104, 132, 256)  # Wan 2.1 at 480p: 31.1 waves, a tail of 12 CTAs
    assert n_whole == 4092 and splits >= 8


def test_fewer_ctas_than_sms_split_too():
    assert plan_tail(64, 132, 48) == (0, 2)  # one head pair at 6K tokens: half the SMs idle otherwise


def test_short_key_ranges_are_not_cut_below_the_minimum_share():
    assert plan_tail(66, 132, 2 * tail_split.MIN_TILES_PER_SPLIT - 1) == (66, 1)
    n_whole, splits = plan_tail(10, 132, 3 * tail_split.MIN_TILES_PER_SPLIT)
    assert n_whole == 0 and splits == 3


def test_a_nearly_full_last_wave_is_left_alone():
    assert plan_tail(132 + 131, 132, 256) == (263, 1)  # no split count beats one wave by enough


def test_heads_for_one_call_that_runs_both_kernels():
    heads = tail_split.heads_with_split_tail(33, 9, 132)
    n_whole, splits = plan_tail(33 * heads, 132, 9)
    assert n_whole > 0 and splits > 1
    for fewer in range(2, heads):
        n_whole, splits = plan_tail(33 * fewer, 132, 9)
        assert n_whole == 0 or splits == 1


def test_the_split_launch_overlaps_the_whole_one(monkeypatch):
    """Hopper calls recorded on meta tensors, as the cross-compile check builds them: after whole
    CTAs, the split kernel is a programmatic dependent launch and the whole kernel triggers it, so
    key shares start as SMs free up (bench/NOTES.md, attempt 30). The whole kernel is itself a dependent
    launch of the V conversion (attempt 49), which it waits for before it triggers. With no whole CTAs
    before it, the split kernel would follow the V conversion, whose output it reads without waiting:
    an ordinary launch."""
    import inspect

    from sagetriton.installer import crosscompile
    from sagetriton.kernels import api, checks, hopper_gluon, hopper_host, host, host_quant

    if not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    for m in (checks, host, host_quant, hopper_host):  # nothing runs: launches are recorded
        monkeypatch.setattr(m, "interpreter_enabled", lambda: False)
    cfg = default_config(crosscompile.parse_target("sm90").arch_info(), 128)
    assert "griddepcontrol.launch_dependents" in inspect.getsource(hopper_gluon._attention.fn)

    def launches(heads):
        q = torch.empty((1, heads, cfg.shared_kv_min_len, 128), dtype=torch.bfloat16, device="meta")
        with crosscompile.record_launches() as recorded:
            api.attention_forward(q, q, q, "HND", False, None, None, False, cfg, True, False)
        return {s["name"]: s["options"] for s in recorded}

    both = launches(tail_split.heads_with_split_tail(*hopper_gluon.grid(cfg.shared_kv_min_len, cfg.shared_kv_min_len),
                                                     132))
    assert both["shared_kv_split_kernel"].get("launch_pdl") is True
    assert both["shared_kv_attention_kernel"].get("launch_pdl") is True
    source = inspect.getsource(hopper_gluon._attention.fn)
    assert source.index("griddepcontrol.wait") < source.index("griddepcontrol.launch_dependents")
    split_only = launches(2)  # 64 CTAs on 132 SMs: every CTA split
    assert "shared_kv_attention_kernel" not in split_only
    assert split_only["shared_kv_split_kernel"].get("launch_pdl") is False


@pytest.mark.parametrize("head_dim, gluon", [(128, True), (96, True), (100, False), (72, True), (66, False)])
def test_the_hopper_kernel_takes_head_dims_its_16_byte_stores_can_write(monkeypatch, head_dim, gluon):
    """The Gluon kernel stores its output in 16-byte pieces whose alignment it states to the compiler
    (bench/NOTES.md, attempt 39): true only when head_dim is a multiple of 8, so any other head_dim
    (still padded to 128) goes to the portable kernel, which makes no such claim."""
    from sagetriton.installer import crosscompile
    from sagetriton.kernels import api, checks, hopper_gluon, hopper_host, host, host_quant

    if not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    for m in (checks, host, host_quant, hopper_host):  # nothing runs: launches are recorded
        monkeypatch.setattr(m, "interpreter_enabled", lambda: False)
    cfg = default_config(crosscompile.parse_target("sm90").arch_info(), head_dim)
    q = torch.empty((1, 2, cfg.shared_kv_min_len, head_dim), dtype=torch.bfloat16, device="meta")
    with crosscompile.record_launches() as recorded:
        api.attention_forward(q, q, q, "HND", False, None, None, False, cfg, True, False)
    names = {s["name"] for s in recorded}
    assert ("shared_kv_split_kernel" in names) is gluon, names
    assert ("attention_kernel" in names) is not gluon, names


def _finished_shares(q, k, v, shares, tile, v_scale, v_mean):
    """What each key share of the split kernel holds before its merge: its finished output rows (fp64,
    normalized over its own keys, V's scale and mean applied), row max in base-2 units, row sum of P."""
    s2 = (q.double() @ k.double().transpose(-1, -2)) * math.log2(math.e) / math.sqrt(q.shape[-1])
    n_tiles = math.ceil(k.shape[-2] / tile)
    out = []
    for p in range(shares):
        lo, hi = p * n_tiles // shares * tile, min((p + 1) * n_tiles // shares * tile, k.shape[-2])
        x = s2[..., lo:hi]
        m = x.amax(-1)
        e = torch.exp2(x - m[..., None])
        l_sum = e.sum(-1)
        out.append(((e @ v[..., lo:hi, :].double()) / l_sum[..., None] * v_scale + v_mean, m, l_sum))
    return out


@triton.jit
def _merge_in_turn_kernel(Rows, M, L, Out, ML, splits, ROWS: tl.constexpr, D: tl.constexpr):
    """The split kernel's hand-over for one warpgroup's rows, its shares run one after the other:
    share p reads what 0..p-1 left in Out (in Out's dtype) and ML, merges its own rows, writes back."""
    r = tl.arange(0, ROWS)
    tile = r[:, None] * D + tl.arange(0, D)[None, :]
    for p in range(splits):
        out = tl.load(Rows + p * ROWS * D + tile).to(Out.dtype.element_ty)
        m = tl.load(M + p * ROWS + r)
        l_sum = tl.load(L + p * ROWS + r)
        if p > 0:
            prev = tl.load(Out + tile).to(tl.float32)
            m_prev, l_prev = tl.load(ML + r * 2), tl.load(ML + r * 2 + 1)
            merged, m, l_sum = merge_rows(prev, m_prev, l_prev, out.to(tl.float32), m, l_sum)
            out = merged.to(Out.dtype.element_ty)
        tl.store(Out + tile, out)
        tl.store(ML + r * 2, m)
        tl.store(ML + r * 2 + 1, l_sum)


def _merge_in_turn(shares, dtype):
    o = torch.stack([s[0] for s in shares]).float()
    m = torch.stack([s[1] for s in shares]).float()
    l_sum = torch.stack([s[2] for s in shares]).float()
    rows, d = o.shape[1:]
    out, ml = torch.full((rows, d), float("nan"), dtype=dtype), torch.full((rows, 2), float("nan"))
    _merge_in_turn_kernel[(1,)](o, m, l_sum, out, ml, len(shares), ROWS=rows, D=d)
    return out


@pytest.mark.parametrize("shares", [2, 3, 10])
def test_shares_merged_in_turn_give_the_softmax_over_every_key(seed, shares):
    """16 query rows, 300 keys in 16-key tiles: the merge is exact in fp32, and within a few roundings
    when the rows travel between shares in a 16-bit output dtype. fp16 here: the interpreter converts
    to bf16 by truncation, where the GPU (and torch) round to nearest as they do for fp16."""
    rows, d, lk, tile = 16, 32, 300, 16
    q, k, v = torch.randn(rows, d), torch.randn(lk, d) + 2 * torch.randn(1, d), torch.randn(lk, d)
    v_scale, v_mean = (torch.rand(d) + 0.5).double(), torch.randn(d).double()
    exact = torch.softmax(q.double() @ k.double().T / math.sqrt(d), -1) @ v.double() * v_scale + v_mean
    parts = _finished_shares(q, k, v, shares, tile, v_scale, v_mean)
    torch.testing.assert_close(_merge_in_turn(parts, torch.float32).double(), exact, rtol=1e-5, atol=1e-5)
    half = _merge_in_turn(parts, torch.float16).double()
    ulp = 2**-11  # fp16's relative rounding bound; one rounding per share's rows and per merge
    torch.testing.assert_close(half, exact, rtol=2 * shares * ulp, atol=2 * shares * ulp * exact.abs().max().item())
    assert (half - exact).abs().mean() < 2 * ulp * exact.abs().mean()  # unbiased: errors do not pile up


def test_a_share_without_live_keys_weighs_nothing():
    """Row max -inf and row sum 0 (no key reached): the other share's rows come out unchanged, and
    rows no share reached come out 0 as in SDPA, never NaN."""
    rows, d = 16, 32
    o = torch.randn(rows, d).double()
    live = (o, torch.randn(rows).double(), torch.rand(rows).double() + 0.5)
    dead = (torch.zeros(rows, d).double(), torch.full((rows,), float("-inf")).double(), torch.zeros(rows).double())
    for parts in ([live, dead], [dead, live]):
        torch.testing.assert_close(_merge_in_turn(parts, torch.float32).double(), o, rtol=1e-6, atol=1e-6)
    assert (_merge_in_turn([dead, dead], torch.float32) == 0).all()
