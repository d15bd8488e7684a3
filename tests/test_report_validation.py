"""Issue 31: a tampered or broken self-test report is "no report" to every reader. Sampling goes on with the
table defaults, /sage/status answers (strict JSON) and says why, the first start and install.py rewrite it."""
import json
import os
import sys

import pytest


def _strict(text):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} on the wire"))


def _body(key, **fields):
    from sagetriton.installer.report import SCHEMA, key_id

    r = {"schema": SCHEMA, "key": key, "key_id": key_id(key), "variants": {}, "disabled_variants": [],
         "crossover": None, "sdpa_default_safe": None, "complete": True}
    r.update(fields)
    return r


# name -> function(key) giving the file text
BROKEN = {
    "seq_len_text": lambda k: json.dumps(_body(k, crossover={"seq_len": "abc"})),
    "seq_len_nan": lambda k: json.dumps(_body(k, crossover={"seq_len": float("nan")})),
    "seq_len_inf": lambda k: json.dumps(_body(k, crossover={"seq_len": float("inf")})),
    "seq_len_list": lambda k: json.dumps(_body(k, crossover={"seq_len": [1]})),
    "seq_len_negative": lambda k: json.dumps(_body(k, crossover={"seq_len": -5})),
    "crossover_list": lambda k: json.dumps(_body(k, crossover=[4096])),
    "by_head_dim_key": lambda k: json.dumps(_body(k, crossover={"seq_len": 1, "by_head_dim": {"x": {"seq_len": 2}}})),
    "timings_seq_len": lambda k: json.dumps(_body(k, crossover={"kernel_never_faster": True,
                                                               "timings": [{"seq_len": "1024"}]})),
    "disabled_list_of_lists": lambda k: json.dumps(_body(k, disabled_variants=[["per_warp"]])),
    "variants_list": lambda k: json.dumps(_body(k, variants=[])),
    "safe_text": lambda k: json.dumps(_body(k, sdpa_default_safe="no")),
    "pv_choice_unknown": lambda k: json.dumps(_body(k, pv_choice={"by_head_dim": {"128": {"choice": "int4"}}})),
    "pv_choice_ms_text": lambda k: json.dumps(_body(k, pv_choice={"by_head_dim": {"128": {"choice": "fp8",
                                                                                       "ms": {"fp8": "1"}}}})),
    "pv_choice_list": lambda k: json.dumps(_body(k, pv_choice=["int8"])),
    "rope_kernel_text": lambda k: json.dumps(_body(k, rope_kernel="ok")),
    "array": lambda k: "[]",
    "null": lambda k: "null",
    "string": lambda k: '"report"',
    "truncated": lambda k: json.dumps(_body(k))[:40],
    # Issue 40: keys int() refuses, nesting that overflows a reader's recursion, lengths no call can have.
    "by_head_dim_superscript": lambda k: json.dumps(_body(k, crossover={"seq_len": 1, "by_head_dim": {
        "\u00b2": {"seq_len": 2}}})),
    "by_head_dim_4400_digits": lambda k: json.dumps(_body(k, crossover={"seq_len": 1, "by_head_dim": {
        "9" * 4400: {"seq_len": 2}}})),
    "pv_choice_superscript": lambda k: json.dumps(_body(k, pv_choice={"by_head_dim": {"\u00b2": {"choice": "fp8"}}})),
    "nested_5000": lambda k: json.dumps(_body(k))[:-1] + ', "extra": ' + "[" * 5000 + "]" * 5000 + "}",
    "build_nested_900": lambda k: json.dumps(_body(k, variants={"per_warp/fp16/fp32": {"build": {"log": "@"}}})
                                             ).replace('"@"', "[" * 900 + "]" * 900),
    "seq_len_1e30": lambda k: json.dumps(_body(k, crossover={"seq_len": 10**30})),
    "seq_len_4400_digits": lambda k: json.dumps(_body(k, crossover={"seq_len": 1})).replace(
        '"seq_len": 1', '"seq_len": ' + "9" * 4400),
    "head_dim_1e30": lambda k: json.dumps(_body(k, crossover={"seq_len": 1024, "head_dim": 10**30})),
}


