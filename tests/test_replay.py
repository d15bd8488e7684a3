"""Launch replay (``kernels/replay.py``): a call with a recent call's shapes re-issues its recorded launches.

Through the Triton interpreter, with CPU calls let into the replay (on a GPU only CUDA calls are): a
replayed call must give the bits a call worked out in full gives on the same inputs, for every path
whose launches differ (layouts, masks, LSE, GQA, 8-bit V, the rotation).
"""
import pytest
import sagetriton.kernels as kernels
import torch
from sagetriton.kernels import api, failures, host, replay
from sagetriton.kernels.arch import KernelConfig


@pytest.fixture
def replaying(monkeypatch):
    monkeypatch.setattr(replay, "DEVICE_TYPES", ("cuda", "cpu"))
    replay.clear()
    yield
    replay.clear()


def inputs(layout="HND", B=1, H=2, H_KV=1, LQ=40, LK=50, D=32, dtype=torch.float16):
    def t(h, L):
        return torch.randn((B, h, L, D) if layout == "HND" else (B, L, h, D)).to(dtype)

    return t(H, LQ), t(H_KV, LK), t(H_KV, LK)


def forbid_host_work(monkeypatch):
    def forbidden(*a, **kw):
        raise AssertionError("a replayed call planned its launches again")

    monkeypatch.setattr(host, "_plan_call", forbidden)


