"""The build + self-test supervisor: a worker that crashes on a variant turns that variant off and
the rest still runs; the background first-start never raises and skips machines without a GPU."""
import sys

import pytest

# A stand-in worker with the real worker's file protocol: it marks the step it is on before doing it,
# and step "b" kills the process the way a GPU fault would.
FAKE_WORKER = r"""
import json, os, sys
path, crash_on = sys.argv[1], sys.argv[2]
state = json.load(open(path))
state.setdefault("variants", {})
def write():
    open(path + ".tmp", "w").write(json.dumps(state)); os.replace(path + ".tmp", path)
for name in ("a", "b", "c"):
    if name in state["variants"]:
        continue
    state["current"] = name; write()
    if name == crash_on:
        os.abort()
    if crash_on == "hang" and name == "b":
        import time; time.sleep(60)
    state["variants"][name] = {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9999}}
    state["done"] = len(state["variants"]); write()
state["current"] = None; state["complete"] = True; write()
"""


@pytest.fixture
def fs(pack, monkeypatch):
    from sagetriton.installer import firststart

    # The setup state is process-wide and notifies only on a change: start each test from "idle", whatever
    # an earlier test (in any file) left there.
    monkeypatch.setattr(firststart._state, "phase", "idle")
    monkeypatch.setattr(firststart._state, "message", "")
    return firststart


def _cmd(crash_on):
    return lambda out_path, mode, echo: [sys.executable, "-c", FAKE_WORKER, str(out_path), crash_on]


def test_crash_on_one_variant_turns_it_off_and_resumes(fs, tmp_path):
    seen = []
    state = fs.run_worker_stage("gpu", tmp_path / "w.json", echo=False, cmd_for=_cmd("b"), on_progress=seen.append)
    assert state["complete"] is True
    assert state["variants"]["a"]["build"]["ok"] and state["variants"]["c"]["build"]["ok"]
    b = state["variants"]["b"]["build"]
    assert b["ok"] is False and "crashed the process" in b["error"] and "SIGABRT" in b["error"]
    assert state["crashes"] == [{"step": "b", "how": "the child process was killed by SIGABRT"}]
    assert fs.disabled_from(state["variants"]) == ["b"]


def test_clean_worker(fs, tmp_path):
    state = fs.run_worker_stage("gpu", tmp_path / "w.json", echo=False, cmd_for=_cmd("none"))
    assert state["complete"] and not state["crashes"] and fs.disabled_from(state["variants"]) == []


def test_worker_dying_at_startup_gives_up_without_looping(fs, tmp_path):
    cmd = lambda out_path, mode, echo: [sys.executable, "-c", "raise SystemExit('no GPU driver')"]  # noqa: E731
    state = fs.run_worker_stage("gpu", tmp_path / "w.json", echo=False, cmd_for=cmd)
    assert not state.get("complete") and "exited with code 1" in state["error"]
    assert len(state["crashes"]) == 1


def test_hanging_worker_is_killed(fs, tmp_path):
    state = fs.run_worker_stage("gpu", tmp_path / "w.json", echo=False, cmd_for=_cmd("hang"), step_timeout=1.5)
    assert state["complete"] and state["variants"]["a"]["build"]["ok"] and state["variants"]["c"]["build"]["ok"]
    assert state["variants"]["b"]["build"]["ok"] is False and "hung" in state["variants"]["b"]["build"]["error"]


def test_disabled_from_counts_failed_builds_and_selftests(fs):
    variants = {"x": {"build": {"ok": True}, "selftest": {"ok": True}},
                "y": {"build": {"ok": True}, "selftest": {"ok": False}},
                "z": {"build": {"ok": False}}}
    assert fs.disabled_from(variants) == ["y", "z"]
    oom = {"a": {"build": {"ok": False, "oom": True, "error": "OutOfMemoryError: CUDA out of memory"}},
           "b": {"build": {"ok": True}, "selftest": {"ok": False, "oom": True}}}
    assert fs.disabled_from(oom) == []  # ComfyUI sampling next to the self-test is not the kernel's fault


def test_oom_is_recognised(pack):
    import torch
    from sagetriton.installer.selftest import is_oom

    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("HIP out of memory. Tried to allocate"))
    assert not is_oom(RuntimeError("invalid device function"))


def test_background_job_skips_cpu_and_notifies(fs, monkeypatch):
    import torch

    pushed = []
    monkeypatch.setattr(fs._state, "notify", pushed.append)
    fs._background_job(0, lambda: torch.device("cpu"))
    st = fs.setup_status()
    assert st["phase"] == "skipped" and "no GPU" in st["message"]
    assert pushed and pushed[-1] == st

    def broken(state):
        raise ConnectionResetError("tab closed")

    monkeypatch.setattr(fs._state, "notify", broken)
    fs._state.set("running", "x", done=1, total=2)  # a failing notification is swallowed
    assert fs.setup_status()["progress"] == {"done": 1, "total": 2}


