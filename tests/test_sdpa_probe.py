"""The RDNA4 SDPA probe runs in a child process: a child that crashes is reported, never propagated."""
import pytest


@pytest.fixture
def probe(pack):
    from sagetriton.installer import sdpa_probe

    return sdpa_probe


def test_real_probe_code_runs_and_matches_math(probe):
    r = probe.probe_sdpa_default("cpu")  # the same child code that runs on RDNA4, on this CPU
    assert r["safe"] is True, r
    assert len(r["cases"]) == 8 and all(c["finite"] and c["max_rel_err"] < 0.05 for c in r["cases"])


@pytest.mark.parametrize("code, words", [
    ("import os; os.abort()", "SIGABRT"),  # what a HIP kernel assertion does to the process
    ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
    ("raise RuntimeError('HIP error: invalid device function')", "invalid device function"),
    ("import sys; sys.exit(3)", "exited with code 3"),
    ("print('no result line')", "without a result"),
])
def test_crashing_child_is_reported(probe, code, words):
    r = probe.probe_sdpa_default("cpu", code=code)  # must return, not raise or die
    assert r["safe"] is False and words in r["reason"], r


def test_hanging_child_is_stopped(probe):
    r = probe.probe_sdpa_default("cpu", timeout=2, code="import time; time.sleep(60)")
    assert r["safe"] is False and "hung" in r["reason"]


def test_wrong_results_are_unsafe(probe):
    from sagetriton.installer.childproc import RESULT_MARK

    code = (f"import json; print({RESULT_MARK!r} + json.dumps({{'cases': [{{'dtype': 'float16', 'shape': [1], "
            f"'finite': True, 'max_rel_err': 0.8}}]}}))")
    r = probe.probe_sdpa_default("cpu", code=code)
    assert r["safe"] is False and "wrong results" in r["reason"]


def test_only_rdna4_is_probed(probe):
    from sagetriton.kernels.arch import CPU_ARCH, ArchInfo

    assert probe.needs_probe(ArchInfo("amd", "gfx1201", "rdna4"))
    assert probe.needs_probe(ArchInfo("amd", "gfx1200", "rdna4"))
    assert not probe.needs_probe(ArchInfo("amd", "gfx1100", "rdna3"))
    assert not probe.needs_probe(ArchInfo("nvidia", "sm90", "hopper"))
    assert not probe.needs_probe(CPU_ARCH)


def test_windows_crash_codes_are_named(pack):
    from sagetriton.installer.childproc import ChildResult

    assert "access violation" in ChildResult(0xC0000005, "", "").describe()
    assert "access violation" in ChildResult(-1073741819, "", "").describe()  # the same code, signed
    assert ChildResult(3, "", "boom\n").describe() == "the child process exited with code 3: boom"
