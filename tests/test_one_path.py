"""Issue 51 item 2, one path per call: both entries (tensors, q/k/v holders) reach one dispatcher, which
tells the forward in progress each call's decision; the non-finite guard never counts a forward it discards."""
from __future__ import annotations

import torch
from attention_cases import random_qkv, reference_backend
from current_comfy import Holder
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.reporting import stats
from sagetriton.nodes.routing.call_cache import COMFY, KERNEL
from sagetriton.nodes.routing.containers import dispatch_containers
from sagetriton.nodes.routing.dispatch import PatchState
from sagetriton.nodes.routing.forward_plan import _Forward
from sagetriton.nodes.routing.nonfinite_guard import REASON, make_apply_model_wrapper

SHORT = "key length < 32"


def test_the_forward_in_progress_hears_each_decision_of_both_entries(pack):
    """What a forward plan learns from: (route, reason) per call, from the tensor and the container entry,
    cached or decided in full; nothing on another thread's forward."""
    state = PatchState(SageSettings(min_seq_len=32))
    state.begin_run()
    forward = state.local.forward = _Forward(None)
    try:
        for lk in (16, 16, 64):  # a fallback decided in full, the same from the call cache, the kernel
            q, k, v = random_qkv(b=1, h=2, lq=16, lk=lk, d=32)
            state.dispatch(reference_backend, (q, k, v, 2), {"skip_reshape": True})
        q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=32)
        holders = [Holder(t) for t in (q, k, v)]
        dispatch_containers(state, (*holders, 2), {"skip_reshape": True}, backend=reference_backend)
        assert all(h.tensor is None for h in holders)
    finally:
        state.local.forward = None
    assert forward.decisions == [(COMFY, SHORT), (COMFY, SHORT), (KERNEL, None), (COMFY, SHORT)]
    assert state.run.kernel == 1 and dict(state.run.fallback) == {SHORT: 3}


def test_a_discarded_forward_is_never_counted_not_even_while_it_runs(pack):
    """The guard holds a forward's counts until it keeps the forward: the totals and the run never show the
    calls of the forward it redoes (before: counted, then taken back after the check)."""
    state = PatchState(SageSettings(min_seq_len=0))
    state.begin_run()
    guard = make_apply_model_wrapper(state)
    q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=16)
    before = stats.attention_stats()["kernel"]
    seen = []

    def forward(x):  # one kernel call; the first forward's result is non-finite
        state.dispatch(reference_backend, (q, k, v, 2), {"skip_reshape": True})
        seen.append((stats.attention_stats()["kernel"] - before, state.run.kernel))
        return torch.full_like(x, float("nan")) if len(seen) == 1 else x

    assert torch.isfinite(guard(forward, torch.zeros(2))).all()
    assert seen == [(0, 0), (0, 0)]  # the kernel call held, then the redo's call on ComfyUI's attention
    assert stats.attention_stats()["kernel"] == before
    assert state.run.kernel == 0 and dict(state.run.fallback) == {REASON: 1}


def test_a_kept_forward_is_counted_when_it_ends(pack):
    state = PatchState(SageSettings(min_seq_len=0))
    state.begin_run()
    guard = make_apply_model_wrapper(state)
    q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=16)
    before = stats.attention_stats()["kernel"]

    def forward(x):
        for _ in range(3):
            state.dispatch(reference_backend, (q, k, v, 2), {"skip_reshape": True})
        return x

    guard(forward, torch.zeros(2))
    assert stats.attention_stats()["kernel"] == before + 3 and state.run.kernel == 3


def test_the_taking_kernel_holds_the_only_references_to_the_floats(pack, monkeypatch):
    """The container entry shares the dispatcher, which must not keep q, k, v alive beside the holders'
    hand-over: once a variant is proven, the kernel gets the only references (its peak drops each early)."""
    import sys

    from sagetriton.kernels import api, failures

    real, refs = api.attention_forward_taking, []
    monkeypatch.setattr(failures.memory, "proven_variants", set())  # none proven by an earlier test

    def counted(inputs, *args, **kwargs):
        refs.append([sys.getrefcount(inputs[i]) for i in range(3)])  # the list's slot and the argument: 2
        return real(inputs, *args, **kwargs)

    monkeypatch.setattr(api, "attention_forward_taking", counted)
    state = PatchState(SageSettings(min_seq_len=0))
    for _ in range(2):  # the first call proves the variant with the floats kept, the second takes them
        holders = [Holder(t) for t in random_qkv(b=1, h=2, lq=16, lk=16, d=32)]
        out = dispatch_containers(state, (*holders, 2), {"skip_reshape": True}, backend=reference_backend)
        assert out.shape == (1, 16, 64) and all(h.tensor is None for h in holders)
    assert refs == [[2, 2, 2]]
