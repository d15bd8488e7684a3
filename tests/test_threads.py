"""One thread per GPU, as core's "MultiGPU Work Units" runs it: two threads, each sampling its own patched
model at the same time, must give what each gives alone, with each run's counters its own and no kernel
turned off. On the CPU both threads share one device; kernels run one at a time (the Triton interpreter
patches Triton globally while it runs one), everything else (ComfyUI's sampling, the dispatcher, plans,
replays, counters) runs concurrently. bench/two_gpu.py runs the same with each thread on its own H200.
"""
from __future__ import annotations

import threading

import pytest
import torch
from sagetriton.kernels import api, failures, replay
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_model
from sagetriton.nodes.reporting import run_summary
from tiny_models import BUILDERS, sample
from triton.runtime.interpreter import InterpretedFunction

pytestmark = pytest.mark.usefixtures("comfyui_path")


@pytest.fixture
def kernels_one_at_a_time(monkeypatch, no_install_report):
    run = InterpretedFunction.run
    lock = threading.Lock()

    def serialized(self, *args, **kwargs):
        with lock:
            return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", serialized)
    monkeypatch.setattr(replay, "DEVICE_TYPES", ("cuda", "cpu"))  # replays too, as on a GPU
    replay.clear()
    yield
    replay.clear()


def test_two_threads_sample_two_patched_models_at_once(kernels_one_at_a_time, monkeypatch):
    models = [BUILDERS["wan21"](seed=0), BUILDERS["wan21"](seed=1)]
    patched = [patch_model(m.patcher, SageSettings(min_seq_len=0)) for m in models]
    summaries: dict = {}
    finish = run_summary.finish_run

    def noting_finish(state):
        summary = finish(state)
        summaries.setdefault(threading.get_ident(), []).append(summary)
        return summary

    monkeypatch.setattr(run_summary, "finish_run", noting_finish)
    alone = [sample(m, p, steps=3) for m, p in zip(models, patched, strict=True)]
    alone_runs = summaries.pop(threading.get_ident())
    assert all(r["kernel"] > 0 and r["fallback"] == {} for r in alone_runs), alone_runs

    results, errors = {}, []
    start = threading.Barrier(2)

    def work(i):
        try:
            start.wait()
            results[i] = (sample(models[i], patched[i], steps=3), threading.get_ident())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    for i in range(2):
        out, ident = results[i]
        assert torch.equal(out, alone[i]), i  # the same bits as the model sampled alone
        (run,) = summaries[ident]
        assert run["kernel"] == alone_runs[i]["kernel"] and run["fallback"] == {}, (i, run, alone_runs[i])
    assert api.shared_kv_error() is None


def test_a_run_ending_on_one_thread_leaves_the_other_threads_replays(kernels_one_at_a_time):
    """A sampling run's end frees its thread's recorded calls (``replay``), not those of a run still going on
    another GPU's thread."""
    from types import SimpleNamespace

    def call():
        q, k, v = (torch.randn(1, 2, 24, 16, dtype=torch.float16) for _ in range(3))
        api.sageattn(q, k, v)

    other = threading.Thread(target=call)
    other.start()
    other.join()
    call()
    assert len(failures.memory.replays) == 2
    run_summary.finish_run(SimpleNamespace(runs=SimpleNamespace(end=lambda: None)))  # this thread's run ends
    assert [key[-1] for key in failures.memory.replays] == [other.ident]