def test_background_job_uses_existing_report_or_runs_setup(fs, monkeypatch):
    from sagetriton.installer import report
    from sagetriton.kernels import arch as arch_mod

    rdna4 = arch_mod.ArchInfo("amd", "gfx1201", "rdna4", "RX 9070 XT", 32, "e4m3fn")
    monkeypatch.setattr(arch_mod, "detect_arch", lambda device=None: rdna4)
    monkeypatch.setattr(report, "current_report", lambda arch=None: {"complete": True})
    fs._background_job(0, None)
    assert fs.setup_status()["phase"] == "done" and "report found" in fs.setup_status()["message"]

    monkeypatch.setattr(report, "current_report", lambda arch=None: None)
    calls = []

    def fake_setup(arch, mode, echo, on_progress):
        calls.append((arch.arch, mode, echo))
        on_progress({"done": 3, "total": 19, "current": "per_warp/fp8/fp32"})
        return {"complete": True, "variants": {"a": {}, "b": {}}, "disabled_variants": ["b"],
                "crossover": {"seq_len": 1024}}

    monkeypatch.setattr(fs, "run_setup", fake_setup)
    fs._background_job(0, None)
    assert calls == [("gfx1201", "gpu", False)]
    st = fs.setup_status()
    assert st["phase"] == "done" and "1 variants ok, 1 off" in st["message"] and "1024" in st["message"]

    def boom(*a, **k):
        raise RuntimeError("driver went away")

    monkeypatch.setattr(fs, "run_setup", boom)
    fs._background_job(0, None)  # must not raise
    assert fs.setup_status()["phase"] == "failed" and "driver went away" in fs.setup_status()["message"]


def test_autosetup_can_be_disabled(fs, monkeypatch):
    monkeypatch.setenv(fs.ENV_NO_AUTOSETUP, "1")
    assert fs.start_background_setup(delay=0) is False
    assert fs.setup_status()["phase"] == "skipped"


def test_run_setup_on_rdna4_probes_sdpa_first_and_writes_the_report(fs, monkeypatch, tmp_path):
    from sagetriton.installer import report, sdpa_probe
    from sagetriton.kernels.arch import ArchInfo

    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    rdna4 = ArchInfo("amd", "gfx1201", "rdna4", "AMD Radeon RX 9070 XT", 32, "e4m3fn")
    monkeypatch.setattr(sdpa_probe, "probe_sdpa_default",
                        lambda device: {"safe": False, "reason": "child killed by SIGABRT", "cases": []})
    seen = {}

    def fake_stage(mode, out_path, echo, sdpa_default_safe, on_progress, quick=False):
        seen.update(mode=mode, sdpa_default_safe=sdpa_default_safe)
        return {"complete": True, "crossover": {"seq_len": 1024, "sdpa": "math"},
                "variants": {"per_warp/fp8/fp32": {"build": {"ok": True}, "selftest": {"ok": True}},
                             "per_thread/fp8/fp16": {"build": {"ok": False, "error": "crashed"}}}}

    monkeypatch.setattr(fs, "run_worker_stage", fake_stage)
    r = fs.run_setup(rdna4, "gpu", echo=False)
    assert seen == {"mode": "gpu", "sdpa_default_safe": False}  # the speed test compares against MATH
    assert r["sdpa_default_safe"] is False and "SIGABRT" in r["sdpa_probe"]["reason"]
    assert r["disabled_variants"] == ["per_thread/fp8/fp16"] and r["complete"]
    saved = report.load_report(report.report_key(rdna4))
    assert saved["crossover"]["seq_len"] == 1024 and saved["device"]["arch"] == "gfx1201"


def test_run_setup_without_results_is_not_cached(fs, monkeypatch, tmp_path):
    from sagetriton.installer import report
    from sagetriton.kernels.arch import ArchInfo

    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    ada = ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn")
    monkeypatch.setattr(fs, "run_worker_stage", lambda *a, **k: {"error": "worker died at start-up", "variants": {}})
    r = fs.run_setup(ada, "gpu", echo=False)
    assert r["error"] == "worker died at start-up" and "path" not in r
    assert report.load_report(report.report_key(ada)) is None  # the next start tries again


# Issue 40 item 7: install.py where no report can be written. The tests run as root on CI, where a read-only
# mode does not stop writes: a folder below a regular file cannot be created by anyone.
def _install_on_simulated_gpu(monkeypatch):
    from sagetriton.installer import cli, doctor
    from sagetriton.installer import firststart as fs

    gpu = doctor.GpuInfo("NVIDIA GeForce RTX 4090", 8, 9, "", 24 << 30, 23 << 30)
    monkeypatch.setattr(doctor, "probe_environment", lambda: doctor.Environment(
        torch_version="2.9.0", torch_cuda="12.8", triton_version="3.5.0", gpus=[gpu]))
    worker = "import sys; sys.exit(3)"  # never reached: nothing to save its result in
    monkeypatch.setattr(fs, "_worker_cmd", lambda out, mode, echo: [sys.executable, "-c", worker, str(out)])
    return cli


@pytest.mark.parametrize("where", ["report_dir_env", "home_and_pack"])
def test_install_py_says_which_folder_is_not_writable(pack, tmp_path, monkeypatch, capsys, where):
    from sagetriton.installer import report as rep

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rep.invalidate_cache()
    if where == "report_dir_env":
        monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(blocker / "reports"))
        named = [str(blocker / "reports")]
    else:  # the pack folder read-only and no home to cache in
        monkeypatch.delenv("SAGETRITON_REPORT_DIR")
        monkeypatch.setattr(rep, "PACK_DIR", blocker / "pack")
        monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
        named = [str(blocker / "pack" / ".sagetriton"), str(blocker / "cache" / "sagetriton")]
    cli = _install_on_simulated_gpu(monkeypatch)
    try:
        assert cli.main(["--force"]) == 0
    finally:
        rep.invalidate_cache()
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text and "unexpected error" not in text, text[-3000:]
    assert "no self-test report could be written" in text and all(f"{d} (" in text for d in named), text[-3000:]


def test_a_worker_that_cannot_start_leaves_no_files(fs, tmp_path, monkeypatch):
    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import ArchInfo

    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    monkeypatch.setattr(fs, "_worker_cmd", lambda out, mode, echo: [str(tmp_path / "no-such-python"), str(out)])
    rep.invalidate_cache()
    r = fs.run_setup(ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn"), "gpu", echo=False)
    assert not r.get("complete") and "could not be started" in r["error"], r
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "progress, lock or report files left behind"
