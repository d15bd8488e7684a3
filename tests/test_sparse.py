"""``sparse_attn``'s kernels (through the interpreter) against the fp64 reference of the method.

The reference (``kernels.sparse_reference``) is the method in plain torch; the router is checked
against it exactly (which key blocks, and the pooled tail's state), the whole call within the INT8
quantization error the dense kernel makes on the same inputs. Inputs are "smooth" sequences (features
varying slowly along the tokens, so attention is local but not one-hot): there the sparse answer is
far from dense attention, so a kernel that ignored the routing or the pooled tail would fail. Shapes
are tiny: the interpreter runs on a shared CPU.
"""
import math

import pytest
import sagetriton.kernels as kernels
import torch
from sagetriton.kernels import api, sparse_extra, sparse_launch
from sagetriton.kernels import sparse_reference as sref
from sagetriton.kernels.arch import CPU_ARCH, KernelConfig, default_config

sparse_attn = kernels.sparse_attn
CPU_CFG = default_config(CPU_ARCH, 64)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def smooth_qkv(T, H=2, H_KV=1, D=64, B=1, strength=1.0, seed=0, dtype=torch.float16, layout="NHD"):
    """Tokens whose q and k are smooth functions of the position plus noise: each query prefers keys
    nearby, as on a video's token grid, with a spread set by ``strength``."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = torch.rand(D, generator=g, dtype=torch.float64) * 0.15
    phase = torch.rand(D, generator=g, dtype=torch.float64) * 6.3
    base = torch.sin(pos * freq + phase)  # (T, D)

    def t(h, amp, noise):
        x = amp * base[None, :, None, :] + noise * torch.randn(B, T, h, D, generator=g, dtype=torch.float64)
        return x if layout == "NHD" else x.permute(0, 2, 1, 3)

    q = t(H, strength, 0.5)
    k = t(H_KV, strength, 0.5) + torch.randn(D, generator=g, dtype=torch.float64)  # a per-channel K offset
    v = t(H_KV, 1.0, 1.0)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def budget(q, k, v, layout="NHD", config=None):
    """The quantization error allowed: the dense kernel's error against fp64 on the same inputs, plus a
    little for the different K centre (the sparse path centres on the mean of a sample of K's rows)."""
    exact = sref.dense_reference(q, k, v, tensor_layout=layout)
    dense = kernels.sageattn(q, k, v, layout, config=config)
    return 1.5 * rel(dense, exact) + 2e-3


# ---- the contract ------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,err", [
    (dict(tau=float("nan")), "tau"),
    (dict(tau="1.3"), "tau"),
    (dict(topk_ratio=1.0), "topk_ratio"),
    (dict(topk_ratio=-0.1), "topk_ratio"),
    (dict(extra_tokens=32), "extra_tokens"),
    (dict(extra_tokens=320), "extra_tokens"),
    (dict(sink_blocks=[2, 1]), "sink_blocks"),
    (dict(sink_q=[-1, 2]), "sink_q"),
    (dict(sink_q=[0, 1, 2]), "sink_q"),
    (dict(scale=float("inf")), "scale"),
    (dict(tensor_layout="BHLD"), "tensor_layout"),
    (dict(out_layout="X"), "out_layout"),
])
def test_bad_arguments_are_refused_by_name(kw, err):
    q, k, v = smooth_qkv(70)
    with pytest.raises(ValueError, match=err):
        sparse_attn(q, k, v, **kw)


def test_bad_tensors_are_refused():
    q, k, v = smooth_qkv(70)
    with pytest.raises(ValueError, match="self-attention"):
        sparse_attn(q, k[:, :60], v[:, :60])
    with pytest.raises(TypeError, match="dtype"):
        sparse_attn(q, k.float(), v)
    with pytest.raises(TypeError, match="float16"):
        sparse_attn(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="multiple"):
        sparse_attn(q, torch.cat([k] * 3, 2)[:, :, :3], torch.cat([v] * 3, 2)[:, :, :3])
    with pytest.raises(ValueError, match="empty"):
        sparse_attn(q[:, :0], k[:, :0], v[:, :0])
    with pytest.raises(RuntimeError, match="no backward"):
        sparse_attn(q.float().requires_grad_(), k.float(), v.float())


def test_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = smooth_qkv(70)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        sparse_attn(q, k, v)


# ---- the router ----------------------------------------------------------------------------------

