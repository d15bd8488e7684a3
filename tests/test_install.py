"""`python install.py` on this CPU-only machine, run the way ComfyUI-Manager runs it (a script in the
pack folder, where the pack is not importable by name)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from sagetriton_import import PACK_DIR

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path needs a machine without a GPU"),
              pytest.mark.slow]


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
    # 3 granularities x (3 P·V precisions x 3 accumulations + int8, which sums in int32), fp8 emulated
    assert len(r["variants"]) == 30
    assert r["disabled_variants"] == [], r["disabled_variants"]
    for name, v in r["variants"].items():
        assert v["build"]["ok"] and v["selftest"]["ok"], (name, v)
        assert v["selftest"]["cosine"] >= 0.999, (name, v)
    assert all(c["ok"] for c in r["cross_compile"].values())
    assert any(c["name"] == "gpu" and c["status"] == "warn" for c in r["doctor"])
    assert not list(report_dir.glob(".worker-*"))  # the worker's progress file is cleaned up


def _install_again(report_dir):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SAGETRITON_REPORT_DIR"] = str(report_dir)
    return subprocess.run([sys.executable, "install.py"], cwd=str(PACK_DIR), capture_output=True, text=True,
                          env=env, timeout=300)


def _reading(out: str) -> dict:
    """What a person reads in install.py's output: the sections in order, the table rows in order, the
    report line."""
    lines = out.splitlines()
    return {"sections": [line for line in lines if line.startswith("== ")],
            "targets": [line[7:].split()[0] for line in lines if line.startswith(("[ OK ] sm", "[ OK ] gfx",
                                                                                   "[FAIL] sm", "[FAIL] gfx"))],
            "variants": [line.split()[0] for line in lines if line.count("/") == 2 and " ok " in line],
            "report": [line for line in lines if line.startswith("report: ")]}


def test_a_rerun_reads_like_the_first_run_only_shorter(cpu_install):
    """The second install.py reuses the first one's report and says so, with the same sections (the summary
    and the report's path included) and its tables in the same order."""
    first, report_dir = cpu_install
    again = _install_again(report_dir)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "Already self-tested" in again.stdout and "build + self-test" not in again.stderr
    before, after = _reading(first.stdout), _reading(again.stdout)
    assert after == before, (before, after)
    assert len(before["variants"]) == 30 and len(before["targets"]) == 8 and len(before["report"]) == 1, before
    assert "== What this means" in again.stdout
    assert len(again.stdout) < len(first.stdout)