def _plant(rep, arch, text):
    path = rep.report_path(rep.report_key(arch))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    rep.invalidate_cache()
    return path


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_report_is_no_report_for_every_reader(rep, case):
    from sagetriton.kernels.arch import CPU_ARCH, KernelConfig
    from sagetriton.nodes.config.install_report import InstallReport
    from sagetriton.nodes.reporting.status_route import _dumps, status_payload

    _plant(rep, CPU_ARCH, BROKEN[case](rep.report_key(CPU_ARCH)))
    assert rep.load_report(rep.report_key(CPU_ARCH)) is None
    assert rep.current_report(CPU_ARCH) is None and rep.current_report_problem(CPU_ARCH)
    ir = InstallReport()  # the dispatcher's view: table answers
    assert ir.crossover(CPU_ARCH, KernelConfig()) is None and ir.variant_failed(CPU_ARCH, KernelConfig()) is False
    assert ir.pv_choice(CPU_ARCH, 128) is None and ir.rope_kernel_failed(CPU_ARCH) is False
    p = _strict(_dumps(status_payload("cpu")))  # what the route sends
    assert p["report"]["found"] is False and p["report"]["invalid"], p["report"]
    assert p["crossover"] is None and p["disabled_variants"] == []


def test_valid_report_still_read_and_saved_as_strict_json(rep):
    from sagetriton.kernels.arch import CPU_ARCH

    r = rep.new_report(rep.report_key(CPU_ARCH))
    r.update(crossover={"seq_len": 2048, "by_head_dim": {"64": {"seq_len": 4096}}},
             variants={"per_warp/fp16/fp32": {"build": {"ok": True},
                                              "selftest": {"ok": False, "cosine": float("nan")}}})
    path = rep.save_report(r)  # a NaN measurement is written as null, not as JSON the reader must refuse
    assert _strict(path.read_text())["variants"]["per_warp/fp16/fp32"]["selftest"]["cosine"] is None
    assert rep.current_report(CPU_ARCH)["crossover"]["seq_len"] == 2048 and rep.current_report_problem(CPU_ARCH) is None
    assert rep.measured_crossover(CPU_ARCH, 64) == 4096


def test_sampling_goes_on_with_a_broken_crossover(rep, comfyui_path):
    """A tiny real Wan 2.1 through the Patch node (crossover from the report: min_seq_len -1)."""
    import torch
    from sagetriton.kernels.arch import CPU_ARCH
    from sagetriton.nodes.reporting import stats
    from sagetriton.nodes.ui.patch_node import SageTritonPatchModelAttention
    from tiny_models import BUILDERS, sample

    _plant(rep, CPU_ARCH, BROKEN["seq_len_text"](rep.report_key(CPU_ARCH)))
    t = BUILDERS["wan21"](seed=0)
    (patched,) = SageTritonPatchModelAttention().patch(t.patcher)
    out = sample(t, patched, steps=1)
    assert torch.isfinite(out).all() and stats.last_run()["kernel"] > 0  # the table crossover (0 on CPU)


