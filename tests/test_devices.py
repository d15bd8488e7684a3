"""Every launch on its inputs' device (``kernels/devices.py``), and wrapper subclasses never read by pointer.

No GPU here, so the devices are faked: ``torch.cuda.device`` is replaced by a recorder that keeps a
per-thread "current device", CPU calls are let into the guard, and each kernel the Triton interpreter
runs notes the current device it was launched under. On a GPU the same guard is ``torch.cuda.device``
(bench/two_gpu.py checks it on two H200s).
"""
import threading

import pytest
import sagetriton.kernels as kernels
import torch
from sagetriton.kernels import devices, failures, replay, rope
from triton.runtime.interpreter import InterpretedFunction


class FakeGuard:
    """Stands in for ``torch.cuda.device``: the device entered, per thread, restored on exit."""

    local = threading.local()
    entered: list = []

    def __init__(self, device):
        self.device = torch.device(device)

    def __enter__(self):
        self.prev = getattr(FakeGuard.local, "current", None)
        FakeGuard.local.current = self.device
        FakeGuard.entered.append(self.device)

    def __exit__(self, *exc):
        FakeGuard.local.current = self.prev


@pytest.fixture
def fake_devices(monkeypatch):
    """CPU launches guarded by ``FakeGuard``; yields the list of (kernel, device current at its launch)."""
    monkeypatch.setattr(torch.cuda, "device", FakeGuard)
    monkeypatch.setattr(devices, "GUARDED", ("cuda", "cpu"))
    FakeGuard.entered = []
    FakeGuard.local.current = None
    launches = []
    run = InterpretedFunction.run
    one_at_a_time = threading.Lock()  # the interpreter patches Triton globally while it runs a kernel

    def noting_run(self, *args, **kwargs):
        launches.append((self.fn.__name__, getattr(FakeGuard.local, "current", None)))
        with one_at_a_time:
            return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", noting_run)
    yield launches


def test_the_guard_is_torch_cuda_device_with_the_inputs_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device", FakeGuard)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    FakeGuard.entered = []
    with devices.device_scope(torch.device("cuda", 1)):
        assert FakeGuard.local.current == torch.device("cuda", 1)
    assert FakeGuard.entered == [torch.device("cuda", 1)]
    with devices.device_scope(torch.device("cuda", 0)):  # already current: nothing to switch
        pass
    assert FakeGuard.entered == [torch.device("cuda", 1)]
    with devices.device_scope(torch.device("cpu")):  # no current-device notion: nothing entered
        pass
    assert FakeGuard.entered == [torch.device("cuda", 1)]


def test_the_launch_device_of_a_descriptor_is_its_tensors():
    class Descriptor:  # Triton's TensorDescriptor keeps its tensor as .base
        base = torch.empty(2, device="meta")

    assert devices.launch_device((Descriptor(), 3, torch.empty(1))) == torch.device("meta")
    assert devices.launch_device((1, 2.0)) is None


def test_every_attention_launch_runs_under_the_inputs_device(fake_devices, seed, monkeypatch):
    """First call (worked out in full and recorded), its replay, the LSE path and the RoPE kernel."""
    monkeypatch.setattr(replay, "DEVICE_TYPES", ("cuda", "cpu"))
    replay.clear()
    try:
        for _ in range(2):  # the second call replays the first's launches
            q, k, v = (torch.randn(1, 2, 40, 32, dtype=torch.float16) for _ in range(3))
            kernels.sageattn(q, k, v, return_lse=True)
        assert failures.memory.replays, "the second call was not a replay"
        x = torch.randn(1, 2, 8, 16)
        freqs = torch.randn(1, 1, 8, 8, 2, 2)
        rope.apply(x, freqs, x.clone())
    finally:
        replay.clear()
    names = {name for name, _ in fake_devices}
    assert {"attention_kernel", "quantize_int8_kernel", "rope_kernel"} <= names, names
    unguarded = [(name, dev) for name, dev in fake_devices if dev != torch.device("cpu")]
    assert not unguarded, unguarded
    assert FakeGuard.local.current is None  # restored after each call


