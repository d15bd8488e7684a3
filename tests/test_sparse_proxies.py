"""The router's inputs and lists made on the tensor cores (issue 54, the routing share), through the interpreter:
``sparse_quant.quantize_with_means``'s block means and per-row dots from small MMAs of the 16-bit rows (``mma_sums``,
the default) or fp32 reductions, against fp64, with the INT8 copy and scales the same bits either way; the V pool's
block sums likewise (``TUNING["pool_mma_sums"]``); the router's prefix sum as an MMA (``TUNING["route_scan_mma"]``):
the same lists, counts and tails as ``tl.cumsum``'s."""
import pytest
import torch
from sagetriton.kernels import api, quant, rotation, sparse_launch, sparse_quant, sparse_route
from sagetriton.kernels.sparse_reference import BLOCK


def inputs(T, H, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, T, H, D, generator=g) * 2 + torch.randn(D, generator=g)).to(dtype)
    centre = torch.randn(H, D, generator=g) * 0.5
    mu = centre + torch.randn(H, D, generator=g) * 0.1
    return x.permute(0, 2, 1, 3), centre, mu  # (B, H, L, D) strided view of an NHD tensor


def run(x, centre, mu, method, rows, mma, bias=True):
    D = x.shape[-1]
    rotate = 64 if method else 0
    signs = api._rotation_signs(D, rotate, x.device, x.dtype) if method == "tiled" else None
    k_centre = centre @ signs.float() if signs is not None else centre
    k = sparse_quant.quantize_with_means(x, BLOCK, rows, D, 1.0, k_centre, subtract=True, per_block=True,
                                         rotate=rotate, method=method or "dot", mma_sums=mma)
    q = sparse_quant.quantize_with_means(x, 1, rows, D, 0.7, centre, mu=mu, off_mult=0.3,
                                         bias_mult=0.2 if bias else None, rotate=rotate, method=method or "dot",
                                         mma_sums=mma)
    return k, q


@pytest.mark.parametrize("T,dtype,method,rows", [(200, torch.bfloat16, "tiled", 64), (130, torch.float16, "tiled", 64),
                                                 (300, torch.bfloat16, "dot", 128), (70, torch.float16, None, 128),
                                                 (1, torch.bfloat16, "tiled", 64)])
