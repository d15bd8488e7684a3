"""Sparse attention in the dispatcher, without ComfyUI: which calls run sparse, with which sinks, what the
run tally says, and that every other call takes the dense path it took before.

The sparse kernel really runs (Triton interpreter on CPU tensors) on 3-4 blocks of 64 tokens; a spy
records what each call handed it. ``reference_backend`` plays ComfyUI's attention (``func``).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from attention_cases import comfy_args, reference_backend
from current_comfy import Holder
from sagetriton.kernels import sparse_reference as sref
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.config.sparse_settings import SparseSettings
from sagetriton.nodes.reporting import stats
from sagetriton.nodes.reporting.run_summary import build_summary, format_summary
from sagetriton.nodes.routing import sparse_calls
from sagetriton.nodes.routing.conditioning_span import TEXT_KEY, sinks_for
from sagetriton.nodes.routing.containers import dispatch_containers
from sagetriton.nodes.routing.dispatch import PatchState
from sagetriton.nodes.routing.sparse_calls import SparseRouter

T = 256  # 4 blocks
SPARSE = SparseSettings(mode="sol", min_tokens=128)


class SparseSpy:
    """Records every ``sparse_attn`` call's keywords and runs the real kernel."""

    def __init__(self, monkeypatch, pack, fail: Exception | None = None):
        self.calls: list[dict] = []
        self.fail = fail
        self._real = pack.kernels.sparse_attn
        monkeypatch.setattr(pack.kernels, "sparse_attn", self)

    def __call__(self, q, k, v, **kwargs):
        self.calls.append(dict(kwargs, shape=tuple(q.shape)))
        if self.fail is not None:
            raise self.fail
        return self._real(q, k, v, **kwargs)


