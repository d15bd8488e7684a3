"""What a user reads: messages that agree with each other, short tooltips, one figure per claim, one address."""
from __future__ import annotations


def test_no_gpu_start_log_and_run_summary_tell_the_same_story(pack):
    """On a CPU install every call runs on ComfyUI's own attention: the start log, the run summary (log and
    node) must not say "nothing is patched" on one side and "replaced ComfyUI's attention" on the other."""
    from sagetriton.installer.firststart import NO_GPU_LOG
    from sagetriton.nodes.run_summary import format_summary

    own = "ComfyUI's global attention (sub_quad)"  # what describe_replaced names on a CPU ComfyUI
    summary = {"kernel": 0, "fallback": {"cpu device is not a CUDA/ROCm GPU": 4}, "fallback_total": 4,
               "config_text": "", "notes": [], "replaced": own, "fallback_backend": own, "backend": "SageTriton"}
    text = format_summary(summary)
    for said in (NO_GPU_LOG, text):
        assert "replaced" not in said and "nothing is patched" not in said, said
        assert "ComfyUI's" in said and "attention" in said, said
    assert text.endswith(f"fallbacks run on {own}"), text
    assert "every attention call to ComfyUI's own attention" in NO_GPU_LOG
