"""Issue 31, non-finite guard: a planted NaN kernel result on a tiny real ComfyUI model is redone on ComfyUI's
attention (one check per forward), counted as a fallback reason on the node and in /sage/status."""
import pytest
import torch
from sagetriton.nodes import stats
from tiny_models import BUILDERS, sample

pytestmark = pytest.mark.usefixtures("comfyui_path", "no_install_report")


@pytest.mark.parametrize("planted", [float("nan"), float("inf")])
def test_planted_non_finite_kernel_result_is_redone(pack, monkeypatch, planted):
    from sagetriton.nodes.nonfinite_guard import REASON
    from sagetriton.nodes.patch_node import SageTritonPatchModelAttention
    from sagetriton.nodes.status_route import status_payload

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
    assert run["fallback"].get(REASON, 0) >= run["kernel"] > 0, run["fallback"]
    assert status_payload("cpu")["last_run"]["fallback"][REASON] == run["fallback"][REASON]
    assert REASON in run["text"]  # the run summary (log and panel)
