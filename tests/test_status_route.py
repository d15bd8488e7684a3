"""GET /sage/status: the payload as a plain function, and the route through a real ComfyUI server."""
import json
import logging
import os
import subprocess
import sys
import threading

import pytest
from comfy_server import comfy_server

EXPECTED_KEYS = {"device", "arch", "vendor", "defaults", "variants", "crossover", "sdpa_default_safe", "stats",
                 "last_run", "setup", "report", "disabled_variants", "long_sequence_kernel", "runs_by_node"}


def test_payload_without_server(pack, tmp_path, monkeypatch):
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import CPU_ARCH
    from sagetriton.nodes.reporting import stats
    from sagetriton.nodes.reporting.panel_text import defaults_line, seq_line, status_panel
    from sagetriton.nodes.reporting.status_route import status_payload

    rep.invalidate_cache()
    p = status_payload("cpu")
    assert EXPECTED_KEYS <= set(p)
    assert p["vendor"] == "cpu" and p["arch"] == "cpu" and p["report"]["found"] is False
    assert p["defaults"]["128"]["num_stages"] >= 1 and p["stats"] == stats.attention_stats()
    # What the nodes' panel shows, worded here (web/ draws it as sent): the GPU, its defaults, the kernel's reach.
    assert p["panel"] == status_panel(p) and p["panel"]["lines"][:3] == [
        "SageTriton · cpu", defaults_line(p), seq_line(p)], p["panel"]
    # A saved report shows up (variants, crossover, sdpa_default_safe) once the cache is refreshed.
    r = rep.new_report(rep.report_key(CPU_ARCH))
    r.update(variants={"per_warp/fp16/fp32": {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9999}}},
             crossover={"seq_len": 2048}, sdpa_default_safe=True, disabled_variants=["per_block/fp8/fp16"],
             long_sequence_kernel={"ok": False, "error": "CompilationError"})
    rep.save_report(r)
    p = status_payload("cpu")
    assert p["report"]["found"] and p["crossover"]["seq_len"] == 2048 and p["sdpa_default_safe"] is True
    assert p["report"]["path"] == "$SAGETRITON_REPORT_DIR/" + rep.report_path(r["key"]).name  # no absolute path
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
        assert p["stats"] == {"kernel": 0, "fallback": {}, "sparse": 0}
        assert p["last_run"] is None
        assert p["setup"]["phase"] in ("waiting", "skipped")  # no GPU: nothing is built in the background
    ours = [ln for ln in log.splitlines() if "ComfyUI-SageTriton" in ln]
    assert any("seconds:" in ln for ln in ours), log  # listed among loaded custom nodes ...
    assert not any("IMPORT FAILED" in ln or "Cannot import" in ln for ln in ours), log  # ... and not as failed
    assert "[SageTriton] /sage/status or the background self-test unavailable" not in log, log