def _proxies(q, k, v, scale=None):
    r = sref.route_reference(q, k, dtype=torch.float64, scale=scale)
    B, H, nb, D = r["centroid"].shape
    d_pad = max(32, 1 << (D - 1).bit_length())
    pad = lambda x: torch.nn.functional.pad(x, (0, d_pad - D)).float().reshape(-1, nb, d_pad).contiguous()  # noqa: E731
    vh = v.permute(0, 2, 1, 3).double()
    vsum = sref._block_pool(vh, nb, "sum")
    kvar = torch.nn.functional.pad((r["kc"] ** 2).mean(2), (0, d_pad - D)).float().reshape(-1, d_pad)
    return r, pad(r["centroid"]), pad(r["kc"]), pad(vsum), kvar.contiguous(), vsum


@pytest.mark.parametrize("T,kw", [
    (200, dict(tau=1.0)), (700, dict(tau=0.5)), (700, dict(tau=1.5, sink_blocks=(0, 2), sink_q=(5, 7))),
    (700, dict(tau=1.0, sink_blocks=(9, 40), sink_q=(10, 99))),  # ranges past the end: clipped
    (700, dict(topk_ratio=0.3)), (700, dict(topk_ratio=0.05, sink_blocks=(3, 5))),
])
def test_router_lists_the_reference_blocks_and_pools_the_rest(T, kw):
    q, k, v = smooth_qkv(T, H=2, H_KV=1, strength=1.0, seed=T)
    r, cen, kc, vsum, kvar, vsum64 = _proxies(q, k, v)
    tau = kw.get("tau", 1.3)
    log2s = sref.LOG2E / math.sqrt(q.shape[-1])
    ref = sref.route_reference(q, k, tau, sink_blocks=kw.get("sink_blocks"), sink_q=kw.get("sink_q"),
                               topk_ratio=kw.get("topk_ratio"))
    lists, count, tm, tl_, tacc = sparse_launch.route(cen, kc, vsum, kvar, 1, 2, 1, T, tau, log2s,
                                                      kw.get("sink_blocks"), kw.get("sink_q"), kw.get("topk_ratio"))
    nb = cen.shape[1]
    exact = torch.zeros(2, nb, nb, dtype=torch.bool)
    for bh in range(2):
        for i in range(nb):
            idx = lists[bh, i, :count[bh, i]].long()
            assert (idx[1:] > idx[:-1]).all(), "the list is ascending"
            exact[bh, i, idx] = True
    assert torch.equal(exact, ref["exact"][0]), (exact ^ ref["exact"][0]).nonzero()[:5]
    # the pooled tail, in fp64: max and sum over the rejected blocks (weights = lengths), and its P·V
    s = ref["scores"][0].masked_fill(ref["exact"][0], float("-inf"))
    m = s.amax(-1)
    lengths = sref._lengths(T, nb, "cpu")
    p = torch.exp2(s - m[..., None].clamp_min(-1e300))
    p = torch.nan_to_num(p, nan=0.0)
    has_tail = torch.isfinite(m)
    assert torch.equal(torch.isfinite(tm), has_tail)
    torch.testing.assert_close(tm[has_tail].double(), m[has_tail], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tl_[has_tail].double(), (p * lengths).sum(-1)[has_tail], rtol=1e-5, atol=1e-6)
    pv = torch.einsum("hij,jd->hid", p, vsum64[0, 0])  # one KV head for both query heads
    torch.testing.assert_close(tacc[..., :q.shape[-1]][has_tail].double(), pv[has_tail], rtol=1e-4, atol=1e-4)


# ---- whole calls against the reference -----------------------------------------------------------