def test_each_thread_launches_under_its_own_inputs_device(fake_devices, seed, monkeypatch):
    """One thread per GPU (core's MultiGPU work units): the guard is per thread, never process-wide;
    each thread replays its own recordings (kernels run one at a time, as the interpreter needs)."""
    monkeypatch.setattr(replay, "DEVICE_TYPES", ("cuda", "cpu"))
    replay.clear()
    q, k, v = (torch.randn(1, 2, 24, 16, dtype=torch.float16) for _ in range(3))
    expected = kernels.sageattn(q, k, v)
    results, errors = {}, []

    def work(i):
        try:
            results[i] = [kernels.sageattn(q, k, v) for _ in range(3)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    replay.clear()
    assert not errors, errors
    assert all(torch.equal(r, expected) for i in range(2) for r in results[i])
    assert all(dev == torch.device("cpu") for _, dev in fake_devices)


def launched_types(monkeypatch) -> list:
    """The type names of the tensor arguments of every interpreted launch from now on (a list that fills)."""
    launched = []
    run = InterpretedFunction.run

    def noting_run(self, *args, **kwargs):
        launched.extend(type(a).__name__ for a in args if isinstance(a, torch.Tensor))
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", noting_run)
    return launched


def test_async_collective_tensors_are_waited_on_not_read_by_pointer(seed, monkeypatch):
    """diffusers' ring and unified context parallelism hand K/V over as ``AsyncCollectiveTensor``s,
    whose raw pointer is no data until waited on (0 here): they go through the custom op, so no kernel
    is ever launched with one (a GPU launch reads every tensor argument's pointer; the interpreter
    copies through torch, which waits, so only the arguments' types tell here)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    launched = launched_types(monkeypatch)

    q, k, v = (torch.randn(1, 2, 40, 32, dtype=torch.float16) for _ in range(3))
    expected, expected_lse = kernels.sageattn(q, k, v, return_lse=True)
    ak, av = AsyncCollectiveTensor(k.clone()), AsyncCollectiveTensor(v.clone())
    assert ak.data_ptr() != k.data_ptr()
    out, lse = kernels.sageattn(q, ak, av, return_lse=True)
    assert type(out) is torch.Tensor
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    # The dispatcher's path (ComfyUI's calls): the same.
    from sagetriton.kernels import api
    from sagetriton.kernels.arch import detect_arch, resolve_config

    cfg = resolve_config(detect_arch(), 32)[0]
    plain = api.attention_forward(q, k, v, "HND", False, None, None, False, cfg, True, False)[0]
    wrapped = api.attention_forward(q, AsyncCollectiveTensor(k.clone()), AsyncCollectiveTensor(v.clone()), "HND",
                                    False, None, None, False, cfg, True, False)[0]
    assert torch.equal(plain, wrapped)
    assert launched and set(launched) == {"Tensor"}, set(launched)


def test_the_rope_kernel_leaves_wrapper_subclasses_to_comfyui():
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    x, freqs = torch.randn(1, 2, 8, 16), torch.randn(1, 1, 8, 8, 2, 2)
    assert rope.unsupported(x, freqs) is None
    assert rope.unsupported(AsyncCollectiveTensor(x), freqs) == "not plain tensors"
    assert rope.unsupported(x, AsyncCollectiveTensor(freqs)) == "not plain tensors"



def test_every_sparse_launch_runs_under_the_inputs_device(fake_devices, seed):
    """``sparse_attn``: the pooling, the router, the quantization and the sparse kernel, eager and
    through its custom op, each launched under the inputs' device, the guard restored after."""
    q, k, v = (torch.randn(1, 200, 2, 32, dtype=torch.float16) for _ in range(3))
    kernels.sparse_attn(q, k, v, 0.5)
    from sagetriton.kernels import api, sparse_api
    from sagetriton.kernels.arch import arch_for_device

    cfg = api._resolved_config(arch_for_device(q.device), 32, None, None, None)
    torch.ops.sagetriton.sparse_attention(q, k, v, 0.5, "NHD", 32 ** -0.5, [], [], 0.0, 0, True, "NHD",
                                          *sparse_api._cfg_fields(cfg))
    names = {name for name, _ in fake_devices}
    assert {"pool_kernel", "route_kernel", "sparse_attention_kernel"} <= names, names
    unguarded = [(name, dev) for name, dev in fake_devices if dev != torch.device("cpu")]
    assert not unguarded, unguarded
    assert FakeGuard.local.current is None


def test_sparse_attn_waits_on_async_collective_tensors(seed, monkeypatch):
    """Wrapper subclasses go through ``sagetriton::sparse_attention``, whose dispatch unwraps them: no
    sparse launch gets one as an argument, and the result is the plain tensors' bit for bit."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    launched = launched_types(monkeypatch)
    q, k, v = (torch.randn(1, 200, 2, 32, dtype=torch.float16) for _ in range(3))
    expected, expected_lse = kernels.sparse_attn(q, k, v, 0.5, return_lse=True)
    out, lse = kernels.sparse_attn(q, AsyncCollectiveTensor(k.clone()), AsyncCollectiveTensor(v.clone()), 0.5,
                                   return_lse=True)
    assert type(out) is torch.Tensor and type(lse) is torch.Tensor
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    assert launched and set(launched) == {"Tensor"}, set(launched)