def _status_in_thread(timeout: float = 30.0):
    """status_payload("cpu") on another thread; None when it did not answer within ``timeout``."""
    from sagetriton.nodes.reporting.status_route import status_payload

    out = []
    t = threading.Thread(target=lambda: out.append(status_payload("cpu")), daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_at_the_report_path_is_no_report(pack, tmp_path, monkeypatch):
    """Issue 40 item 3: a FIFO is refused at once (opening it to read would wait for a writer forever)."""
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import CPU_ARCH

    fifo = tmp_path / rep.report_path(rep.report_key(CPU_ARCH)).name
    os.mkfifo(fifo)
    rep.invalidate_cache()
    try:
        p = _status_in_thread()
        assert p is not None, "status blocked on a FIFO"
        assert p["report"]["found"] is False and "not a regular file" in p["report"]["invalid"], p["report"]
        assert rep.load_report(rep.report_key(CPU_ARCH)) is None
    finally:
        try:  # a reader still blocked in open() (the bug) gets a writer and ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        rep.invalidate_cache()


# /dev/zero behind the report's name, in a child whose address space may grow 1 GiB past its imports: reading
# the file to its end would fill it (the server grew to 19.5 GB), a size-checked read refuses it.
DEV_ZERO_CHILD = r"""
import os, resource, sys
from sagetriton_import import import_pack
import_pack(run_init=False)
from sagetriton.installer import report as rep
from sagetriton.kernels.arch import CPU_ARCH
from sagetriton.nodes.reporting.status_route import _dumps, status_payload
path = rep.report_path(rep.report_key(CPU_ARCH))
path.parent.mkdir(parents=True, exist_ok=True)
os.symlink(sys.argv[1], path)
status_payload("cpu")  # everything imported and warmed up before the limit
rep.invalidate_cache()
vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
print(_dumps(status_payload("cpu")["report"]))
"""


@pytest.mark.skipif(not os.path.exists("/dev/zero") or not sys.platform.startswith("linux"), reason="Linux")
@pytest.mark.parametrize("target", ["/dev/zero", "big"])
def test_device_or_huge_file_at_the_report_path_is_no_report(pack, tmp_path, target):
    from sagetriton_import import PACK_DIR

    if target == "big":  # a regular file over the size limit (sparse: no disk used)
        with open(tmp_path / "big", "wb") as f:
            f.truncate(2 << 30)
        target = str(tmp_path / "big")
    env = {**os.environ, "SAGETRITON_REPORT_DIR": str(tmp_path / "reports")}
    proc = subprocess.run([sys.executable, "-c", DEV_ZERO_CHILD, target], cwd=str(PACK_DIR), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shown["found"] is False and shown["invalid"].startswith("unreadable"), shown


def test_status_follows_the_file_and_never_writes(pack, tmp_path, monkeypatch):
    """Issue 40 item 6: a report replaced or deleted after it was read is seen on the next request (no restart);
    a request creates no folder; the path shown is relative to the pack or home folder, not absolute."""
    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import CPU_ARCH
    from sagetriton.nodes.config.install_report import InstallReport
    from sagetriton.nodes.reporting.status_route import status_payload
    from sagetriton.nodes.routing.dispatch import PatchState

    monkeypatch.setattr(rep, "PACK_DIR", tmp_path / "pack")
    (tmp_path / "pack").mkdir()
    key = rep.report_key(CPU_ARCH)
    name = rep.report_path(key).name  # in $SAGETRITON_REPORT_DIR: report_path probes the folder it names
    monkeypatch.delenv("SAGETRITON_REPORT_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    cache = tmp_path / "home" / ".cache" / "sagetriton"
    cache.mkdir(parents=True)
    path = cache / name

    def write(seq_len):  # as another process would: atomically, without this process's save_report
        r = rep.new_report(key)
        r.update(crossover={"seq_len": seq_len}, complete=True)
        (cache / "tmp.json").write_text(json.dumps(r))
        os.replace(cache / "tmp.json", path)

    rep.invalidate_cache()
    try:
        write(2048)
        state = PatchState(report=InstallReport())
        p = status_payload("cpu")
        assert p["report"]["found"] and p["crossover"]["seq_len"] == 2048
        assert p["report"]["path"] == "~/.cache/sagetriton/" + path.name, p["report"]["path"]
        assert state.planner.plan(CPU_ARCH, 128).min_seq_len == 2048
        write(4096)  # replaced: seen by the dispatcher at its next run, and by the next request
        seen = rep.generation()
        state.begin_run()
        assert rep.generation() != seen  # the dispatcher's cue to plan again (PatchState.dispatch)
        state.planner.forget()
        assert state.planner.plan(CPU_ARCH, 128).min_seq_len == 4096
        assert status_payload("cpu")["crossover"]["seq_len"] == 4096
        path.unlink()  # deleted: no report, no path to a missing file
        p = status_payload("cpu")
        assert p["report"]["found"] is False and p["report"]["path"] is None and p["crossover"] is None
        assert not (tmp_path / "pack" / ".sagetriton").exists()  # a GET writes nothing
    finally:
        rep.invalidate_cache()


def test_a_report_disabling_every_variant_is_logged_once(pack, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    import itertools

    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import CPU_ARCH, PV_ACCUM_DTYPES, PV_PRECISIONS
    from sagetriton.nodes.reporting.status_route import status_payload

    r = rep.new_report(rep.report_key(CPU_ARCH))
    names = [rep.variant_name(*v) for v in itertools.product(("per_warp", "per_thread", "per_block"), PV_PRECISIONS,
                                                               PV_ACCUM_DTYPES)]
    r.update(disabled_variants=names, complete=True)
    rep.save_report(r)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                status_payload("cpu")
        said = [rec for rec in caplog.records if "failed the install self-test" in rec.getMessage()]
        assert len(said) == 1, [rec.getMessage() for rec in said]
    finally:
        rep.invalidate_cache()
