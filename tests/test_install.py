"""`python install.py` on this CPU-only machine, run the way ComfyUI-Manager runs it (a script in the
pack folder, where the pack is not importable by name)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from pack_loader import PACK_DIR

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path needs a machine without a GPU")


@pytest.fixture(scope="module")
def cpu_install(tmp_path_factory):
    report_dir = tmp_path_factory.mktemp("report")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as a user's shell has it
    env["SAGETRITON_REPORT_DIR"] = str(report_dir)
    proc = subprocess.run([sys.executable, "install.py"], cwd=str(PACK_DIR), capture_output=True, text=True,
                          env=env, timeout=900)
    return proc, report_dir


def test_exits_zero_with_a_clear_no_gpu_report(cpu_install):
    proc, _ = cpu_install
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no GPU found" in out and "== No GPU found" in out
    assert "[ OK ] torch" in out and "[ OK ] triton" in out
    assert "leaves ComfyUI's attention in place" in out
    assert "Traceback" not in out + proc.stderr


def test_cross_compile_table_in_output(cpu_install):
    out = cpu_install[0].stdout
    for target in ("sm80", "sm86", "sm89", "sm90", "sm120", "gfx1100", "gfx1201", "gfx942"):
        assert f"[ OK ] {target}" in out, out
    assert "wgmma e4m3" in out and "v_wmma_i32_16x16x16_iu8" in out and "v_mfma_i32_" in out


def test_interpreter_selftest_passes_every_variant(cpu_install):
    proc, report_dir = cpu_install
    assert "build + self-test" in proc.stderr  # progress
    reports = list(report_dir.glob("report-cpu-*.json"))
    assert len(reports) == 1
    r = json.loads(reports[0].read_text())
    assert r["mode"] == "interpreter" and r["complete"] is True and r["key"]["arch"] == "cpu"
    assert len(r["variants"]) == 18  # 3 granularities x 2 P·V precisions x 3 accumulations (fp8 emulated)
    assert r["disabled_variants"] == [], r["disabled_variants"]
    for name, v in r["variants"].items():
        assert v["build"]["ok"] and v["selftest"]["ok"], (name, v)
        assert v["selftest"]["cosine"] >= 0.999, (name, v)
    assert all(c["ok"] for c in r["cross_compile"].values())
    assert any(c["name"] == "gpu" and c["status"] == "warn" for c in r["doctor"])
    assert not list(report_dir.glob(".worker-*"))  # the worker's progress file is cleaned up


def test_strict_passes_when_everything_on_this_machine_passes(cpu_install, tmp_path):
    # The report from the module run is not reused on CPU (nothing is cached for the no-GPU path), so
    # this only checks the exit-code contract quickly with the cross-compile skipped.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SAGETRITON_REPORT_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "install.py", "--strict", "--skip-cross-compile"], cwd=str(PACK_DIR),
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_worker_crash_does_not_fail_install(tmp_path):
    # A worker that dies at start-up (as with a broken GPU driver) is reported; install.py still exits 0.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SAGETRITON_REPORT_DIR"] = str(tmp_path)
    code = ("import runpy, sys; sys.argv = ['install.py', '--skip-cross-compile'];"
            "import importlib; inst = runpy.run_path('install.py', run_name='not_main');"
            "fs = inst['pack_module']('kernels.firststart');"
            "fs._worker_cmd = lambda out, mode, echo: [sys.executable, '-c', 'import os; os.abort()'];"
            "sys.exit(inst['main'](['--skip-cross-compile']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(PACK_DIR), capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "SIGABRT" in proc.stdout