def test_block_means_and_row_dots_from_mmas_are_fp32_sums(T, dtype, method, rows):
    x, centre, mu = inputs(T, 2, 64, dtype, seed=T)
    (k8, ks, kbar, _, _), (q8, qs, cen, off, bias) = run(x, centre, mu, method, rows, mma=True)
    xd = x.double()
    nb = -(-T // BLOCK)
    pad = torch.nn.functional.pad(xd, (0, 0, 0, nb * BLOCK - T))
    n_live = torch.tensor([min(BLOCK, T - i * BLOCK) for i in range(nb)], dtype=torch.float64)
    means = (pad.reshape(2, nb, BLOCK, 64).sum(2) / n_live[:, None]).float()
    for got in (kbar, cen):
        torch.testing.assert_close(got, means, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(off, (xd[0] @ ((mu - centre).double() * 0.3)[:, :, None])[..., 0].float().reshape(2, T),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bias, (xd[0] @ (centre.double() * 0.2)[:, :, None])[..., 0].float().reshape(2, T),
                               rtol=1e-5, atol=1e-5)
    # The INT8 copy and its scales do not depend on how the sums are made.
    (k8r, ksr, kbar_r, _, _), (q8r, qsr, cen_r, off_r, bias_r) = run(x, centre, mu, method, rows, mma=False)
    assert torch.equal(k8, k8r) and torch.equal(q8, q8r)
    assert torch.equal(ks, ksr) and torch.equal(qs, qsr)
    torch.testing.assert_close(kbar, kbar_r, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(off, off_r, rtol=1e-5, atol=1e-5)


def test_a_non_finite_shift_makes_every_row_dot_nan():
    x, centre, mu = inputs(90, 1, 64, torch.bfloat16, seed=3)
    mu[0, 5] = float("inf")
    _, (_, _, _, off, _) = run(x, centre, mu, "tiled", 64, mma=True, bias=False)
    assert torch.isnan(off).all()


@pytest.mark.parametrize("D,dtype,method,per_block", [(64, torch.bfloat16, "tiled", False),
                                                      (64, torch.float16, "tiled", True),
                                                      (48, torch.bfloat16, "dot", True),
                                                      (80, torch.float32, None, False)])
def test_the_sparse_launch_rounds_as_the_dense_one(D, dtype, method, per_block):
    """``sparse_quantize_int8_kernel`` is the dense quantization (``quant``'s bodies) with the block means as a
    hook: its INT8 copy and scales are the dense launch's bits, Q as it is and K centred (the dense K mean buffer
    holding the same centre; padded head dims too)."""
    T, H = 150, 2
    d_pad = max(32, 1 << (D - 1).bit_length())
    x, _, _ = inputs(T, H, D, dtype, seed=D)
    rows = 128 if method == "dot" else 64
    rotate = min(d_pad, 64) if method else 0
    group = rows if per_block else 1
    q8, qs, *_ = sparse_quant.quantize_with_means(x, group, rows, d_pad, 0.7, per_block=per_block, rotate=rotate,
                                                  method=method or "dot")
    d8, ds = api._quantize_qk(x, group, rows, d_pad, 0.7, per_block=per_block, rotate=rotate, method=method or "dot")
    assert torch.equal(q8, d8) and torch.equal(qs, ds)
    if method == "tiled":
        return  # K's tiled centring: the rotated centre, which the dense path makes in its own launch
    centre = torch.nn.functional.pad(torch.randn(H, D, generator=torch.Generator().manual_seed(1)), (0, d_pad - D))
    k8, ks, *_ = sparse_quant.quantize_with_means(x, group, rows, d_pad, 1.0, centre, subtract=True,
                                                  per_block=per_block, rotate=rotate, method=method or "dot")
    final = torch.zeros(3, H, D)
    final[0] = centre[:, :D]
    d8, ds = api._quantize_qk(x, group, rows, d_pad, 1.0, quant.MEAN_SUBTRACT, (final, 0, T, T, final),
                              per_block=per_block, rotate=rotate, method=method or "dot")
    assert torch.equal(k8, d8) and torch.equal(ks, ds)


def test_the_sparse_call_takes_the_tuning_choice():
    """``TUNING["quant_mma_sums"]`` reaches both quantization launches of a call (the A/B switch)."""
    from sagetriton.installer import crosscompile as cc
    from sagetriton.kernels.arch import CPU_ARCH, default_config

    q = torch.empty((1, 200, 2, 64), dtype=torch.bfloat16, device="meta")
    seen = {}
    for choice in (True, False):
        old = sparse_launch.TUNING["quant_mma_sums"]
        sparse_launch.TUNING["quant_mma_sums"] = choice
        try:
            with cc.record_launches() as rec:
                sparse_launch.run(q, q, q, 1.3, "NHD", 0.125, None, None, 0.0, 0, False, False, "NHD",
                                  default_config(CPU_ARCH, 64))
        finally:
            sparse_launch.TUNING["quant_mma_sums"] = old
        seen[choice] = [s["constexprs"]["MMA_SUMS"] for s in rec if s["name"] == "sparse_quantize_int8_kernel"]
    assert seen == {True: [True, True], False: [False, False]}
    assert rotation.PIPE_STAGES >= 1


@pytest.fixture
def tuning():
    saved = dict(sparse_launch.TUNING)
    yield sparse_launch.TUNING
    sparse_launch.TUNING.clear()
    sparse_launch.TUNING.update(saved)


@pytest.mark.parametrize("T,dtype", [(300, torch.bfloat16), (65, torch.float16), (1, torch.bfloat16)])
def test_the_pool_s_block_sums_from_mmas_are_fp32_sums(tuning, T, dtype):
    x, _, _ = inputs(T, 2, 64, dtype, seed=T + 1)
    nb = -(-T // BLOCK)
    res = {}
    for mma in (True, False):
        tuning["pool_mma_sums"] = mma
        res[mma] = sparse_launch._pool_v(x, x, T, 64, nb, absmax=True)
    pad = torch.nn.functional.pad(x.double(), (0, 0, 0, nb * BLOCK - T))
    torch.testing.assert_close(res[True][0], pad.reshape(2, nb, BLOCK, 64).sum(2).float(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(res[True][0], res[False][0], rtol=1e-6, atol=1e-5)
    assert torch.equal(res[True][1], res[False][1]) and torch.equal(res[True][2], res[False][2])


@pytest.mark.parametrize("tiles,kw", [((32, 16), dict(tau=0.5)), ((64, 32), dict(tau=0.0, sinks=(1, 2))),
                                      ((32, 32), dict(tau=-1e9)), ((32, 16), dict(topk_ratio=0.3))])
def test_the_router_s_prefix_sum_as_an_mma_lists_what_cumsum_lists(tuning, tiles, kw):
    g = torch.Generator().manual_seed(5)
    nb, d, H = 70, 64, 2  # three key tiles of 32, the last ragged
    cen = torch.randn(H, nb, d, generator=g)
    kbar = torch.randn(H, nb, d, generator=g) * 0.3 + torch.linspace(0, 1, nb)[None, :, None]
    kvar, mu = torch.var_mean(kbar, dim=1, correction=0)
    vsum = torch.randn(H, nb, d, generator=g)
    res = {}
    for mma in (True, False):
        tuning["route_scan_mma"] = mma
        res[mma] = sparse_launch.route(cen, kbar - mu[:, None], vsum, kvar, 1, H, H, nb * 64 - 5, kw.get("tau", 1.0),
                                       0.18, kw.get("sinks"), None, kw.get("topk_ratio", 0.0), tiles=tiles)
    lists, count = res[True][0], res[True][1]
    assert torch.equal(count, res[False][1])
    assert 0 < int(count.sum()) <= H * nb * nb
    for h in range(H):
        for i in range(nb):
            c = int(count[h, i])
            assert torch.equal(lists[h, i, :c], res[False][0][h, i, :c])
            assert bool((lists[h, i, 1:c] > lists[h, i, :c - 1]).all())  # ascending, no repeats
    for a, b in zip(res[True][2:], res[False][2:], strict=True):
        assert torch.equal(a, b)


def _route_inputs(nb=70, H=2, d=64, seed=5, cen_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    cen = torch.randn(H, nb, d, generator=g) * cen_scale
    if cen_scale != cen_scale:  # NaN: one query block's centroid (a NaN query token)
        cen = torch.randn(H, nb, d, generator=g)
        cen[1, 37, 5] = float("nan")
    kbar = torch.randn(H, nb, d, generator=g) * 0.3 + torch.linspace(0, 1, nb)[None, :, None]
    kvar, mu = torch.var_mean(kbar, dim=1, correction=0)
    return cen, kbar - mu[:, None], torch.randn(H, nb, d, generator=g), kvar


@pytest.mark.parametrize("tiles,kw,scale", [
    ((32, 16), dict(tau=0.5), 1.0), ((64, 32), dict(tau=1.3, sinks=(1, 2)), 1.0), ((32, 16), dict(topk_ratio=0.3), 1.0),
    ((32, 32), dict(tau=-1e9), 1.0), ((32, 16), dict(tau=8.0), 60.0), ((32, 16), dict(tau=1.0), float("nan"))])
def test_the_router_s_tail_in_the_threshold_s_frame_is_the_online_tail(tuning, tiles, kw, scale):
    """``route_kernel``'s FIXED_FRAME: the same lists, counts and pooled maxima, the sums and P·V within
    rounding; at tau 8 on large scores the pooled maxima lie far below the thresholds and the tiles redo their
    tails online: the same bits as the online router."""
    cen, kc, vsum, kvar = _route_inputs(cen_scale=scale)
    nb, H = cen.shape[1], cen.shape[0]
    res = {}
    for fixed in (True, False):
        tuning["route_fixed_frame"] = fixed
        res[fixed] = sparse_launch.route(cen, kc, vsum, kvar, 1, H, H, nb * 64 - 5, kw.get("tau", 1.0), 0.18,
                                         kw.get("sinks"), None, kw.get("topk_ratio", 0.0), tiles=tiles)
    (lists, count, m, lsum, acc), (lists0, count0, m0, lsum0, acc0) = res[True], res[False]
    assert torch.equal(count, count0)
    torch.testing.assert_close(m, m0, rtol=0, atol=0, equal_nan=True)
    for h in range(H):
        for i in range(nb):
            assert torch.equal(lists[h, i, :count[h, i]], lists0[h, i, :count[h, i]])
    torch.testing.assert_close(lsum, lsum0, rtol=1e-5, atol=0, equal_nan=True)
    torch.testing.assert_close(acc, acc0, rtol=1e-5, atol=1e-5 * float(acc0.nan_to_num().abs().max()), equal_nan=True)
    if scale != scale:  # the NaN query block's tail is NaN (its row then NaN, as SDPA), the others are not
        assert bool(lsum[1, 37].isnan()) and int(lsum.isnan().sum()) == 1
    if scale > 1:  # every row's pooled max far below its threshold: the online redo, bit for bit
        thr = kw["tau"] * torch.sqrt((cen * cen * kvar[:, None, :]).sum(-1) * 0.18 ** 2 + 1e-6)
        assert bool(((thr - m) > sparse_route.FRAME_SPAN.value).any())
        assert torch.equal(lsum, lsum0) and torch.equal(acc, acc0)
    if kw.get("tau") == -1e9:  # every block exact: no tail
        assert bool((m == float("-inf")).all()) and not lsum.any() and not acc.any()


@pytest.mark.parametrize("nb,d", [(70, 64), (1, 128), (200, 256), (64, 64)])
def test_the_block_means_are_centred_in_one_launch_as_torch_var_mean_centres_them(nb, d):
    """``sparse_launch.centre_means`` (``sparse_route.centre_means_kernel``): mu, the population variance and
    kbar - mu as torch's var_mean and a subtraction give them (fp32, against fp64), for a single block, a ragged
    last chunk and every padded head size; a NaN or Inf block mean makes its channel NaN (torch: NaN or Inf)."""
    g = torch.Generator().manual_seed(nb)
    kbar = torch.randn(3, nb, d, generator=g) * 0.3 + torch.randn(3, 1, d, generator=g) * 4.0
    kc, mu, kvar = sparse_launch.centre_means(kbar)
    var64, mu64 = torch.var_mean(kbar.double(), dim=1, correction=0)
    torch.testing.assert_close(mu, mu64.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kvar, var64.float(), rtol=1e-5, atol=1e-7)
    # kbar - mu in fp32: within a few ulps of the means' magnitude (torch's own fp32 subtraction is, too)
    ulps = 4 * torch.finfo(torch.float32).eps * float(kbar.abs().max())
    torch.testing.assert_close(kc, (kbar.double() - mu64[:, None]).float(), rtol=0, atol=ulps)
    if nb == 1:
        assert torch.equal(kvar, torch.zeros_like(kvar)) and torch.equal(kc, torch.zeros_like(kc))
    bad = kbar.clone()
    bad[1, nb // 2, 3], bad[2, 0, 5] = float("nan"), float("inf")
    kc, mu, kvar = sparse_launch.centre_means(bad)
    poisoned = ~bad.isfinite().all(dim=1)  # (heads, channels) with a NaN or Inf block mean
    assert int(poisoned.sum()) == 2
    for x in (mu, kvar, kc.transpose(1, 2)):  # NaN in those channels (every block), finite elsewhere
        assert x[poisoned].isnan().all() and x[~poisoned].isfinite().all()
