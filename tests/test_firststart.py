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
    if crash_on == "hang":
        import time; time.sleep(60)
    state["variants"][name] = {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9999}}
    state["done"] = len(state["variants"]); write()
state["current"] = None; state["complete"] = True; write()
"""


@pytest.fixture
def fs(pack):
    from sagetriton.kernels import firststart

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
    state = fs.run_worker_stage("gpu", tmp_path / "w.json", echo=False, cmd_for=_cmd("hang"), timeout=1.5)
    assert state["variants"]["a"]["build"]["ok"] is False and "hung" in state["variants"]["a"]["build"]["error"]


def test_disabled_from_counts_failed_builds_and_selftests(fs):
    variants = {"x": {"build": {"ok": True}, "selftest": {"ok": True}},
                "y": {"build": {"ok": True}, "selftest": {"ok": False}},
                "z": {"build": {"ok": False}}}
    assert fs.disabled_from(variants) == ["y", "z"]


def test_background_job_skips_cpu(fs):
    import torch

    fs._background_job(0, lambda: torch.device("cpu"))
    st = fs.setup_status()
    assert st["phase"] == "skipped" and "no GPU" in st["message"]


def test_background_job_uses_existing_report_or_runs_setup(fs, monkeypatch):
    from sagetriton.kernels import arch as arch_mod
    from sagetriton.kernels import report

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
