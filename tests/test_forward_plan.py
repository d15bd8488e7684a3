"""Forward plans (issue 42): forwards whose calls all go to ComfyUI's attention run without the override,
and in forwards that mix, the planned fallbacks skip the dispatcher; counts and outputs stay as they were."""
from __future__ import annotations

import pytest
import torch
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model, patch_state_of
from sagetriton.nodes.reporting import stats
from tiny_models import BUILDERS, sample

pytestmark = pytest.mark.usefixtures("comfyui_path", "no_install_report")

TOO_SHORT = SageSettings(min_seq_len=1 << 20)


def count_dispatches(monkeypatch, state) -> list:
    """Calls that reach the dispatcher (the plan's fast path and pass-through forwards do not)."""
    seen = []
    dispatch = state.dispatch

    def counted(func, args, kwargs):
        seen.append(args[1].shape[-2] if args[1].ndim == 4 else args[1].shape[1])
        return dispatch(func, args, kwargs)

    monkeypatch.setattr(state, "dispatch", counted)
    return seen


def test_forwards_too_short_for_the_kernel_run_without_the_override(tiny, monkeypatch):
    t = tiny("sd15")
    reference = sample(t, steps=3)
    patched = patch_model(t.patcher, TOO_SHORT)
    seen = count_dispatches(monkeypatch, patch_state_of(patched))
    out = sample(t, patched, steps=3)
    run = stats.last_run()
    per_forward = len(seen)  # only the first forward went through the override
    assert per_forward > 0 and run["kernel"] == 0
    assert run["passed_through"] == 2 and run["fallback_total"] == 3 * per_forward
    assert "2 forwards passed through whole (every call shorter than the crossover" in run["text"]
    assert torch.equal(out, reference)

    sample(t, patched, steps=2)  # the next run knows the shape from its first forward on
    assert len(seen) == per_forward and stats.last_run()["passed_through"] == 2


def test_a_mixed_forward_sends_planned_fallbacks_past_the_dispatcher(tiny, monkeypatch):
    t = tiny("wan21")  # self-attention has 32 keys (kernel), cross-attention 8 text tokens (fallback)
    patched = patch_model(t.patcher, SageSettings(min_seq_len=16))
    state = patch_state_of(patched)
    seen = count_dispatches(monkeypatch, state)
    sample(t, patched, steps=3)
    run = stats.last_run()
    assert run["kernel"] > 0 and run["fallback"] == {"key length < 16": run["kernel"]}
    assert run["passed_through"] == 0
    first = seen.count(8)  # the first forward's cross-attention calls: every later one skipped the dispatcher
    assert first > 0 and first * 3 == run["kernel"] and seen.count(32) == run["kernel"]


def test_changed_settings_plan_again(tiny):
    t = tiny("sd15")
    patched = patch_model(t.patcher, TOO_SHORT)
    sample(t, patched, steps=2)
    assert stats.last_run()["passed_through"] == 1
    patch_state_of(patched).settings = SageSettings(min_seq_len=0)  # Sage Settings replaced in place
    sample(t, patched, steps=2)
    run = stats.last_run()
    assert run["kernel"] > 0 and run["fallback_total"] == 0 and run["passed_through"] == 0


def test_a_call_off_the_plan_goes_to_the_dispatcher(tiny, monkeypatch):
    """Calls in another order or shape than the plan's first forward: the shape check hands them on."""
    from sagetriton.nodes.routing.forward_plan import ForwardPlan, _Forward

    t = tiny("sd15")
    patched = patch_model(t.patcher, SageSettings(min_seq_len=0))
    state = patch_state_of(patched)
    seen = count_dispatches(monkeypatch, state)
    override = patched.model_options["transformer_options"]["optimized_attention_override"]
    q = torch.randn(1, 16, 64, dtype=torch.float16)
    planned_shape = torch.Size((1, 24, 64))
    forward = state.forward_plans.local.forward = _Forward(ForwardPlan(None, [(planned_shape, planned_shape, 0)],
                                                                        ["key length < 99"]))
    state.begin_run()
    try:
        override(lambda *a, **k: pytest.fail("the plan's fallback ran for a call it does not fit"), q, q, q, 2)
    finally:
        state.forward_plans.local.forward = None
    run = state.runs.end()
    assert seen == [16] and run.kernel == 1 and forward.counts == [0]



def test_training_forwards_leave_no_plan(comfyui_path):
    """Training forwards send every call to ComfyUI's attention (the kernel has no backward): a plan learnt
    from them would make inference forwards of the same shapes pass the kernel by."""
    from sagetriton.nodes.routing.dispatch import NEEDS_GRAD
    from test_training import _train

    t = BUILDERS["wan21"](dtype=torch.bfloat16, seed=0)
    patched = patch_model(t.patcher)
    before = stats.attention_stats()["fallback"].get(NEEDS_GRAD, 0)
    with torch.inference_mode():  # as ComfyUI runs every node
        _train(patched, t, steps=1)
    assert stats.attention_stats()["fallback"].get(NEEDS_GRAD, 0) > before
    assert not patch_state_of(patched).forward_plans.entries


def forward_of(patched, t, x: torch.Tensor) -> torch.Tensor:
    """One forward of ``patched`` through its APPLY_MODEL wrappers, as a sampler step calls it."""
    import comfy.patcher_extension

    topts = dict(patched.model_options["transformer_options"])
    topts["wrappers"] = comfy.patcher_extension.copy_nested_dicts(patched.wrappers)
    with torch.inference_mode():  # as ComfyUI samples
        return patched.model.apply_model(x, torch.tensor([1.0]), c_crossattn=t.positive[0][0],
                                         transformer_options=topts)


def test_concurrent_forwards_of_one_model_each_learn_their_own_plan(tiny, monkeypatch):
    """Issue 49 item 4: thread B's forward starting and ending inside thread A's first forward (a server's
    prompts, MultiGPU work units) left A's forward unobserved: A's shape learnt "every call on ComfyUI's
    attention" and its later forwards skipped the kernel."""
    import threading

    t = tiny("wan21")  # self-attention has 32 keys (kernel), cross-attention 8 text tokens (fallback)
    patched = patch_model(t.patcher, SageSettings(min_seq_len=16))
    state = patch_state_of(patched)
    a_inside, b_done = threading.Event(), threading.Event()
    dispatch = state.dispatch
    first_of_a = []

    def pausing(func, args, kwargs):  # A's first call waits until B's whole forward is over
        if threading.current_thread().name == "A" and not first_of_a:
            first_of_a.append(1)
            a_inside.set()
            assert b_done.wait(120)
        return dispatch(func, args, kwargs)

    monkeypatch.setattr(state, "dispatch", pausing)
    x_a, x_b = t.latent, t.latent[..., :4]  # 32 and 16 image tokens: two shapes, two plans
    errors = []

    def run(name, x, before=None, after=None):
        try:
            if before is not None:
                assert before.wait(120)
            forward_of(patched, t, x)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            if after is not None:
                after.set()

    threads = [threading.Thread(target=run, args=("A", x_a), name="A"),
               threading.Thread(target=run, args=("B", x_b, a_inside, b_done), name="B")]
    state.begin_run()
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors, errors
    plans = state.forward_plans.entries
    assert len(plans) == 2 and all(p.whole is None for p in plans.values())
    state.begin_run()
    forward_of(patched, t, x_a)  # A's shape again, by its plan: self-attention on the kernel
    run = state.runs.end()
    assert run.kernel > 0 and run.passed_through == 0, (run.kernel, dict(run.fallback))