@pytest.mark.server
def test_status_route_answers_about_a_broken_report(comfyui_path, tmp_path, pack):
    from comfy_server import comfy_server
    from sagetriton.installer import report as rep
    from sagetriton.kernels.arch import CPU_ARCH

    env = {"SAGETRITON_REPORT_DIR": str(tmp_path), "SAGETRITON_SETUP_DELAY": "0"}
    key = rep.report_key(CPU_ARCH)
    (tmp_path / rep.report_path(key).name).write_text(BROKEN["seq_len_nan"](key))
    with comfy_server(comfyui_path, env=env) as srv:
        status, body = srv.get("/sage/status")
        assert status == 200, body[:500]
        p = _strict(body)
        assert p["report"]["key"] == key and "NaN" in p["report"]["invalid"]
        (tmp_path / rep.report_path(key).name).write_text("[]")  # replaced: the next request reads it again
        status, body = srv.get("/api/sage/status")
        assert status == 200 and "list, not an object" in _strict(body)["report"]["invalid"], body[:500]
        if hasattr(os, "mkfifo"):  # issue 40: a FIFO must not block the server's event loop
            (tmp_path / rep.report_path(key).name).unlink()
            os.mkfifo(tmp_path / rep.report_path(key).name)
            try:
                status, body = srv.get("/sage/status", timeout=20)
                assert status == 200 and "not a regular file" in _strict(body)["report"]["invalid"], body[:500]
                assert srv.get("/system_stats", timeout=20)[0] == 200
            finally:
                try:  # a reader blocked in open() (the bug) gets a writer and ends
                    os.close(os.open(tmp_path / rep.report_path(key).name, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass


GOOD_WORKER = r"""
import json, os, sys
path = sys.argv[1]
state = json.load(open(path))
state["variants"] = {"per_warp/fp8/fp32": {"build": {"ok": True}, "selftest": {"ok": True, "cosine": 0.9999}}}
state.update(done=1, total=1, current=None, complete=True, crossover={"seq_len": 3072})
open(path + ".tmp", "w").write(json.dumps(state)); os.replace(path + ".tmp", path)
"""

ADA = ("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn")


@pytest.fixture
def fake_worker(pack, monkeypatch):
    from sagetriton.installer import firststart as fs

    monkeypatch.setattr(fs, "_worker_cmd", lambda out, mode, echo: [sys.executable, "-c", GOOD_WORKER, str(out)])
    return fs


@pytest.mark.parametrize("case", ["array", "seq_len_text", "by_head_dim_key"])
def test_next_first_start_rewrites_a_broken_report(rep, fake_worker, monkeypatch, case):
    from sagetriton.kernels import arch as arch_mod

    ada = arch_mod.ArchInfo(*ADA)
    monkeypatch.setattr(arch_mod, "detect_arch", lambda device=None: ada)  # a simulated GPU, the rest is real
    path = _plant(rep, ada, BROKEN[case](rep.report_key(ada)))
    fake_worker._background_job(0, None)
    st = fake_worker.setup_status()
    assert st["phase"] == "done", st
    assert rep.load_report(rep.report_key(ada))["crossover"]["seq_len"] == 3072
    assert _strict(path.read_text())["complete"] is True


@pytest.mark.parametrize("case, argv", [("null", []), ("by_head_dim_superscript", ["--force"]),
                                        ("by_head_dim_4400_digits", []), ("nested_5000", ["--force"]),
                                        ("build_nested_900", ["--force"])])
def test_install_py_rewrites_a_broken_report(rep, fake_worker, monkeypatch, capsys, case, argv):
    from sagetriton.installer import cli, doctor
    from sagetriton.kernels.arch import ArchInfo

    gpu = doctor.GpuInfo("NVIDIA GeForce RTX 4090", 8, 9, "", 24 << 30, 23 << 30)
    monkeypatch.setattr(doctor, "probe_environment", lambda: doctor.Environment(
        torch_version="2.9.0", torch_cuda="12.8", triton_version="3.5.0", gpus=[gpu]))
    env = doctor.probe_environment()
    arch = env.arch(0)
    assert isinstance(arch, ArchInfo) and arch.arch == "sm89"
    path = _plant(rep, arch, BROKEN[case](rep.report_key(arch)))
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "Build + self-test" in out.out
    assert rep.load_report(rep.report_key(arch))["crossover"]["seq_len"] == 3072 and path.exists()
    assert cli.main([]) == 0 and "Already built" in capsys.readouterr().out  # now valid: reused


def test_nodes_panel_says_the_report_was_ignored(rep, tmp_path):
    """The server's panel lines for the status of a broken report, as web/sage_format.mjs (the module the page
    loads) picks them for a Patch node that has not run."""
    import shutil
    import subprocess

    from sagetriton.kernels.arch import CPU_ARCH
    from sagetriton.nodes.reporting.status_route import _dumps, status_payload

    from sagetriton_import import PACK_DIR

    if shutil.which("node") is None:
        pytest.skip("needs node")
    _plant(rep, CPU_ARCH, "[]")
    (tmp_path / "status.json").write_text(_dumps(status_payload("cpu")))
    module = (PACK_DIR / "web" / "sage_format.mjs").as_uri()
    js = (f"import {{infoLines, PATCH_NODE}} from '{module}'; import {{readFileSync}} from 'fs';"
          "console.log(JSON.stringify(infoLines(PATCH_NODE, JSON.parse(readFileSync(process.argv[1], 'utf8')))));")
    proc = subprocess.run(["node", "--input-type=module", "-e", js, str(tmp_path / "status.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = json.loads(proc.stdout)
    panel = json.loads((tmp_path / "status.json").read_text())["panel"]
    assert lines == panel["lines"] + panel["not_run"]  # drawn as sent
    assert any(ln.startswith("⚠ self-test report ignored (the report is list, not an object)") for ln in lines), lines