class DenseSpy:
    def __init__(self, monkeypatch, pack):
        self.calls = 0
        self._real = pack.kernels.sageattn
        monkeypatch.setattr(pack.kernels, "sageattn", self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._real(*args, **kwargs)


def patched(sparse=SPARSE, window=None, **settings) -> PatchState:
    state = PatchState(SageSettings(min_seq_len=0, sparse=sparse, **settings))
    state.sparse = SparseRouter(sparse, window)
    state.begin_run()
    return state


def qkv(lq=T, lk=T, h=2, d=64, b=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g).half()
    k = torch.randn(b, h, lk, d, generator=g).half()
    v = torch.randn(b, h, lk, d, generator=g).half()
    return q, k, v


def call(state, q, k, v, topts=None, mask=None, skip_reshape=False):
    args = (*comfy_args(q, k, v, skip_reshape), q.shape[1])
    kwargs = dict(skip_reshape=skip_reshape, transformer_options={} if topts is None else topts,
                  _inside_attn_wrapper=True)
    if mask is not None:
        kwargs["mask"] = mask
    return state.dispatch(reference_backend, args, kwargs)


def test_a_long_self_attention_call_runs_sparse_and_is_counted_with_its_density(monkeypatch, pack):
    spy, dense = SparseSpy(monkeypatch, pack), DenseSpy(monkeypatch, pack)
    state = patched()
    q, k, v = qkv()
    out = call(state, q, k, v)

    assert len(spy.calls) == 1 and dense.calls == 0
    assert spy.calls[0]["tau"] == 1.3 and spy.calls[0]["topk_ratio"] is None and spy.calls[0]["return_density"]
    # the method's own output (fp64 reference), within the quantized kernel's error
    ref = sref.sparse_reference(q, k, v, tensor_layout="HND")
    got = out.view(1, T, 2, 64).transpose(1, 2)
    assert float((got.double() - ref.double()).norm() / ref.double().norm()) < 0.03
    run = state.run
    assert (run.kernel, run.sparse, dict(run.fallback)) == (1, 1, {})
    density = float(run.density_sum)
    assert 0 < density <= 1
    summary = build_summary(state, run)
    assert summary["sparse"]["calls"] == 1 and summary["sparse"]["density"] == pytest.approx(density)
    assert "sparse (sol tau 1.3): 1 calls" in format_summary(summary)


def smooth_qkv(t, h=2, d=64, seed=0):
    """(B, H, L, D) fp16 whose q and k vary slowly along the tokens: attention is local but spread, so
    single tokens outside the exact blocks (``extra_tokens``) change the answer."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(t, dtype=torch.float64)[:, None]
    base = torch.sin(pos * torch.rand(d, generator=g, dtype=torch.float64) * 0.15
                     + torch.rand(d, generator=g, dtype=torch.float64) * 6.3)
    q, k, v = (amp * base + noise * torch.randn(1, h, t, d, generator=g, dtype=torch.float64)
               for amp, noise in ((1.0, 0.5), (1.0, 0.5), (1.0, 1.0)))
    return q.half(), k.half(), v.half()


def test_extra_tokens_reach_the_kernel_and_shape_its_answer(monkeypatch, pack):
    spy, dense = SparseSpy(monkeypatch, pack), DenseSpy(monkeypatch, pack)
    state = patched(SparseSettings(mode="sol", min_tokens=128, extra_tokens=128))
    q, k, v = smooth_qkv(512)
    out = call(state, q, k, v)
    call(state, q, k, v)
    assert [c["extra_tokens"] for c in spy.calls] == [128, 128] and dense.calls == 0
    assert (state.run.kernel, state.run.sparse) == (2, 2)
    assert build_summary(state, state.run)["sparse"]["notes"] == []
    rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())  # noqa: E731
    ref = sref.sparse_reference(q, k, v, tensor_layout="HND", extra_tokens=128)
    without = sref.sparse_reference(q, k, v, tensor_layout="HND")
    got = out.view(1, 512, 2, 64).transpose(1, 2)
    assert rel(got, ref) < 0.01 and rel(without, ref) > 0.03, (rel(got, ref), rel(without, ref))


def test_top_k_and_extra_tokens_reach_the_kernel(monkeypatch, pack):
    spy = SparseSpy(monkeypatch, pack)
    state = patched(SparseSettings(mode="top-k", topk_ratio=0.25, min_tokens=128))
    call(state, *qkv())
    assert spy.calls[0]["topk_ratio"] == 0.25 and spy.calls[0]["extra_tokens"] == 0


@pytest.mark.parametrize("case", ["cross", "mask", "short", "small_heads"])
def test_calls_sparse_cannot_take_run_the_dense_path_and_say_why(case, monkeypatch, pack):
    spy, dense = SparseSpy(monkeypatch, pack), DenseSpy(monkeypatch, pack)
    state = patched()
    length = 64 if case == "short" else T
    q, k, v = qkv(lq=length, lk=8 if case == "cross" else length, d=32 if case == "small_heads" else 64)
    mask = torch.zeros(q.shape[2], k.shape[2], dtype=torch.float16) if case == "mask" else None
    call(state, q, k, v, mask=mask)
    reason = {"cross": sparse_calls.CROSS, "mask": sparse_calls.MASKED, "short": "< 128 tokens",
              "small_heads": sparse_calls.SMALL_HEADS}[case]
    assert spy.calls == [] and dense.calls == 1
    assert dict(state.run.sparse_dense) == {reason: 1} and state.run.kernel == 1 and state.run.sparse == 0


def test_the_schedule_window_is_core_s_sigma_window(monkeypatch, pack):
    """start/end percent as sigmas (0.9 .. 0.1 here): dense before and after, sparse inside, the boundary
    sigma itself inside."""
    spy, dense = SparseSpy(monkeypatch, pack), DenseSpy(monkeypatch, pack)
    state = patched(window=(0.9, 0.1))
    q, k, v = qkv()
    for sigma in (1.0, 0.9, 0.5, 0.05):
        call(state, q, k, v, {"sigmas": torch.tensor([sigma, sigma])})
    assert len(spy.calls) == 2 and dense.calls == 2
    assert dict(state.run.sparse_dense) == {sparse_calls.DENSE_STEP: 2}


def test_without_model_sampling_the_step_position_decides(monkeypatch, pack):
    spy = SparseSpy(monkeypatch, pack)
    state = patched(SparseSettings(mode="sol", min_tokens=128, start_percent=0.5))
    schedule = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    q, k, v = qkv()
    for sigma in schedule[:4]:
        call(state, q, k, v, {"sigmas": sigma.reshape(1), "sample_sigmas": schedule})
    assert len(spy.calls) == 2  # steps 2 and 3 of 4


def test_dense_layers_by_the_block_index_the_model_reports(monkeypatch, pack):
    spy = SparseSpy(monkeypatch, pack)
    state = patched(SparseSettings(mode="sol", min_tokens=128, dense_layers="0, 2-3"))
    q, k, v = qkv()
    topts = {}
    for block in range(5):
        topts["block_index"] = block
        call(state, q, k, v, topts)
    assert len(spy.calls) == 2 and dict(state.run.sparse_dense) == {sparse_calls.DENSE_LAYER: 3}


def test_a_model_reporting_no_block_index_gets_the_nth_self_attention_call_of_its_forward(monkeypatch, pack):
    """Wan before current core: self-attention, then cross-attention, per block. Cross-attention is not
    counted; each forward (a new transformer_options dict) counts from 0."""
    spy = SparseSpy(monkeypatch, pack)
    state = patched(SparseSettings(mode="sol", min_tokens=128, dense_layers="1"))
    q, k, v = qkv()
    qc, kc, vc = qkv(lk=8)
    for _forward in range(2):
        topts = {}
        for _block in range(3):
            call(state, q, k, v, topts)
            call(state, qc, kc, vc, topts)
    assert len(spy.calls) == 4
    assert dict(state.run.sparse_dense) == {sparse_calls.DENSE_LAYER: 2, sparse_calls.CROSS: 6}


@pytest.mark.parametrize("mode,side,keys,rows", [
    ("exact_kv_and_rows", "first", [0, 2], [0, 2]),  # 8 registers + 70 text tokens: blocks 0-1
    ("exact_kv", "first", [0, 2], [0, 0]),
    ("exact_kv_and_rows", "last", [2, 4], [2, 4]),  # tokens 178..255
    ("off", "first", [0, 0], [0, 0]),
])
def test_the_text_of_a_joint_attention_is_attended_exactly(mode, side, keys, rows, monkeypatch, pack):
    spy = SparseSpy(monkeypatch, pack)
    state = patched(SparseSettings(mode="sol", min_tokens=128, sink_conditioning=mode))
    call(state, *qkv(), {TEXT_KEY: (8, 70, side)})
    assert spy.calls[0]["sink_blocks"] == keys and spy.calls[0]["sink_q"] == rows


def test_a_call_no_longer_than_the_text_has_no_sinks():
    assert sinks_for({TEXT_KEY: (0, 256, "first")}, 256, "exact_kv_and_rows")[:2] == ((0, 0), (0, 0))


def test_minimax_h3_layout_sinks_as_core_reads_them():
    """The packed prefix (text, references, audio) before the video segment is exact for every query;
    with rows, the query blocks from the audio segment to the prefix's end attend everything."""
    layout = SimpleNamespace(seq_len=1000, segments=[(0, 100, "text"), (100, 230, "audio"), (230, 1000, "video")])
    topts = {"minimax_h3_layout": layout, TEXT_KEY: (0, 5, "first")}  # the layout wins over the text span
    assert sinks_for(topts, 1000, "exact_kv_and_rows") == ((0, 4), (1, 4), "MiniMax-H3 layout")
    assert sinks_for(topts, 1000, "exact_kv")[:2] == ((0, 4), (0, 0))
    assert sinks_for(topts, 999, "exact_kv")[2] == "text first"  # another call's length: not this layout


def test_a_sparse_kernel_failure_leaves_that_shape_dense_with_a_note(monkeypatch, pack, caplog):
    spy, dense = SparseSpy(monkeypatch, pack, fail=RuntimeError("boom")), DenseSpy(monkeypatch, pack)
    state = patched()
    q, k, v = qkv()
    out = call(state, q, k, v)
    call(state, q, k, v)
    assert len(spy.calls) == 1 and dense.calls == 2 and torch.isfinite(out).all()
    assert dict(state.run.sparse_dense) == {sparse_calls.FAILED: 2}
    summary = build_summary(state, state.run)
    assert any("sparse kernel failed" in n for n in summary["sparse"]["notes"])
    assert "boom" in caplog.text


def test_full_precision_steps_are_not_sparse(monkeypatch, pack):
    spy = SparseSpy(monkeypatch, pack)
    state = patched(full_precision_first_steps=1)
    schedule = torch.tensor([1.0, 0.5, 0.0])
    call(state, *qkv(), {"sigmas": schedule[:1], "sample_sigmas": schedule})
    assert spy.calls == [] and state.run.fallback == {"full-precision step": 1}


def test_holders_are_taken_only_by_a_sparse_call(monkeypatch, pack):
    """Current ComfyUI's q/k/v holders: a sparse call consumes them; a call left dense goes on to the
    container path untouched, which takes them for the dense kernel."""
    spy, dense = SparseSpy(monkeypatch, pack), DenseSpy(monkeypatch, pack)
    state = patched()
    for lk in (T, 8):
        q, k, v = comfy_args(*qkv(lk=lk), skip_reshape=False)
        holders = [Holder(t) for t in (q, k, v)]
        out = dispatch_containers(state, (*holders, 2), {"transformer_options": {}}, backend=reference_backend)
        assert out.shape == (1, T, 128) and all(h.tensor is None for h in holders)
    assert len(spy.calls) == 1 and dense.calls == 1


def test_a_redone_forward_takes_its_sparse_calls_back(monkeypatch, pack):
    """The non-finite guard discards a forward and counts only its redo: the sparse calls too."""
    SparseSpy(monkeypatch, pack)
    state = patched()
    with stats.held_counts() as forward:  # the guard's hold around a forward
        call(state, *qkv())
        assert forward.tally(state.run).sparse == 1
        forward.discard()
    assert (state.run.kernel, state.run.sparse, state.run.density_sum) == (0, 0, None)


def test_current_comfyui_hands_holders_to_the_patch_and_a_sparse_call_takes_them(monkeypatch, pack):
    """Current core's ``wrap_attn`` (emulated) with the Patch node's override: holders go to its container
    entry, the sparse call runs and consumes them."""
    from current_comfy import current_wrap_attn
    from sagetriton.nodes.routing.forward_plan import ForwardPlans
    from sagetriton.nodes.routing.override import make_attention_override

    spy = SparseSpy(monkeypatch, pack)
    state = patched()
    override = make_attention_override(state, ForwardPlans(state))
    attention = current_wrap_attn(reference_backend)
    q, k, v = comfy_args(*qkv(), skip_reshape=False)
    holders = [Holder(t) for t in (q, k, v)]
    out = attention(*holders, heads=2, transformer_options={"optimized_attention_override": override})
    assert len(spy.calls) == 1 and state.run.sparse == 1 and all(h.tensor is None for h in holders)
    assert out.shape == (1, T, 128)


def test_the_shim_around_another_override_counts_and_keeps_its_container_entry():
    """ComfyUI hands holders only to an override with a container entry: the shim keeps that shape."""
    from sagetriton.nodes.routing.override_watch import counting_shim

    def plain(func, *args, **kwargs):
        return func(*args, **kwargs)

    def with_entry(func, *args, **kwargs):
        return "tensors"

    with_entry.container_function = lambda *args, **kwargs: "holders"
    counter = [0]
    assert not hasattr(counting_shim(plain, counter), "container_function")
    shim = counting_shim(with_entry, counter)
    assert shim(None) == "tensors" and shim.container_function() == "holders" and counter == [2]


def test_core_sparse_taking_every_call_is_said_without_a_false_warning():
    from sagetriton.nodes.reporting.sparse_summary import CORE_SPARSE, outer_summary

    core = outer_summary({"name": CORE_SPARSE, "label": CORE_SPARSE, "forwards": 2, "calls": 8, "reached": 0})
    assert core["ours_unused"] and core["text"] == f"{CORE_SPARSE} ran all 8 attention calls itself; none was left " \
        "to SageTriton"
    other = outer_summary({"name": "x, set per model (Model Attention Backend node)", "label": "Model Attention "
                           "Backend", "forwards": 1, "calls": 4, "reached": 0})
    assert other["text"].startswith("Patch Model Attention's override did not run: x, set per model")