@pytest.mark.parametrize("T", [1, 63, 64, 65, 200, 330])
def test_any_length_matches_the_reference(T):
    q, k, v = smooth_qkv(T, H=2, H_KV=1, seed=T)
    out, lse, density = sparse_attn(q, k, v, 1.0, return_lse=True, return_density=True)
    ref, ref_lse, ref_density = sref.sparse_reference(q, k, v, 1.0, return_lse=True, return_density=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel(out, ref) <= budget(q, k, v), (rel(out, ref), budget(q, k, v))
    torch.testing.assert_close(lse, ref_lse, atol=0.05, rtol=0)
    assert float(density) == pytest.approx(float(ref_density))
    if T >= 330:  # sparse here: far from dense, so following the routing is what the check above tests
        assert float(density) < 0.8
        assert rel(ref, sref.dense_reference(q, k, v)) > 3 * budget(q, k, v)


@pytest.mark.parametrize("kw", [dict(topk_ratio=0.2), dict(tau=2.0, sink_blocks=[1, 2]), dict(tau=0.0, sink_q=[2, 3]),
                                dict(tau=1.0, sink_blocks=[50, 60], sink_q=[70, 80]), dict(tau=1.0, scale=-0.2)])
def test_options_match_the_reference(kw):
    q, k, v = smooth_qkv(330, H=2, H_KV=2, seed=3)
    out, density = sparse_attn(q, k, v, return_density=True, **kw)
    ref, ref_density = sref.sparse_reference(q, k, v, return_density=True, **kw)
    assert rel(out, ref) <= budget(q, k, v) + (0.01 if "scale" in kw else 0.0)
    assert float(density) == pytest.approx(float(ref_density))


def test_gqa_hnd_and_the_other_output_layout():
    q, k, v = smooth_qkv(200, H=4, H_KV=2, seed=5, layout="HND")
    out = sparse_attn(q, k, v, 1.0, tensor_layout="HND", out_layout="NHD")
    ref = sref.sparse_reference(q, k, v, 1.0, tensor_layout="HND")
    assert out.shape == (1, 200, 4, 64)
    assert rel(out.permute(0, 2, 1, 3), ref) <= budget(q, k, v, "HND")


def test_strided_views_of_fused_qkv_are_read_in_place():
    q0, k0, v0 = smooth_qkv(200, H=2, H_KV=2, D=64, seed=6)
    qkv = torch.cat([q0, k0, v0], dim=-1)  # (B, L, H, 3D): ComfyUI's fused projection, split as views
    q, k, v = qkv[..., :64], qkv[..., 64:128], qkv[..., 128:]
    assert not q.is_contiguous()
    out = sparse_attn(q, k, v, 1.0)
    assert rel(out, sparse_attn(q0, k0, v0, 1.0)) == 0.0


@pytest.mark.parametrize("D", [40, 128])
def test_head_dims_padded_and_fp32_inputs(D):
    q, k, v = smooth_qkv(130, H=1, H_KV=1, D=D, seed=D, dtype=torch.float32)
    out = sparse_attn(q, k, v, 1.0)
    assert out.dtype == torch.float32
    assert rel(out, sref.sparse_reference(q, k, v, 1.0)) <= budget(q, k, v)


def gpu_config(gran: str, pv: str, rotation) -> KernelConfig:
    """A GPU family's quantized path on the interpreter; ``rotation`` "tiles" is Hopper's (K's centre subtracted
    after the product, ``KernelConfig.rotation_tiles``)."""
    cfg = CPU_CFG.replace(qk_quant_gran=gran, qk_rotation=bool(rotation),
                          rotation_tiles=rotation == "tiles").with_pv_choice(pv)
    return cfg.replace(fp8_format="e4m3fn") if cfg.pv_precision == "fp8" else cfg


@pytest.mark.parametrize("gran,pv,rotation", [("per_warp", "fp8", True), ("per_warp", "fp8", "tiles"),
                                              ("per_block", "int8", True),
                                              ("per_thread", "int8", False), ("per_thread", "fp16", False),
                                              ("per_warp", "fp8+residual", False)])
def test_every_quantized_path_of_the_gpus(gran, pv, rotation):
    cfg = gpu_config(gran, pv, rotation)
    q, k, v = smooth_qkv(200, H=2, H_KV=1, seed=11, dtype=torch.bfloat16)
    out, lse = sparse_attn(q, k, v, 1.0, config=cfg, return_lse=True)
    ref, ref_lse = sref.sparse_reference(q, k, v, 1.0, return_lse=True)
    assert rel(out, ref) <= budget(q, k, v, config=cfg)
    torch.testing.assert_close(lse, ref_lse, atol=0.05, rtol=0)


def test_q_and_k_are_read_once_before_the_attention_kernel():
    """Issue 54 (the routing share): Q's centroids and K's block means come from their quantization launches,
    so each is read in full once before the attention kernel; K's centre is a sample of K's rows."""
    q, k, v = smooth_qkv(1100, H=2, H_KV=1, seed=4)
    seen = []

    def record(kernel, grid, args, constexprs, options):
        seen.append((kernel.fn.__name__, grid, args, constexprs))
        kernel[grid](*args, **constexprs, **options)

    previous = api.set_launch_hook(record)
    try:
        out = sparse_attn(q, k, v, 1.0)
    finally:
        api.set_launch_hook(previous)
    assert rel(out, sref.sparse_reference(q, k, v, 1.0)) <= budget(q, k, v)
    names = [name for name, *_ in seen]
    before = seen[:names.index("sparse_attention_kernel")]

    def launches_reading(t, whole=True):  # the pool reads its first tensor in full, the later one in a sample
        return [name for name, _, args, _ in before for i, a in enumerate(args)
                if isinstance(a, torch.Tensor) and a.data_ptr() == t.data_ptr()
                and (name != "pool_kernel" or i == 0) == whole]

    assert len(launches_reading(q)) == 1, names
    assert len(launches_reading(k)) == 1, names
    (pool,) = [(grid, c) for name, grid, _, c in before if name == "pool_kernel"]
    assert launches_reading(k, whole=False) == ["pool_kernel"]
    assert pool[1]["K_SAMPLE"] * pool[0][0] * pool[0][1] <= 1100 / 8  # keys summed for the centre


@pytest.mark.parametrize("T", [1, 63, 300, 1100])
def test_the_pool_sums_v_per_block_and_centres_k_on_a_sample_of_its_rows(T):
    """``pool_kernel``: V's block sums and max |v| per program, and a sample of K's rows; ``pool_finish_kernel``:
    K's centre (the mean of every 16th key; with the tiled rotation also times its signs) and V's scale."""
    q, k, v = smooth_qkv(T, H=2, H_KV=2, D=64, seed=T)
    kh, vh = (x.permute(0, 2, 1, 3) for x in (k, v))
    nb = -(-T // 64)
    vsum, vmax, ksum = sparse_launch._pool_v(vh, kh, T, 64, nb, absmax=True)
    torch.testing.assert_close(vsum.reshape(1, 2, nb, 64), sref._block_pool(vh.double(), nb, "sum").float(),
                               rtol=1e-5, atol=1e-5)
    amax = vh.abs().amax(2).float().reshape(2, 64)
    torch.testing.assert_close(vmax.amax(1), amax, rtol=0, atol=0)
    cfg = gpu_config("per_warp", "fp8", "tiles")
    signs = api._rotation_signs(64, 64, k.device, k.dtype)
    centre, rotated, final = sparse_launch._finish_pool(vmax, ksum, T, cfg, 64, signs)
    want = kh[:, :, ::16].double().mean(2).float().reshape(2, 64)
    torch.testing.assert_close(centre, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rotated, want @ signs.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final[1], torch.where(amax > 0, amax / 448.0, 1.0), rtol=1e-6, atol=0)


@pytest.mark.parametrize("rotation,extra", [(False, 0), (True, 0), ("tiles", 0), (False, 64)])
def test_the_k_centre_changes_nothing_but_int8_rounding(monkeypatch, rotation, extra):
    """K is quantized around a sample's mean, not the method's centre (the mean of the block means, which the
    proxies use): the kernel moves the router's pooled tail into its frame per row (q·(mu - centre)), so the
    answer and the LSE are the method's whatever the centre, the old one (the method's own) or one far off;
    with extra tokens too (their tail in the method's frame, their merge in the kernel's)."""
    cfg = gpu_config("per_thread", "fp16", rotation)
    q, k, v = smooth_qkv(330, H=2, H_KV=1, seed=8, dtype=torch.bfloat16)
    ref, ref_lse = sref.sparse_reference(q, k, v, 1.0, return_lse=True, extra_tokens=extra)
    r = sref.route_reference(q, k, 1.0)
    mu = r["mu"].float().reshape(-1, 64)  # the old centre: the mean of the block means
    spread = k.float().std(dim=1).reshape(-1, 64)
    finish = sparse_launch._finish_pool
    signs = api._rotation_signs(64, 64, k.device, k.dtype).float()

    def finish_on(c, *args):  # K's centre replaced (rotated too where the tiled rotation takes it so)
        centre, rotated, final = finish(*args)
        centre.copy_(c)
        if rotated is not centre:
            rotated.copy_(c @ signs)
        return centre, rotated, final

    outs = {}
    for name, centre in (("sample", None), ("old", mu), ("far", mu + 1.5 * spread)):
        if centre is not None:
            monkeypatch.setattr(sparse_launch, "_finish_pool", lambda *a, c=centre: finish_on(c, *a))
        outs[name] = sparse_attn(q, k, v, 1.0, config=cfg, return_lse=True, return_density=True,
                                 extra_tokens=extra)
        out, lse, density = outs[name]
        assert rel(out, ref) <= budget(q, k, v, config=cfg), (name, rel(out, ref))
        torch.testing.assert_close(lse, ref_lse, atol=0.05, rtol=0)
    for name in ("sample", "far"):
        assert rel(outs[name][0], outs["old"][0]) <= budget(q, k, v, config=cfg) - 2e-3, name
        assert float(outs[name][2]) == float(outs["old"][2])  # the routing does not see the centre


@pytest.mark.parametrize("rotation", [True, "tiles"])
def test_batches_with_gqa_match_the_reference(rotation):
    """Two batches of four query heads on two key/value heads: each query head's proxies, K centre, per-row tail
    offset and LSE bias come from its own batch's key/value head."""
    cfg = gpu_config("per_warp", "fp8", rotation)
    q, k, v = smooth_qkv(270, H=4, H_KV=2, B=2, seed=21, dtype=torch.bfloat16, layout="HND")
    k[1] += 2.0  # the second batch's keys elsewhere: a centre taken from the wrong batch would show
    out, lse, density = sparse_attn(q, k, v, 1.0, tensor_layout="HND", config=cfg, return_lse=True,
                                    return_density=True)
    ref, ref_lse, ref_density = sref.sparse_reference(q, k, v, 1.0, tensor_layout="HND", return_lse=True,
                                                      return_density=True)
    assert rel(out, ref) <= budget(q, k, v, "HND", config=cfg), rel(out, ref)
    torch.testing.assert_close(lse, ref_lse, atol=0.05, rtol=0)
    assert float(density) == pytest.approx(float(ref_density))


def test_every_block_exact_is_dense_attention():
    q, k, v = smooth_qkv(200, seed=9)
    out, density = sparse_attn(q, k, v, tau=-1e9, return_density=True)
    assert float(density) == 1.0
    assert rel(out, sref.dense_reference(q, k, v)) <= budget(q, k, v)


# ---- hostile inputs (docs/HOSTILE_INPUTS.md) -----------------------------------------------------

def test_nan_in_a_query_token_poisons_its_query_block_only():
    q, k, v = smooth_qkv(200, H=1, H_KV=1, seed=12)
    q[0, 70, 0, 3] = float("nan")
    out = sparse_attn(q, k, v, 1.0)
    ref = sref.sparse_reference(q, k, v, 1.0)
    bad = ~torch.isfinite(out[0, :, 0]).all(-1)
    assert torch.equal(bad, ~torch.isfinite(ref[0, :, 0]).all(-1))
    assert bad[64:128].all() and not bad[:64].any() and not bad[128:].any()


@pytest.mark.parametrize("what", ["k", "v"])
def test_nan_in_a_key_or_value_is_non_finite_as_sdpa(what):
    q, k, v = smooth_qkv(130, H=1, H_KV=1, seed=13)
    (k if what == "k" else v)[0, 5, 0, 0] = float("nan")
    out = sparse_attn(q, k, v, 1.0)
    if what == "k":  # K's centre is NaN: the whole head, as SDPA's rows that see the key
        assert torch.isnan(out).all()
    else:  # V's channel scale is NaN: that channel everywhere
        assert torch.isnan(out[..., 0]).all()


def test_huge_logits_are_right_or_nan_never_silently_wrong():
    q, k, v = smooth_qkv(130, H=1, H_KV=1, seed=14)
    q, k = q.float() * 3000, k.float() * 3000
    out = sparse_attn(q, k, v.float(), 1.0)
    ref = sref.sparse_reference(q, k, v.float(), 1.0)
    rows = torch.isfinite(out).all(-1)
    assert rel(out[rows], ref[rows]) < 0.05 if rows.any() else True


# ---- extra_tokens (kernels/sparse_extra.py) --------------------------------------------------------

@pytest.mark.parametrize("T,extra,kw,dtype,qb", [
    (700, 64, dict(tau=1.0), torch.float16, 16), (700, 256, dict(tau=1.5, sink_blocks=(0, 2)), torch.bfloat16, 64),
    (461, 128, dict(topk_ratio=0.1, sink_q=(2, 3)), torch.float32, 16), (4200, 128, dict(tau=1.3), torch.bfloat16, 64),
    (4200, 64, dict(tau=1.0), torch.float16, 16)])
def test_extra_router_picks_the_reference_tokens_and_keeps_the_rest_per_token(T, extra, kw, dtype, qb):
    # each K dtype's products (fp16: the centroid in two 16-bit parts, bf16: three, fp32: centred keys), with
    # Hopper's 64 query blocks a program and the others' 16; 4200 tokens: 66 key blocks, more than one program
    q, k, v = smooth_qkv(T, H=2, H_KV=1, strength=1.0, seed=T + extra, dtype=dtype)
    r, cen, kc, vsum, kvar, _ = _proxies(q, k, v)
    log2s = sref.LOG2E / math.sqrt(q.shape[-1])
    ref = sref.route_reference(q, k, kw.get("tau", 1.3), sink_blocks=kw.get("sink_blocks"), sink_q=kw.get("sink_q"),
                               topk_ratio=kw.get("topk_ratio"))
    lists, count, tm, tl_, tacc = sparse_launch.route(cen, kc, vsum, kvar, 1, 2, 1, T, kw.get("tau", 1.3), log2s,
                                                      kw.get("sink_blocks"), kw.get("sink_q"), kw.get("topk_ratio"))
    qh, kh, vh = (x.permute(0, 2, 1, 3) for x in (q, k, v))
    mu = torch.nn.functional.pad(r["mu"], (0, cen.shape[2] - q.shape[-1])).float().reshape(1, -1)
    idx, n_extra = sparse_extra.retail(qh, kh, vh, cen, mu, lists, count, tm, tl_, tacc, log2s, extra, qb=qb)
    # the reference's choice, in fp64, from its own routing (the router's is checked equal above)
    tok_blk = torch.arange(T) // 64
    kc_tok = kh[0].double() - r["mu"][0][:, None]
    c = (r["centroid"][0] @ kc_tok.transpose(-1, -2)) * log2s  # (H, nb, T): one KV head for both
    outside = ~ref["exact"][0][:, :, tok_blk]
    want = sref._extra_select(c, outside, extra)
    got = torch.zeros_like(want)
    for h in range(2):
        for i in range(want.shape[1]):
            sel = idx[h, i, :n_extra[h, i]].long()
            assert (sel[1:] > sel[:-1]).all() and (idx[h, i, n_extra[h, i]:] == 0).all()
            got[h, i, sel] = True
    assert torch.equal(got, want), (got ^ want).nonzero()[:5]
    assert want.any(dim=-1).float().mean() > 0.5  # most query blocks have extra tokens here
    # the tail: every other outside token with its own term (weight 1, value v_t), base 2
    s = c.masked_fill(~(outside & ~want), float("-inf"))
    m = s.amax(-1)
    has = torch.isfinite(m)
    p = torch.nan_to_num(torch.exp2(s - m[..., None].clamp_min(-1e300)), nan=0.0)
    torch.testing.assert_close(tm[has].double(), m[has], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tl_[has].double(), p.sum(-1)[has], rtol=1e-5, atol=1e-6)
    pv = p @ vh[0, 0].double()
    # 16-bit V: P in two 16-bit parts holds each weight to 2^-16 (bf16; fp16 2^-22) of itself (one part: 2^-8)
    slack = 2.0 ** -15 * (p @ vh[0, 0].double().abs()) if dtype != torch.float32 else 0.0
    err = (tacc[..., :q.shape[-1]].double() - pv).abs() - slack
    assert (err[has] <= 1e-4 + 1e-4 * pv[has].abs()).all(), float(err[has].max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extra_merge_is_the_softmax_over_both_parts(dtype):
    # given rows (out, LSE) over some terms and a few extra tokens per block, the merge must give the
    # softmax over the union: checked in fp64 on made-up rows, so every weight of the merge counts
    g = torch.Generator().manual_seed(31)
    B, H, H_KV, L, D, E = 1, 2, 1, 150, 40, 64
    nb, d_pad = 3, 64
    q, k, v = (torch.randn(B, h, L, D, generator=g).to(dtype) for h in (H, H_KV, H_KV))
    mu = torch.randn(B * H_KV, D, generator=g)
    out = torch.randn(B, H, L, D, generator=g).to(dtype)
    lse = torch.randn(B, H, L, generator=g) * 2 + 3
    lse[0, 0, 5] = float("nan")  # a poisoned row stays poisoned
    n_extra = torch.tensor([[3, 0, 64], [17, 1, 40]], dtype=torch.int32)
    idx = torch.zeros(B * H, nb, E, dtype=torch.int32)
    for bh in range(B * H):
        for i in range(nb):
            idx[bh, i, :n_extra[bh, i]] = torch.randperm(L, generator=g)[:int(n_extra[bh, i])].sort().values.int()
    want_out, want_lse = out.double().clone(), lse.double().clone()
    scale = 0.3
    for h in range(H):
        for i in range(nb):
            n = int(n_extra[h, i])
            rows = slice(i * 64, min(L, i * 64 + 64))
            if not n:
                continue
            t = idx[h, i, :n].long()
            s = q[0, h, rows].double() @ (k[0, 0, t].double() - mu[0].double()).T * scale
            lse2 = torch.logsumexp(s, -1)
            o2 = torch.softmax(s, -1) @ v[0, 0, t].double()
            lse1 = lse[0, h, rows].double()
            top = torch.maximum(lse1, lse2)
            w1, w2 = torch.exp(lse1 - top), torch.exp(lse2 - top)
            want_out[0, h, rows] = (w1[:, None] * out[0, h, rows].double() + w2[:, None] * o2) / (w1 + w2)[:, None]
            want_lse[0, h, rows] = top + torch.log(w1 + w2)
    sparse_extra.merge(q, k, v, torch.nn.functional.pad(mu, (0, d_pad - D)), idx, n_extra, scale, out, lse)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(out.double(), want_out.to(dtype).double(), atol=tol, rtol=tol, equal_nan=True)
    assert torch.isnan(out[0, 0, 5]).all()


@pytest.mark.parametrize("extra,T,kw,layout", [
    (64, 330, dict(tau=1.0), "NHD"),
    (256, 700, dict(tau=1.5), "NHD"),
    (128, 330, dict(topk_ratio=0.2, sink_blocks=[1, 2], sink_q=[3, 4]), "NHD"),
    (192, 200, dict(tau=1.0, H=4, H_KV=2, out_layout="NHD"), "HND"),
    (256, 261, dict(tau=1.0, scale=-0.2), "NHD"),
])
def test_extra_tokens_match_the_reference(extra, T, kw, layout):
    kw = dict(kw)
    H, H_KV, out_layout = kw.pop("H", 2), kw.pop("H_KV", 1), kw.pop("out_layout", layout)
    q, k, v = smooth_qkv(T, H=H, H_KV=H_KV, seed=T + extra, layout=layout)
    out, lse, density = sparse_attn(q, k, v, extra_tokens=extra, tensor_layout=layout, out_layout=out_layout,
                                    return_lse=True, return_density=True, **kw)
    ref, ref_lse, ref_density = sref.sparse_reference(q, k, v, extra_tokens=extra, tensor_layout=layout,
                                                      return_lse=True, return_density=True, **kw)
    without = sref.sparse_reference(q, k, v, tensor_layout=layout, **kw)
    if out_layout != layout:
        out = out.permute(0, 2, 1, 3)
    allowed = budget(q, k, v, layout) + (0.01 if "scale" in kw else 0.0)
    assert rel(out, ref) <= allowed, (rel(out, ref), allowed)
    assert rel(without, ref) > 3 * allowed  # the extra tokens matter here: following them is what is tested
    torch.testing.assert_close(lse, ref_lse, atol=0.05, rtol=0)
    assert float(density) == pytest.approx(float(ref_density))  # exact block pairs only, as the reference


@pytest.mark.parametrize("T", [1, 65, 128])
def test_extra_tokens_with_nothing_outside_the_exact_blocks_change_no_bit(T):
    # up to 2 blocks every key block neighbours every query block: no token is outside, none is extra
    q, k, v = smooth_qkv(T, H=2, H_KV=1, seed=T)
    out, lse = sparse_attn(q, k, v, 1.0, extra_tokens=256, return_lse=True)
    plain, plain_lse = sparse_attn(q, k, v, 1.0, return_lse=True)
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse)


def test_extra_tokens_move_the_kernel_s_answer_toward_dense():
    q, k, v = smooth_qkv(700, H=1, H_KV=1, seed=15)
    exact = sref.dense_reference(q, k, v)
    base, d0 = sparse_attn(q, k, v, 1.5, return_density=True)
    aug, d1 = sparse_attn(q, k, v, 1.5, extra_tokens=256, return_density=True)
    assert float(d0) == float(d1)
    assert rel(aug, base) > 3 * budget(q, k, v)
    assert rel(aug, exact) < 0.8 * rel(base, exact)


@pytest.mark.parametrize("D,dtype", [(40, torch.float32), (128, torch.bfloat16)])
def test_extra_tokens_with_padded_head_dims_and_fp32(D, dtype):
    q, k, v = smooth_qkv(200, H=1, H_KV=1, D=D, seed=D, dtype=dtype)
    out = sparse_attn(q, k, v, 1.0, extra_tokens=64)
    assert out.dtype == dtype
    assert rel(out, sref.sparse_reference(q, k, v, 1.0, extra_tokens=64)) <= budget(q, k, v)


@pytest.mark.parametrize("gran,pv,rotation", [("per_warp", "fp8", "tiles"), ("per_block", "int8", True),
                                              ("per_thread", "fp16", False)])
def test_extra_tokens_on_every_lse_frame_of_the_gpus(gran, pv, rotation):
    # the merge reads the kernel's LSE in the centred frame: each rotation method and P·V format keeps it
    cfg = gpu_config(gran, pv, rotation)
    q, k, v = smooth_qkv(330, H=2, H_KV=1, seed=21, dtype=torch.bfloat16)
    out, lse = sparse_attn(q, k, v, 1.0, config=cfg, extra_tokens=128, return_lse=True)
    ref, ref_lse = sref.sparse_reference(q, k, v, 1.0, extra_tokens=128, return_lse=True)
    assert rel(out, ref) <= budget(q, k, v, config=cfg)
    torch.testing.assert_close(lse, ref_lse, atol=0.05, rtol=0)


def test_extra_tokens_read_strided_views_in_place():
    q0, k0, v0 = smooth_qkv(200, H=2, H_KV=2, D=64, seed=6)
    qkv = torch.cat([q0, k0, v0], dim=-1)
    q, k, v = qkv[..., :64], qkv[..., 64:128], qkv[..., 128:]
    assert rel(sparse_attn(q, k, v, 1.0, extra_tokens=64), sparse_attn(q0, k0, v0, 1.0, extra_tokens=64)) == 0.0


def test_extra_tokens_keep_the_non_finite_rules():
    q, k, v = smooth_qkv(330, H=1, H_KV=1, seed=12)
    q[0, 70, 0, 3] = float("nan")
    out = sparse_attn(q, k, v, 1.0, extra_tokens=256)
    ref = sref.sparse_reference(q, k, v, 1.0, extra_tokens=256)
    bad = ~torch.isfinite(out[0, :, 0]).all(-1)
    assert torch.equal(bad, ~torch.isfinite(ref[0, :, 0]).all(-1))
    assert bad[64:128].all() and not bad[:64].any() and not bad[128:].any()
    q, k, v = smooth_qkv(330, H=1, H_KV=1, seed=13)
    v[0, 5, 0, 0] = float("nan")
    out = sparse_attn(q, k, v, 1.0, extra_tokens=64)
    assert torch.isnan(out[..., 0]).all() and torch.isfinite(out[..., 1:]).all()
    k[0, 5, 0, 0] = float("nan")
    assert torch.isnan(sparse_attn(q, k, v, 1.0, extra_tokens=64)).all()
    q, k, v = (x.float() * s for x, s in zip(smooth_qkv(200, H=1, H_KV=1, seed=14), (3000, 3000, 1), strict=True))
    out = sparse_attn(q, k, v, 1.0, extra_tokens=128)
    ref = sref.sparse_reference(q, k, v, 1.0, extra_tokens=128)
    rows = torch.isfinite(out).all(-1)
    assert rel(out[rows], ref[rows]) < 0.05 if rows.any() else True


def test_reference_extra_tokens_admit_whole_bins_within_the_budget():
    q, k, v = smooth_qkv(700, H=1, H_KV=1, seed=15)
    base, d0 = sref.sparse_reference(q, k, v, 1.5, return_density=True)
    aug, d1 = sref.sparse_reference(q, k, v, 1.5, extra_tokens=256, return_density=True)
    exact = sref.dense_reference(q, k, v)
    assert float(d0) == float(d1)  # the block routing is the same
    assert rel(aug, exact) < rel(base, exact)  # single tokens and a per-token tail are closer to dense
    c = torch.tensor([[5.2, 5.1, 5.0, 3.0, 2.9, 0.0]])
    live = torch.ones_like(c, dtype=torch.bool)
    assert sref._extra_select(c, live, 2).sum() == 0  # cells are whole: the best one, [5, 5.25), holds 3 tokens
    assert sref._extra_select(c, live, 3).tolist() == [[True, True, True, False, False, False]]
    assert sref._extra_select(c, live, 5).sum() == 5
    assert sref._extra_select(torch.zeros(1, 6), live, 5).sum() == 0  # a flat profile admits none
    # the cells lie on a fixed grid (one pass finds the top cell and counts below it), not from the best score
    assert sref._extra_select(torch.tensor([[5.0, 4.9, 4.8, 0.0]]), live[:, :4], 2).tolist() == [
        [True, False, False, False]]
    # a non-finite score is in no cell: never extra, and it does not move the others' cells
    c = torch.tensor([[float("inf"), 5.1, 5.0, float("nan"), float("-inf")]])
    assert sref._extra_select(c, live[:, :5], 2).tolist() == [[False, True, True, False, False]]


@pytest.mark.parametrize("extra", [0, 64])
def test_torch_compile_traces_without_graph_breaks(extra):
    q, k, v = smooth_qkv(330 if extra else 130, seed=16)

    def f(q, k, v):
        out, density = sparse_attn(q * 1, k, v, 1.0, return_density=True, extra_tokens=extra)
        return out.float().sum(-1), density

    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    (a, da), (b, db) = compiled(q, k, v), f(q, k, v)
    assert torch.equal(a, b) and float(da) == float(db)
