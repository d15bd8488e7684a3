"""The long-sequence kernel's last-wave split: its plan, and the merge kernel (interpreter) against torch.

The Gluon kernel itself needs a Hopper GPU (bench/gpu_check.py runs it there, split and whole);
what it hands the merge is exactly what is built here from torch: per key share, the unnormalized
P·V sums, the row max in base-2 units and the row sum of P.
"""
import math

import pytest
import torch
from sagetriton.kernels import tail_split
from sagetriton.kernels.arch import default_config
from sagetriton.kernels.tail_split import plan_tail


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
    key shares start as SMs free up (bench/NOTES.md, attempt 30). With no whole CTAs before it, the
    split kernel would follow the quantization kernels, whose output it reads: an ordinary launch."""
    import inspect

    from sagetriton.kernels import api, crosscompile, hopper_gluon

    if not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(api, "interpreter_enabled", lambda: False)  # nothing runs: launches are recorded
    cfg = default_config(crosscompile.parse_target("sm90").arch_info(), 128)
    assert "griddepcontrol.launch_dependents" in inspect.getsource(hopper_gluon._attention.fn)

    def launches(heads):
        q = torch.empty((1, heads, cfg.shared_kv_min_len, 128), dtype=torch.bfloat16, device="meta")
        monkeypatch.setattr(api, "_recorded", [])
        api.attention_forward(q, q, q, "HND", False, None, None, False, cfg, True, False)
        return {s["name"]: s["options"] for s in api._recorded}

    both = launches(tail_split.heads_with_split_tail(*hopper_gluon.grid(cfg.shared_kv_min_len, cfg.shared_kv_min_len),
                                                     132))
    assert both["shared_kv_split_kernel"].get("launch_pdl") is True
    assert not both["shared_kv_attention_kernel"].get("launch_pdl")
    split_only = launches(2)  # 64 CTAs on 132 SMs: every CTA split
    assert "shared_kv_attention_kernel" not in split_only
    assert split_only["shared_kv_split_kernel"].get("launch_pdl") is False


@pytest.mark.parametrize("head_dim, gluon", [(128, True), (96, True), (100, False), (72, True), (66, False)])
def test_the_hopper_kernel_takes_head_dims_its_16_byte_stores_can_write(monkeypatch, head_dim, gluon):
    """The Gluon kernel stores its output in 16-byte pieces whose alignment it states to the compiler
    (bench/NOTES.md, attempt 39): true only when head_dim is a multiple of 8, so any other head_dim
    (still padded to 128) goes to the portable kernel, which makes no such claim."""
    from sagetriton.kernels import api, crosscompile, hopper_gluon

    if not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.setattr(api, "interpreter_enabled", lambda: False)  # nothing runs: launches are recorded
    cfg = default_config(crosscompile.parse_target("sm90").arch_info(), head_dim)
    q = torch.empty((1, 2, cfg.shared_kv_min_len, head_dim), dtype=torch.bfloat16, device="meta")
    monkeypatch.setattr(api, "_recorded", [])
    api.attention_forward(q, q, q, "HND", False, None, None, False, cfg, True, False)
    names = {s["name"] for s in api._recorded}
    assert ("shared_kv_split_kernel" in names) is gluon, names
    assert ("attention_kernel" in names) is not gluon, names


def _partials(q, k, v, shares, tile):
    """What the split kernel leaves per share: fp32 sums of P·V, row max (base 2), row sum of P."""
    s2 = (q.double() @ k.double().transpose(-1, -2)) * math.log2(math.e) / math.sqrt(q.shape[-1])
    n_tiles = math.ceil(k.shape[-2] / tile)
    out = []
    for p in range(shares):
        lo, hi = p * n_tiles // shares * tile, min((p + 1) * n_tiles // shares * tile, k.shape[-2])
        x = s2[..., lo:hi]
        m = x.amax(-1)
        e = torch.exp2(x - m[..., None])
        out.append(((e @ v[..., lo:hi, :].double()).float(), m.float(), e.sum(-1).float()))
    return out


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_merge_kernel_matches_softmax_over_every_key(seed, layout):
    """Two tail CTAs (of 4 row blocks, the last one past LQ) of a GQA call, 3 shares each."""
    B, H, H_KV, LQ, LK, D, D_PAD = 1, 4, 2, 44, 100, 12, 16
    cta_rows, block_r, shares, tile = 16, 8, 3, 16
    q = torch.randn(B, H, LQ, D)
    k = torch.randn(B, H_KV, LK, D).repeat_interleave(H // H_KV, dim=1)
    v = torch.randn(B, H_KV, LK, D).repeat_interleave(H // H_KV, dim=1)
    v_scale, v_mean = torch.rand(B * H_KV, D) + 0.5, torch.randn(B * H_KV, D)
    n_m = math.ceil(LQ / cta_rows)  # 3 CTAs per head, the last one partial
    n_cta = n_m * B * H
    n_whole = n_cta - 2  # the last two: head 3's CTAs 1 and 2
    parts = _partials(q, k, v, shares, tile)
    rows = (n_cta - n_whole) * shares * cta_rows
    part, part_ml = torch.full((rows, D_PAD), float("nan")), torch.full((rows, 2), float("nan"))
    for t in range(n_cta - n_whole):
        cta = n_whole + t
        bh, row0 = divmod(cta, n_m)
        b, h = divmod(bh, H)
        r = torch.arange(row0 * cta_rows, (row0 + 1) * cta_rows).clamp(max=LQ - 1)  # rows past LQ: any value
        for p, (acc, m, l_sum) in enumerate(parts):
            dst = slice((t * shares + p) * cta_rows, (t * shares + p + 1) * cta_rows)
            part[dst] = torch.nn.functional.pad(acc[b, h, r], (0, D_PAD - D))
            part_ml[dst, 0], part_ml[dst, 1] = m[b, h, r], l_sum[b, h, r]
    out = torch.zeros(B, H, LQ, D) if layout == "HND" else torch.zeros(B, LQ, H, D)
    oh = out if layout == "HND" else out.permute(0, 2, 1, 3)
    tail_split.merge_splits_kernel[((n_cta - n_whole) * cta_rows // block_r,)](
        part, part_ml, v_scale, v_mean, oh, *oh.stride(), H, H_KV, LQ, D, n_whole, shares,
        CTA_ROWS=cta_rows, BLOCK_R=block_r, D_PAD=D_PAD, HAS_VSCALE=True, HAS_VMEAN=True)
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(D), -1) @ v.double()
    bhk = torch.arange(B * H) // (H // H_KV)
    exact = exact * v_scale[bhk].view(B, H, 1, D).double() + v_mean[bhk].view(B, H, 1, D).double()
    written = torch.zeros(B, H, LQ, dtype=torch.bool)
    written[0, 3, cta_rows:] = True  # head 3, rows of CTAs 1 and 2
    torch.testing.assert_close(oh[written].double(), exact[written], rtol=1e-5, atol=1e-5)
    assert (oh[~written] == 0).all()  # the whole CTAs' rows are not the merge's to write
