"""Issue 31, non-finite guard: a planted NaN kernel result on a tiny real ComfyUI model is redone on ComfyUI's
attention (one check per forward), counted as a fallback reason on the node and in /sage/status."""
import pytest
import torch
from sagetriton.nodes.reporting import stats
from tiny_models import BUILDERS, sample

pytestmark = pytest.mark.usefixtures("comfyui_path", "no_install_report")


@pytest.mark.parametrize("planted", [float("nan"), float("inf")])
def test_planted_non_finite_kernel_result_is_redone(pack, monkeypatch, planted):
    from sagetriton.nodes.reporting.status_route import status_payload
    from sagetriton.nodes.routing.nonfinite_guard import REASON
    from sagetriton.nodes.ui.patch_node import SageTritonPatchModelAttention

    t = BUILDERS["wan21"](seed=0)
    reference = sample(t, steps=2)
    real = pack.kernels.sageattn
    calls = []

    def planted_kernel(*args, **kwargs):  # the real kernel, with one element of its result made non-finite
        calls.append(1)
        out = real(*args, **kwargs)
        out.view(-1)[0] = planted
        return out

    monkeypatch.setattr(pack.kernels, "sageattn", planted_kernel)
    (patched,) = SageTritonPatchModelAttention().patch(t.patcher)
    out = sample(t, patched, steps=2)
    assert calls and torch.isfinite(out).all()
    assert torch.allclose(out, reference, atol=1e-3), (out - reference).abs().max()  # as ComfyUI's attention
    run = stats.last_run()
    # Issue 40: a discarded forward's kernel calls are not counted; the redo's calls are, as fallbacks.
    assert run["kernel"] == 0 and run["fallback"].get(REASON, 0) > 0, run
    assert status_payload("cpu")["last_run"]["fallback"][REASON] == run["fallback"][REASON]
    assert REASON in run["text"]  # the run summary (log and panel)


def test_a_redo_on_one_thread_leaves_other_threads_on_the_kernel(pack):
    """Issue 40 item 5: the guard's redo belongs to the forward (its thread), not to the model."""
    import threading

    from attention_cases import random_qkv, reference_backend
    from sagetriton.nodes.config.settings import SageSettings
    from sagetriton.nodes.routing.dispatch import PatchState
    from sagetriton.nodes.routing.nonfinite_guard import REASON, make_apply_model_wrapper

    state = PatchState(SageSettings(min_seq_len=0))
    state.begin_run()
    guard = make_apply_model_wrapper(state)
    q, k, v = random_qkv(b=1, h=2, lq=16, lk=16, d=16)
    in_redo, other_done = threading.Event(), threading.Event()
    forwards = []

    def forward(x):  # one attention call per forward; the first forward's result is non-finite
        forwards.append(1)
        state.dispatch(reference_backend, (q, k, v, 2), {"skip_reshape": True})
        if len(forwards) == 1:
            return torch.full_like(x, float("nan"))
        in_redo.set()  # the other thread runs while this one is inside its redo
        assert other_done.wait(60)
        return x

    def other_thread():
        assert in_redo.wait(60)
        for _ in range(5):
            state.dispatch(reference_backend, (q, k, v, 2), {"skip_reshape": True})
        other_done.set()

    t = threading.Thread(target=other_thread)
    t.start()
    assert torch.isfinite(guard(forward, torch.zeros(2))).all()
    t.join(60)
    # The other thread's 5 calls on the kernel; the redo's one call on ComfyUI's; the discarded first forward's
    # kernel call not counted at all.
    assert state.run.kernel == 5 and dict(state.run.fallback) == {REASON: 1}, (state.run.kernel, state.run.fallback)


def test_a_discarded_forwards_rope_calls_are_not_counted(pack, monkeypatch):
    """Issue 49 item 5: the redone forwards' RoPE calls ran on ComfyUI's RoPE, the discarded ones' are taken back
    with their attention calls (the summary said ``rope=4`` beside ``kernel=0``)."""
    from sagetriton.nodes.patching import patch_model

    t = BUILDERS["wan21"](seed=0)
    patched = patch_model(t.patcher)
    sample(t, patched, steps=2)
    kept = stats.last_run()
    assert kept["rope"] > 0 and kept["kernel"] > 0  # Wan's RoPE and attention on the kernel in kept forwards
    real = pack.kernels.sageattn

    def planted_kernel(*args, **kwargs):
        out = real(*args, **kwargs)
        out.view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(pack.kernels, "sageattn", planted_kernel)
    sample(t, patched, steps=2)
    run = stats.last_run()
    assert (run["kernel"], run["rope"]) == (0, 0), run
