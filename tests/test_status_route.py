"""GET /sage/status: the payload as a plain function, and the route through a real ComfyUI server."""
from pathlib import Path

import pytest
from comfy_server import comfy_server

EXPECTED_KEYS = {"device", "arch", "vendor", "defaults", "variants", "crossover", "sdpa_default_safe", "stats",
                 "last_run", "setup", "report", "disabled_variants", "long_sequence_kernel", "runs_by_node"}


def test_payload_without_server(pack, tmp_path, monkeypatch):
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import CPU_ARCH
    from sagetriton.nodes import stats
    from sagetriton.nodes.status_route import status_payload

    rep.invalidate_cache()
    p = status_payload("cpu")
    assert EXPECTED_KEYS <= set(p)
    assert p["vendor"] == "cpu" and p["arch"] == "cpu" and p["report"]["found"] is False
    assert p["defaults"]["128"]["num_stages"] >= 1 and p["stats"] == stats.attention_stats()
    # A saved report shows up (variants, crossover, sdpa_default_safe) once the cache is refreshed.
    r = rep.new_report(rep.report_key(CPU_ARCH))
    r.update(variants={"per_warp/fp16/fp32": {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9999}}},
             crossover={"seq_len": 2048}, sdpa_default_safe=True, disabled_variants=["per_block/fp8/fp16"],
             long_sequence_kernel={"ok": False, "error": "CompilationError"})
    rep.save_report(r)
    p = status_payload("cpu")
    assert p["report"]["found"] and p["crossover"]["seq_len"] == 2048 and p["sdpa_default_safe"] is True
    assert p["report"]["path"] == str(rep.report_path(r["key"])) and tmp_path in Path(p["report"]["path"]).parents
    assert p["min_seq_len_resolved"] == 2048
    assert p["disabled_variants"] == ["per_block/fp8/fp16"] and "per_warp/fp16/fp32" in p["variants"]
    assert p["long_sequence_kernel"] == {"ok": False, "error": "CompilationError"}
    rep.invalidate_cache()
    # Each Patch node's own last run, by node id (the UI shows a node its own run, never another's).
    stats.set_last_run({"kernel": 3, "fallback": {}, "node_id": "4"})
    stats.set_last_run({"kernel": 5, "fallback": {"x": 1}, "node_id": "9"})
    runs = status_payload("cpu")["runs_by_node"]
    rep.invalidate_cache()  # that call cached this test's report again: later tests must not plan from it
    assert runs["4"]["kernel"] == 3 and runs["9"]["kernel"] == 5


@pytest.mark.server
def test_status_route_in_real_comfyui(comfyui_path, tmp_path):
    import time

    env = {"SAGETRITON_REPORT_DIR": str(tmp_path), "SAGETRITON_SETUP_DELAY": "0"}
    with comfy_server(comfyui_path, env=env) as srv:
        direct = srv.get_json("/sage/status")
        for _ in range(100):  # the background first-start decides within a moment: no GPU, nothing to build
            mirrored = srv.get_json("/api/sage/status")
            if mirrored["setup"]["phase"] != "waiting":
                break
            time.sleep(0.1)
        log = srv.log()
    assert mirrored["setup"]["phase"] == "skipped" and "no GPU" in mirrored["setup"]["message"]
    assert log.count("the kernel is off; a patched model sends every attention call to ComfyUI's own") == 1, \
        log[-3000:]
    for p in (direct, mirrored):
        assert EXPECTED_KEYS <= set(p), sorted(p)
        assert p["vendor"] == "cpu" and p["device"] == "cpu"  # ComfyUI runs with --cpu
        assert p["stats"] == {"kernel": 0, "fallback": {}}
        assert p["last_run"] is None
        assert p["setup"]["phase"] in ("waiting", "skipped")  # no GPU: nothing is built in the background
    ours = [ln for ln in log.splitlines() if "ComfyUI-SageTriton" in ln]
    assert any("seconds:" in ln for ln in ours), log  # listed among loaded custom nodes ...
    assert not any("IMPORT FAILED" in ln or "Cannot import" in ln for ln in ours), log  # ... and not as failed
    assert "[SageTriton] /sage/status or the background self-test unavailable" not in log, log