def test_worker_crash_does_not_fail_install(tmp_path):
    # A worker that dies at start-up (as with a broken GPU driver) is reported; install.py still exits 0.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SAGETRITON_REPORT_DIR"] = str(tmp_path)
    code = ("import sys; from sagetriton_import import import_pack; import_pack(run_init=False);"
            "from sagetriton.installer import cli, firststart as fs;"
            "fs._worker_cmd = lambda out, mode, echo: [sys.executable, '-c', 'import os; os.abort()'];"
            "sys.exit(cli.main(['--skip-cross-compile']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(PACK_DIR), capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "SIGABRT" in proc.stdout


def _gpu_env(doctor):
    return doctor.Environment(torch_version="2.9.0", torch_hip="6.4", triton_version="3.5.0",
                              triton_required="pytorch-triton-rocm==3.5.0",
                              gpus=[doctor.GpuInfo("AMD Radeon RX 9070 XT", 12, 0, "gfx1201", 16 << 30, 15 << 30)],
                              dev_nodes={"/dev/kfd": doctor.DevNode(True, True),
                                         "/dev/dri": doctor.DevNode(True, True)})


def test_gpu_path_with_a_simulated_rdna4(monkeypatch, tmp_path, capsys):
    """install.py's GPU branch (this machine has no GPU): doctor, setup, tables, report reuse, --strict."""
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    from sagetriton.installer import cli, doctor, report
    from sagetriton.installer import firststart as fs
    monkeypatch.setattr(doctor, "probe_environment", lambda: _gpu_env(doctor))
    calls = []

    def fake_setup(arch, mode, echo, doctor, quick=False):
        calls.append((arch.arch, arch.family, mode))
        r = report.new_report(report.report_key(arch))
        r.update(mode=mode, complete=True, sdpa_default_safe=False,
                 sdpa_probe={"safe": False, "reason": "the child process was killed by SIGABRT"},
                 variants={"per_warp/fp8/fp32": {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9993,
                                                                                      "rel_l1": 0.036}},
                           "per_thread/fp8/fp16": {"build": {"ok": False, "error": "crashed the process"}}},
                 disabled_variants=["per_thread/fp8/fp16"],
                 crossover={"seq_len": 2048, "sdpa": "math", "timings": [
                     {"seq_len": 1024, "kernel_ms": 1.2, "sdpa_ms": 1.0, "kernel_tops": 100.0, "sdpa_tops": 120.0},
                     {"seq_len": 2048, "kernel_ms": 3.0, "sdpa_ms": 4.0, "kernel_tops": 160.0, "sdpa_tops": 120.0}]})
        r["path"] = str(report.save_report(r))
        return r

    monkeypatch.setattr(fs, "run_setup", fake_setup)
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert calls == [("gfx1201", "rdna4", "gpu")]
    assert "Build + self-test on AMD Radeon RX 9070 XT (gfx1201, rdna4)" in out
    assert "per_thread/fp8/fp16" in out and "turned off" in out
    assert "from 2048 tokens" in out and "NOT safe" in out
    # Second run: the report for this GPU/torch/triton/pack is reused, nothing is rebuilt.
    assert cli.main([]) == 0
    assert "Already built and self-tested" in capsys.readouterr().out and len(calls) == 1
    assert cli.main(["--strict"]) == 1  # a variant is turned off
    assert cli.main(["--force"]) == 0 and len(calls) == 2


def test_strict_on_cpu_fails_only_when_something_failed(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from sagetriton.installer import cli
    from sagetriton.installer import crosscompile as cc
    from sagetriton.installer import firststart as fs
    good = {"complete": True, "mode": "interpreter", "variants": {}, "disabled_variants": []}
    monkeypatch.setattr(fs, "run_setup", lambda *a, **k: dict(good))
    cross = {t: {"ok": True, "instructions": ["x"], "config": {}} for t in cc.DEFAULT_TARGETS}
    monkeypatch.setattr(cc, "check_targets", lambda *a, **k: cross)
    assert cli.main(["--strict"]) == 0  # no GPU alone is not a failure
    cross["gfx942"] = {"ok": False, "instructions": [], "error": "LLVM ERROR: Cannot select"}
    assert cli.main(["--strict"]) == 1
    assert cli.main([]) == 0  # ComfyUI-Manager semantics
    assert "LLVM ERROR: Cannot select" in capsys.readouterr().out
    monkeypatch.setattr(fs, "run_setup", lambda *a, **k: dict(good, disabled_variants=["per_block/fp8/fp16"]))
    cross["gfx942"]["ok"] = True
    assert cli.main(["--strict"]) == 1
    assert cli.main(["--check-targets", "sm90,rtx4090"]) == 2  # a usage error, whatever --strict says


def test_a_full_cpu_report_is_reused_and_quick_never_replaces_it(monkeypatch, tmp_path, capsys):
    """Without a GPU too, a complete report answers later runs (it took minutes); --quick reuses a full
    report instead of overwriting it with one variant; --force redoes it."""
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    from sagetriton.installer import cli, report
    from sagetriton.installer import firststart as fs
    from sagetriton.kernels.arch import CPU_ARCH
    full = report.new_report(report.report_key(CPU_ARCH))
    full.update(mode="interpreter", complete=True, quick=False,
                variants={f"v{i}": {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9995, "rel_l1": 0.03}}
                          for i in range(27)},
                cross_compile={"sm90": {"ok": True, "instructions": ["wgmma.mma_async.s8"], "config": {}}})
    path = report.save_report(full)
    saved = path.read_text()
    calls = []
    monkeypatch.setattr(fs, "run_setup", lambda *a, **k: calls.append(k.get("quick")) or {"complete": True})
    for argv in (["--quick"], [], ["--skip-cross-compile"]):
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert "Already self-tested" in out and "[ OK ] sm90" in out, argv
    assert calls == [] and path.read_text() == saved
    assert cli.main(["--force", "--skip-cross-compile", "--quick"]) == 0 and calls == [True]