CASES = {
    "hnd": dict(),
    "nhd, other output layout": dict(layout="NHD", kw=dict(out_layout="HND")),
    "mask": dict(mask=True),
    "lse": dict(kw=dict(return_lse=True)),
    "fp8 V, smooth_v": dict(kw=dict(pv_precision="fp8", smooth_v=True)),
    "int8 V, rotation": dict(kw=dict(pv_precision="int8", qk_rotation=True)),
    "fp16 tiles, no smoothing": dict(kw=dict(pv_accum_dtype="fp16", smooth_k=False)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_replayed_call_gives_the_bits_of_a_full_call(seed, replaying, monkeypatch, case):
    spec = CASES[case]
    layout, kw = spec.get("layout", "HND"), dict(spec.get("kw", {}))
    kw.setdefault("tensor_layout", layout)
    first = inputs(layout)
    second = inputs(layout)
    masks = [torch.randn(1, 1, 40, 50).to(torch.float16) if spec.get("mask") else None for _ in range(2)]
    kernels.sageattn(*first, attn_mask=masks[0], **kw)  # recorded
    replay.DEVICE_TYPES = ("cuda",)
    expected = kernels.sageattn(*second, attn_mask=masks[1], **kw)  # worked out in full, not recorded
    replay.DEVICE_TYPES = ("cuda", "cpu")
    assert len(failures.memory.replays) == 1
    forbid_host_work(monkeypatch)
    again = kernels.sageattn(*second, attn_mask=masks[1], **kw)
    for a, b in zip(again if isinstance(again, tuple) else (again,), expected if isinstance(expected, tuple)
                    else (expected,), strict=True):
        assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


def test_other_shapes_strides_or_options_are_not_replayed(seed, replaying):
    q, k, v = inputs()
    kernels.sageattn(q, k, v)
    kernels.sageattn(q, k, v, smooth_k=False)
    kernels.sageattn(*inputs(LQ=41))
    kernels.sageattn(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)  # same shape, other strides
    assert len(failures.memory.replays) == 4
    cfg = KernelConfig()
    kernels.sageattn(q, k, v, config=cfg)
    kernels.sageattn(q, k, v, config=KernelConfig())  # an equal config but another object: recorded anew
    assert len(failures.memory.replays) == replay.MAX_ENTRIES  # the oldest went


def test_large_calls_keep_no_buffers(seed, replaying, monkeypatch):
    monkeypatch.setattr(replay, "MAX_BYTES", 1000)
    kernels.sageattn(*inputs())
    assert not failures.memory.replays


def count_recordings(monkeypatch) -> list:
    started = []
    real = replay.start
    monkeypatch.setattr(replay, "start", lambda: (started.append(1), real())[1])
    return started


def test_calls_too_large_to_keep_are_not_recorded_at_all(seed, replaying, monkeypatch):
    """Recording builds a direct launch per launch: about the call's own host time again. A call whose
    buffers would not be kept must not pay it (on an H200 it made 2 x 24 x 6,144 calls host-bound)."""
    monkeypatch.setattr(replay, "MAX_BYTES", 1000)
    started = count_recordings(monkeypatch)
    for _ in range(2):
        kernels.sageattn(*inputs())
    assert not started and not failures.memory.replays


def test_a_call_whose_buffers_proved_too_large_is_recorded_once(seed, replaying, monkeypatch):
    monkeypatch.setattr(replay, "MAX_BYTES", 1000)
    monkeypatch.setattr(replay, "worth_recording", lambda q, k, v: True)  # the estimate lets it through
    started = count_recordings(monkeypatch)
    q, k, v = inputs()
    first = kernels.sageattn(q, k, v)
    second = kernels.sageattn(q, k, v)
    assert len(started) == 1 and not failures.memory.replays and torch.equal(first, second)
    replay.clear()  # the end of a sampling run forgets it too
    kernels.sageattn(q, k, v)
    assert len(started) == 2


def test_a_launch_hook_sees_every_launch(seed, replaying):
    """The cross-compile check records launches through the hook: a recording must not hide them."""
    from sagetriton.installer.crosscompile import record_launches

    q, k, v = inputs()
    kernels.sageattn(q, k, v)
    with record_launches() as specs:
        kernels.sageattn(q, k, v)
    assert {s["name"] for s in specs} >= {"quantize_int8_kernel", "attention_kernel"}


def test_a_recording_keeps_no_tensor_of_its_call_alive(seed, replaying):
    import weakref

    q, k, v = inputs()
    out = kernels.sageattn(q, k, v)
    refs = [weakref.ref(t) for t in (q, k, v, out)]
    del q, k, v, out
    assert len(failures.memory.replays) == 1 and all(r() is None for r in refs)


def test_the_end_of_a_sampling_run_frees_the_buffers(seed, replaying):
    """Reused buffers are held for a run only: between prompts ComfyUI gets the memory back."""
    from sagetriton.nodes.reporting.run_summary import finish_run
    from sagetriton.nodes.routing.dispatch import PatchState

    state = PatchState()
    state.begin_run()
    kernels.sageattn(*inputs())
    assert failures.memory.replays
    finish_run(state)
    assert not failures.memory.replays


def _taking_call(inputs: list):
    from sagetriton.kernels.arch import arch_for_device

    cfg = api._resolved_config(arch_for_device(inputs[0].device), inputs[0].shape[-1], None, None, None)
    out = api.attention_forward_taking(inputs, "HND", False, None, None, cfg, True, False)
    assert inputs == []  # handed over
    return out


def test_small_container_calls_are_replayed(seed, replaying, monkeypatch):
    """Current ComfyUI hands q, k, v over in containers (``attention_forward_taking``): where a call is
    small enough to keep its buffers, host time matters more than freeing the floats early, so it is
    recorded and replayed like any other call."""
    _taking_call(list(inputs()))  # recorded
    second = inputs()
    replay.DEVICE_TYPES = ("cuda",)
    expected = _taking_call([t.clone() for t in second])  # worked out in full
    replay.DEVICE_TYPES = ("cuda", "cpu")
    forbid_host_work(monkeypatch)
    assert torch.equal(_taking_call(list(second)), expected)


def test_large_container_calls_release_their_inputs_instead(seed, replaying, monkeypatch):
    import weakref

    monkeypatch.setattr(replay, "MAX_BYTES", 1000)
    seen = []
    real = host._launch_attention

    def spy(plan, *args, **kwargs):
        seen.append([r() is None for r in refs])
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(host, "_launch_attention", spy)
    tensors = list(inputs())
    refs = [weakref.ref(t) for t in tensors]
    expected = kernels.sageattn(*tensors)
    out = _taking_call(tensors)
    assert not failures.memory.replays and torch.equal(out, expected)
    assert seen[-1][:2] == [True, True]  # q and k were freed before the attention launch (V is read in place here)


def test_a_launch_hook_sends_replays_back_through_triton():
    """A profiler's launch hook (Triton's ``knobs``) needs launch metadata that direct launches do not
    build: while one is set, replays go through ``kernel[grid]``."""
    from sagetriton.kernels import launcher
    from triton import knobs

    assert launcher.idle_hooks() is not None
    chain = knobs.runtime.launch_enter_hook

    def hook(*_):
        return None

    if hasattr(chain, "add"):  # Triton 3.6+: a chain of hooks
        chain.add(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
    try:
        assert launcher.idle_hooks() is None
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            knobs.runtime.launch_enter_hook = chain
    assert launcher.idle_hooks() is not None


def test_a_direct_launch_fills_its_slots_and_keeps_no_tensor():
    """``DirectLaunch`` hands the compiled kernel's launcher the recorded arguments with the call's
    tensors in their slots, and lets go of those tensors afterwards (here the launcher is a function
    that records what it got: the real one needs a GPU, where bench/gpu_check.py runs it)."""
    import weakref

    from sagetriton.kernels import launcher

    got = []
    buffer = torch.zeros(4)
    direct = launcher.DirectLaunch(lambda *a: got.append(a), (3, 2, 1), "function", "metadata", 7,
                                   [None, buffer, 5, None])
    q, out = torch.ones(2), torch.empty(2)
    direct(((0, 0), (3, 1)), (q, out), ("enter", "exit"))
    assert got[0][:9] == (3, 2, 1, 7, "function", "metadata", None, "enter", "exit")
    assert got[0][9] is q and got[0][10] is buffer and got[0][11] == 5 and got[0][12] is out
    refs = [weakref.ref(q), weakref.ref(out)]
    got.clear()
    del q, out
    assert all(r() is None for r in refs) and direct.values[0] is None and direct.values[3] is None


def test_direct_launches_need_a_compiled_kernel():
    """The interpreter returns no compiled kernel: its replays stay on ``kernel[grid]``."""
    from sagetriton.kernels import launcher, quant

    assert launcher.direct_launch(quant.quantize_int8_kernel, (1, 1), (torch.zeros(1),), {}, None, 0) is None
    assert launcher.aligned(torch.zeros(8)) and not launcher.aligned(torch.zeros(8)[1:])


def test_a_direct_launch_that_raises_is_launched_through_triton_and_stays_off(seed, replaying, monkeypatch, caplog):
    """A Triton whose launcher takes other arguments must not fail a run: the replay launches that call
    through ``kernel[grid]`` (the launches before it went out already), logs once, and that kernel's
    direct launches stay off, in this recording and every other one. The launches are the recording's
    own, through real ``DirectLaunch`` slot filling; only the compiled launcher, which needs a GPU, is a
    function here: one that runs the kernel through Triton, and for the attention kernel one that raises
    as a changed launcher would."""
    import logging

    from sagetriton.kernels import attention, launcher

    monkeypatch.setattr(failures.memory, "direct_launch", {})
    kernels.sageattn(*inputs())  # recorded
    kernels.sageattn(*inputs(LQ=41))  # a second recording, with its own attention launch
    second = inputs()
    replay.DEVICE_TYPES = ("cuda",)
    expected = kernels.sageattn(*second)
    replay.DEVICE_TYPES = ("cuda", "cpu")
    direct_runs, raised = [], []

    def fake_direct(rec):
        out = []
        for (kernel, grid, args, kwargs), _ in rec.launches:
            n = len(args)

            def run(*a, kernel=kernel, grid=grid, n=n, kwargs=kwargs):
                if kernel is attention.attention_kernel:
                    raised.append(kernel)
                    raise TypeError("launch() takes 14 positional arguments but 13 were given")
                direct_runs.append(kernel)
                kernel[grid](*a[len(launcher.LAUNCH_PARAMS):len(launcher.LAUNCH_PARAMS) + n], **kwargs)
            padded = tuple(grid) + (1,) * (3 - len(grid))
            out.append(launcher.DirectLaunch(run, padded, "function", "metadata", 0, list(args), kernel))
        return out

    recs = list(failures.memory.replays.values())
    for rec in recs:
        rec.direct = fake_direct(rec)
    kinds = [kernel for (kernel, *_), _ in recs[0].launches]
    before = kinds.index(attention.attention_kernel)
    assert before > 0  # some launches go out directly before the failing one
    forbid_host_work(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="SageTriton"):
        again = kernels.sageattn(*second)
        assert torch.equal(again, expected)
        assert direct_runs == kinds[:before] and raised == [attention.attention_kernel]
        assert all(rec.direct is None for rec in recs) and recs[0].direct_calls == 0
        assert launcher.disabled(attention.attention_kernel) and "14 positional" in launcher.disabled(
            attention.attention_kernel)
        assert torch.equal(kernels.sageattn(*second), expected)  # and again, through kernel[grid]
    assert len(raised) == 1 and len(direct_runs) == before
    logged = [r.getMessage() for r in caplog.records if "direct launch" in r.getMessage()]
    assert len(logged) == 1 and "attention_kernel" in logged[0] and "TypeError" in logged[0], logged


def test_a_launcher_with_another_signature_gets_no_direct_launches():
    """When a replay is recorded, the compiled kernel's launcher must take the call a direct launch makes:
    the installed Triton's does; one that names its leading arguments otherwise or needs more does not."""
    from sagetriton.kernels import launcher
    from triton.backends.nvidia.driver import CudaLauncher

    installed = CudaLauncher.__new__(CudaLauncher).__call__  # bound: what CompiledKernel.run returns
    assert launcher.launcher_accepts(installed, 20)

    def triton36(gridX, gridY, gridZ, stream, function, *args):
        pass

    def regrouped(grid, stream, function, kernel_metadata, launch_metadata, enter, exit, *args):
        pass

    def needs_scratch(gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                      launch_enter_hook, launch_exit_hook, *args, scratch):
        pass

    def fixed(gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, launch_enter_hook,
              launch_exit_hook, a, b):
        pass

    assert launcher.launcher_accepts(triton36, 20)
    assert not launcher.launcher_accepts(regrouped, 20)
    assert not launcher.launcher_accepts(needs_scratch, 20)
    assert launcher.launcher_accepts(fixed, 2) and not launcher.launcher_accepts(fixed, 3)
    assert not launcher.launcher_accepts(len, 2)  # a C function: nothing to check, so no direct launches
