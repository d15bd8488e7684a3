"""Issue 31 items 3-5: one self-test per report key across processes (a pid lock, stale locks taken over),
the worker ends with its supervisor, and an incomplete report is retried on later starts, with a cap."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sagetriton_import import PACK_DIR

# A stand-in worker with the real file protocol; every variant it starts is appended to COUNTER.
# "crash": finishes variant "a", then exits before completing (as the OOM killer would stop it).
FAKE_WORKER = r"""
import json, os, sys, time
path, how, counter = sys.argv[1], sys.argv[2], sys.argv[3]
state = json.load(open(path)); state.setdefault("variants", {})
def write():
    tmp = path + f".{os.getpid()}.tmp"; open(tmp, "w").write(json.dumps(state)); os.replace(tmp, path)
for name in ("a", "b", "c"):
    if name in state["variants"]:
        continue
    state["current"] = name; write()
    open(counter, "a").write(f"{os.getpid()} {name}\n")
    time.sleep(0.7)
    state["variants"][name] = {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9999}}
    state["done"] = len(state["variants"]); state["current"] = None; write()
    if how == "crash":
        os._exit(1)
state.update(current=None, complete=True, crossover={"seq_len": 1024}); write()
"""

# A supervisor process (a ComfyUI first start or install.py) for a simulated Ada, the rest real.
SUPERVISOR = r"""
import json, sys
from sagetriton_import import import_pack
import_pack(run_init=False)
from sagetriton.installer import firststart as fs
from sagetriton.kernels.arch import ArchInfo
worker, how, counter = sys.argv[1], sys.argv[2], sys.argv[3]
fs._worker_cmd = lambda out, mode, echo: [sys.executable, "-c", worker, str(out), how, counter]
r = fs.run_setup(ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn"), "gpu", echo=False)
print(json.dumps({"complete": r.get("complete"), "error": r.get("error"), "attempts": r.get("attempts")}))
"""


def _env(report_dir):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["SAGETRITON_REPORT_DIR"] = str(report_dir)
    return env


def _supervisor(report_dir, counter, how="ok"):
    return subprocess.Popen([sys.executable, "-c", SUPERVISOR, FAKE_WORKER, how, str(counter)], cwd=str(PACK_DIR),
                            env=_env(report_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_first_starts_at_once_run_one_self_test(tmp_path):
    counter = tmp_path / "started.txt"
    procs = [_supervisor(tmp_path, counter) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    started = counter.read_text().split("\n")[:-1]
    assert sorted(line.split()[1] for line in started) == ["a", "b", "c"], started  # each variant once
    assert results == [{"complete": True, "error": None, "attempts": 1}] * 2, results
    assert len(list(tmp_path.glob("report-sm89-*.json"))) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no lock, progress, tmp


def test_a_dead_holders_lock_is_taken_over(pack, tmp_path):
    from sagetriton.installer import firststart as fs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / ".lock-x"
    lock.write_text(f"{dead.pid}\n")  # left by a killed process
    assert fs.lock_holder(lock) is None and fs.try_lock(lock)
    assert lock.read_text().split()[0] == str(os.getpid())
    fs.release_lock(lock)
    assert not lock.exists()
    lock.write_text("")  # just created by another process, its pid not written yet: held
    assert fs.lock_holder(lock) == 0 and not fs.try_lock(lock)
    os.utime(lock, (time.time() - 60, time.time() - 60))  # empty for a minute: left by a crash, stale
    assert fs.lock_holder(lock) is None and fs.try_lock(lock)
    fs.release_lock(lock)


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_ends_with_its_supervisor(tmp_path):
    """The real worker (install.py --worker, interpreter mode) stops when its supervisor is SIGKILLed."""
    code = ("import sys; from sagetriton_import import import_pack; import_pack(run_init=False);"
            "from sagetriton.installer import firststart as fs;"
            "fs.run_worker_stage('interpreter', __import__('pathlib').Path(sys.argv[1]), echo=False)")
    progress = tmp_path / "w.json"
    sup = subprocess.Popen([sys.executable, "-c", code, str(progress)], cwd=str(PACK_DIR), env=_env(tmp_path))
    try:
        deadline = time.monotonic() + 120
        worker = None
        while worker is None and time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                worker = json.loads(progress.read_text()).get("pid")
            except (OSError, ValueError):
                pass
        assert worker and _alive(worker), "the worker never started"
        assert os.getpgid(worker) != os.getpgid(sup.pid)  # its own process group
        sup.send_signal(signal.SIGKILL)
        sup.wait()
        for _ in range(50):
            if not _alive(worker):
                break
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived its supervisor"
    finally:
        if sup.poll() is None:
            sup.kill()
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_incomplete_report_is_retried_on_later_starts_with_a_cap(pack, tmp_path, monkeypatch):
    from sagetriton.installer import firststart as fs
    from sagetriton.installer import report
    from sagetriton.kernels import arch as arch_mod

    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path))
    ada = arch_mod.ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn")
    monkeypatch.setattr(arch_mod, "detect_arch", lambda device=None: ada)  # a simulated GPU
    counter = tmp_path / "started.txt"
    how = ["crash"]
    monkeypatch.setattr(fs, "_worker_cmd", lambda out, mode, echo: [sys.executable, "-c", FAKE_WORKER, str(out),
                                                                    how[0], str(counter)])
    runs = []
    for _start in range(fs.MAX_SETUP_ATTEMPTS + 1):
        report.invalidate_cache()
        fs._background_job(0, None)
        runs.append(len(counter.read_text().splitlines()) if counter.exists() else 0)
    saved = report.load_report(report.report_key(ada))
    assert saved["complete"] is False and saved["attempts"] == fs.MAX_SETUP_ATTEMPTS
    assert runs == [1, 2, 3, 3], runs  # retried on each start up to the cap, then left alone
    st = fs.setup_status()
    assert st["phase"] == "failed" and f"incomplete after {fs.MAX_SETUP_ATTEMPTS} attempts" in st["message"], st
    assert "exited with code 1" in st["message"] and "install.py --force" in st["message"]
    from sagetriton.nodes.reporting.status_route import status_payload

    shown = status_payload("cpu")["report"]  # the simulated GPU's report, as the browser gets it
    assert shown["found"] and shown["complete"] is False and shown["attempts"] == fs.MAX_SETUP_ATTEMPTS


def test_worker_exiting_zero_unfinished_is_not_reported_as_ok(pack, tmp_path):
    from sagetriton.installer import firststart as fs

    cmd = lambda out, mode, echo: [sys.executable, "-c", "pass"]  # noqa: E731 - exits 0, nothing done
    state = fs.run_worker_stage("gpu", tmp_path / "w.json", echo=False, cmd_for=cmd)
    assert not state.get("complete") and state["error"] == "the worker exited without finishing the self-test"


# Chaos: the fake worker with the real worker's supervisor watch; a start checks for a finished report first,
# as ComfyUI's first start and install.py do.
CHAOS_WORKER = FAKE_WORKER.replace("import json, os, sys, time\n", (
    "import json, os, sys, time\nfrom sagetriton_import import import_pack\nimport_pack(run_init=False)\n"
    "from sagetriton.installer import firststart as fs\nfs._end_with_supervisor(poll=0.1)\n"))
CHAOS_START = SUPERVISOR.replace("r = fs.run_setup(", "from sagetriton.installer import report as rep\n"
                                 "arch = ArchInfo('nvidia', 'sm89', 'ada', 'RTX 4090', 32, 'e4m3fn')\n"
                                 "rep.report_key(arch)\n"
                                 # 1 GiB past the imports: a start reading /dev/zero to its end fails, not the machine
                                 "import os, resource\n"
                                 "vm = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
                                 "resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))\n"
                                 "r = rep.load_report(rep.report_key(arch))\n"
                                 "r = r if r and r.get('complete') else fs.run_setup(")


def _plant_hostile(path: Path, kind: str, key: dict) -> None:
    """What a tampering user or a broken disk leaves at the report path (issue 40 items 2-3)."""
    from sagetriton.installer.report import SCHEMA

    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "superscript_key":
        path.write_text(json.dumps({"schema": SCHEMA, "key": key, "crossover": {"by_head_dim": {"\u00b2": {}}}}))
    elif kind == "nested":
        text = json.dumps({"schema": SCHEMA, "key": key, "variants": {"a": {"build": "@"}}})
        path.write_text(text.replace('"@"', "[" * 5000 + "]" * 5000))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_chaos_starts_killed_at_random_end_with_one_complete_report(pack, tmp_path, seed):
    import random

    rng = random.Random(seed)
    counter = tmp_path / "started.txt"
    report_dir = tmp_path / "reports"
    finished = []
    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import ArchInfo

    report_dir.mkdir()
    key = rep.report_key(ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn"))
    name = rep.report_path(key).name
    hostile = rng.sample(["fifo", "dev_zero", "superscript_key", "nested"], 4)
    for _round in range(4):
        print(f"round {_round}: {hostile[_round]} at the report path")
        # before the starts: each must take it for no report and rewrite it, never hang or crash
        _plant_hostile(report_dir / name, hostile[_round], key)
        procs = [subprocess.Popen([sys.executable, "-c", CHAOS_START, CHAOS_WORKER, "ok", str(counter)],
                                  cwd=str(PACK_DIR), env=_env(report_dir), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
        victims = rng.sample(procs, rng.randint(0, 2)) if _round < 3 else []  # the last round runs to the end
        time.sleep(rng.uniform(0.5, 4.0))
        for p in victims:
            p.kill()
        for p in procs:
            out, err = p.communicate(timeout=180)
            if p not in victims:
                assert p.returncode == 0, err[-3000:]
                finished.append(json.loads(out.strip().splitlines()[-1]))
    assert finished and all(r["complete"] and not r["error"] for r in finished), finished
    reports = list(report_dir.glob("report-sm89-*.json"))
    assert len(reports) == 1 and json.loads(reports[0].read_text())["complete"] is True
    workers = {int(line.split()[0]) for line in counter.read_text().splitlines()}
    time.sleep(1.0)
    assert not [w for w in workers if _alive(w)], "orphaned workers"