def test_quick_cleans_what_killed_runs_left(monkeypatch, tmp_path, capsys):
    """Issue 49 item 8: a killed install.py leaves its progress and temp files; a later ``--quick`` (which reuses
    the report and tests nothing) removes those of processes that are gone, for any report key, and leaves a
    live one's."""
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    from sagetriton.installer import cli, report
    from sagetriton.kernels.arch import CPU_ARCH
    full = report.new_report(report.report_key(CPU_ARCH))
    full.update(mode="interpreter", complete=True, quick=False, variants={}, cross_compile={})
    report.save_report(full)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = int(gone.stdout)
    stale = [tmp_path / f".worker-{full['key_id']}-{dead}.json", tmp_path / f".worker-{full['key_id']}-{dead}.77.tmp",
             tmp_path / f".worker-0123456789abcdef-{dead}.json"]  # another torch's key
    live = tmp_path / f".worker-{full['key_id']}-{os.getpid()}.json"
    for f in (*stale, live):
        f.write_text("{}")
    assert cli.main(["--quick"]) == 0 and "Already self-tested" in capsys.readouterr().out
    assert not any(f.exists() for f in stale) and live.exists()


NO_TORCH_HINT = "has no torch; run install.py with the Python that starts ComfyUI"


def test_a_python_without_torch_gets_one_sentence_and_exit_1(tmp_path):
    """The classic wrong-Python mistake: no traceback, the interpreter named, the fix, exit 1."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    proc = subprocess.run([str(python), "install.py"], cwd=str(PACK_DIR), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    out = (proc.stdout + proc.stderr).strip()
    assert len(out.splitlines()) == 1 and NO_TORCH_HINT in out and str(python) in out, out


def _install_py(*args):
    return subprocess.run([sys.executable, "install.py", *args], cwd=str(PACK_DIR), capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("value", ["0", "-5", "300", "x"])
def test_head_dim_out_of_range_is_a_usage_error(value):
    proc = _install_py("--check-targets", "sm90", "--head-dim", value)
    assert proc.returncode == 2 and "--head-dim: must be a whole number from 1 to 256" in proc.stderr, proc.stderr


def test_json_without_check_targets_is_a_usage_error():
    proc = _install_py("--json")
    assert proc.returncode == 2 and "--json only applies to --check-targets" in proc.stderr, proc.stderr


def test_unknown_target_is_named_with_the_known_ones():
    proc = _install_py("--check-targets", "sm90,sm91")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "unknown target 'sm91'; known: sm80, sm86" in proc.stderr and "gfx1201" in proc.stderr
    assert "LLVM" not in proc.stderr


def test_variant_table_stays_aligned_with_long_names(pack):
    from sagetriton.installer.selftest import format_variant_table
    ok = {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.99951, "rel_l1": 0.0301}}
    lines = format_variant_table({"per_warp/fp8/fp32": ok, "per_thread/fp8+residual/fp16+fp32": ok}).splitlines()
    columns = {line.index(" ok ") if " ok " in line else line.index(" build ") for line in lines}
    assert len(columns) == 1, "\n".join(lines)
    assert len({line.index("0.99951") for line in lines[1:]}) == 1
