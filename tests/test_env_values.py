"""Issue 31 item 8: environment values are read leniently where the meaning is clear, rejected with one log
line otherwise, and the first-start delay is clamped (the background thread never fails on them)."""
import logging

import pytest
from comfy_server import comfy_server


@pytest.fixture
def fs(pack, monkeypatch):
    from sagetriton.installer import firststart

    monkeypatch.setattr(firststart, "_state", firststart._State())  # a fresh "first start" of this process
    monkeypatch.delenv(firststart.ENV_NO_AUTOSETUP, raising=False)
    monkeypatch.delenv(firststart.ENV_SETUP_DELAY, raising=False)
    return firststart


def _ours(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "SageTriton" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " On "])
def test_no_autosetup_accepts_the_usual_yes_words(fs, monkeypatch, value, caplog):
    monkeypatch.setenv(fs.ENV_NO_AUTOSETUP, value)
    assert fs.start_background_setup() is False
    assert fs.setup_status()["phase"] == "skipped" and "disabled by" in fs.setup_status()["message"]
    assert not _ours(caplog)


@pytest.mark.parametrize("value, logged", [("0", False), ("off", False), ("no", False), ("maybe", True)])
def test_no_autosetup_other_values_keep_autosetup_on(fs, monkeypatch, value, logged, caplog):
    monkeypatch.setenv(fs.ENV_NO_AUTOSETUP, value)
    assert fs.start_background_setup(delay=0) is True
    fs._state.thread.join(30)
    assert fs.setup_status()["phase"] == "skipped" and "no GPU" in fs.setup_status()["message"]
    assert [m for m in _ours(caplog) if fs.ENV_NO_AUTOSETUP in m] == ([f"[SageTriton] ignoring "
                                                                      f"{fs.ENV_NO_AUTOSETUP}='maybe' (expected "
                                                                      "1/true/yes/on or 0/false/no/off)"]
                                                                     if logged else [])


@pytest.mark.parametrize("value, used", [("-1", 0.0), ("nan", 10.0), ("inf", 600.0), ("-inf", 0.0), ("abc", 10.0),
                                         ("1e9", 600.0), ("0.5", 0.5)])
def test_setup_delay_is_clamped_and_the_thread_never_fails(fs, monkeypatch, value, used, caplog):
    monkeypatch.setenv(fs.ENV_SETUP_DELAY, value)
    assert fs.start_background_setup() is True
    assert fs.setup_status()["message"] == f"starting in {used:g} s" or fs.setup_status()["phase"] == "skipped"
    logged = [m for m in _ours(caplog) if fs.ENV_SETUP_DELAY in m]
    assert len(logged) == (value != "0.5"), logged
    if used <= 1:
        fs._state.thread.join(30)
        assert fs.setup_status()["phase"] == "skipped", fs.setup_status()  # not "failed": no GPU here
    # (1e9 and inf: a daemon thread sleeps at most MAX_SETUP_DELAY; the browser's wait has an end)


@pytest.mark.server
def test_real_comfyui_with_odd_values(comfyui_path, tmp_path):
    import time

    env = {"SAGETRITON_REPORT_DIR": str(tmp_path), "SAGETRITON_SETUP_DELAY": "-1"}
    with comfy_server(comfyui_path, env=env) as srv:
        for _ in range(100):
            st = srv.get_json("/sage/status")["setup"]
            if st["phase"] != "waiting":
                break
            time.sleep(0.1)
        log = srv.log()
    assert st["phase"] == "skipped" and "no GPU" in st["message"], (st, log)
    assert "SAGETRITON_SETUP_DELAY='-1' is outside" in log and "background self-test failed" not in log
