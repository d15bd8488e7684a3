"""The install report: keyed by pack, kernel sources, torch, triton and GPU; cached; invalidated."""
import json

import pytest


@pytest.fixture
def rdna4(pack):
    from sagetriton.kernels.arch import ArchInfo

    return ArchInfo("amd", "gfx1201", "rdna4", "AMD Radeon RX 9070 XT", 32, "e4m3fn")


def _report(rep, arch, **fields):
    r = rep.new_report(rep.report_key(arch, "2.9.0+rocm6.4", "3.5.0"))
    r.update(fields)
    return r


def test_roundtrip_and_runtime_api(rep, rdna4, tmp_path, monkeypatch):
    r = _report(rep, rdna4, crossover={"seq_len": 1024}, sdpa_default_safe=False,
                disabled_variants=["per_thread/fp8/fp16"])
    path = rep.save_report(r)
    assert path.parent == tmp_path and path.name.startswith("report-gfx1201-")
    assert rep.load_report(r["key"]) == json.loads(path.read_text())
    # The runtime asks with the versions it runs; make them the ones the report was made with.
    monkeypatch.setattr(rep, "report_key", lambda arch, *a: r["key"])
    assert rep.measured_crossover(rdna4) == 1024
    assert rep.sdpa_default_safe(rdna4) is False
    assert rep.disabled_variants(rdna4) == frozenset({"per_thread/fp8/fp16"})
    from sagetriton.kernels.arch import KernelConfig

    assert rep.is_variant_disabled(KernelConfig("per_thread", "fp8", "fp16"), rdna4)
    assert not rep.is_variant_disabled(KernelConfig("per_warp", "fp8", "fp32"), rdna4)
    assert not rep.is_variant_disabled(KernelConfig("per_thread", "fp8", "fp16", v_residual=True), rdna4)
    assert rep.crossover_for(rdna4, KernelConfig()) == 1024
    # fp8+residual's second P·V product: the measured crossover scaled
    assert rep.crossover_for(rdna4, KernelConfig(v_residual=True)) == 1024 * 2
    assert rep.crossover_for(rdna4, KernelConfig(v_residual=True), 64) == 1024 * 16  # never paid off at 64


def test_crossover_per_head_dim_picks_the_nearest_measured_size(rep, rdna4, monkeypatch):
    r = _report(rep, rdna4, crossover={"seq_len": 4096, "head_dim": 128,
                                       "by_head_dim": {"64": {"seq_len": 8192, "head_dim": 64}}})
    rep.save_report(r)
    monkeypatch.setattr(rep, "report_key", lambda arch, *a: r["key"])
    assert rep.measured_crossover(rdna4) == 4096
    assert [rep.crossover_for(rdna4, None, d) for d in (40, 64, 80, 96, 128, 256)] == [8192, 8192, 8192, 4096,
                                                                                       4096, 4096]


@pytest.mark.parametrize("change", ["pack", "kernels", "torch", "triton", "arch", "gpu"])
def test_any_key_change_invalidates(rep, rdna4, change):
    r = _report(rep, rdna4)
    rep.save_report(r)
    assert rep.load_report(r["key"]) is not None
    other = dict(r["key"], **{change: "something else"})
    assert rep.load_report(other) is None  # a different pack/kernel/torch/triton/GPU: redo the self-test


def test_real_key_tracks_versions_and_sources(rep, rdna4):
    import torch
    import triton

    key = rep.report_key(rdna4)
    assert key["torch"] == torch.__version__ and key["triton"] == triton.__version__
    assert key["pack"] == rep.pack_version() != "unknown"
    assert key["arch"] == "gfx1201" and len(key["kernels"]) == 12
    assert rep.key_id(key) == rep.key_id(dict(key)) != rep.key_id(dict(key, kernels="0" * 12))


def test_corrupt_wrong_schema_and_stale_reports(rep, rdna4, tmp_path):
    r = _report(rep, rdna4)
    path = rep.save_report(r)
    path.write_text("{ not json")
    assert rep.load_report(r["key"]) is None
    path.write_text(json.dumps(dict(r, schema=rep.SCHEMA + 1)))
    assert rep.load_report(r["key"]) is None
    # Saving a report for a new key removes the one it supersedes (same arch, torch, triton and pack: an
    # edited kernel), not other GPUs' reports nor another torch's sharing the folder (issue 31, item 7).
    from sagetriton.kernels.arch import ArchInfo

    ada = ArchInfo("nvidia", "sm89", "ada", "RTX 4090", 32, "e4m3fn")
    rep.save_report(rep.new_report(rep.report_key(ada, "2.9.0", "3.5.0")))
    path.write_text(json.dumps(r))  # the valid old-schema-free report again
    keys = {}
    for change in ({"torch": "2.10.0"}, {"kernels": "0" * 12}):
        new = _report(rep, rdna4)
        new["key"] = keys[next(iter(change))] = dict(new["key"], **change)
        new["key_id"] = rep.key_id(new["key"])
        rep.save_report(new)
    names = sorted(p.name for p in tmp_path.glob("report-*.json"))
    assert len(names) == 3 and any(n.startswith("report-sm89-") for n in names), names
    assert rep.load_report(keys["torch"]) is not None and rep.load_report(keys["kernels"]) is not None
    assert rep.load_report(r["key"]) is None and not path.exists()  # superseded by the kernel edit


def test_cache_is_refreshed_by_save(rep, rdna4, monkeypatch):
    key = rep.report_key(rdna4, "2.9.0", "3.5.0")
    monkeypatch.setattr(rep, "report_key", lambda arch, *a: key)
    assert rep.current_report(rdna4) is None
    assert rep.measured_crossover(rdna4) is None and rep.sdpa_default_safe(rdna4) is None
    r = rep.new_report(key)
    r["crossover"] = {"seq_len": 4096}
    rep.save_report(r)  # e.g. the background first-start finishing while ComfyUI runs
    assert rep.measured_crossover(rdna4) == 4096


def test_report_dir_default_is_writable_and_overridable(pack, monkeypatch, tmp_path):
    from sagetriton.installer import report

    monkeypatch.delenv("SAGETRITON_REPORT_DIR", raising=False)
    d = report.report_dir()
    assert d.name in (".sagetriton", "sagetriton")  # the pack folder, or the user cache when read-only
    monkeypatch.setenv("SAGETRITON_REPORT_DIR", str(tmp_path / "x"))
    assert report.report_dir() == tmp_path / "x"


def test_kernel_never_faster_keeps_sdpa_beyond_the_measured_range(rep, rdna4, monkeypatch):
    key = rep.report_key(rdna4, "2.9.0", "3.5.0")
    monkeypatch.setattr(rep, "report_key", lambda arch, *a: key)
    r = rep.new_report(key)
    r["crossover"] = {"seq_len": None, "kernel_never_faster": True,
                      "timings": [{"seq_len": 1024, "kernel_ms": 2, "sdpa_ms": 1},
                                  {"seq_len": 16384, "kernel_ms": 30, "sdpa_ms": 20}]}
    rep.save_report(r)
    assert rep.measured_crossover(rdna4) == 32768


def test_crossover_from_timings(pack):
    from sagetriton.installer.selftest import crossover_from_timings

    t = lambda n, k, s: {"seq_len": n, "kernel_ms": k, "sdpa_ms": s}  # noqa: E731
    # Faster from 4096 on; the win at 1024 is noise (slower again at 2048) and does not count.
    c = crossover_from_timings([t(1024, 1, 2), t(2048, 3, 2), t(4096, 5, 6), t(8192, 10, 20)])
    assert c["seq_len"] == 4096 and not c["kernel_never_faster"]
    c = crossover_from_timings([t(1024, 3, 2), t(2048, 5, 4)])
    assert c["seq_len"] is None and c["kernel_never_faster"]
    assert crossover_from_timings([t(256, 1, 2)])["seq_len"] == 256
    # A win smaller than the margin (2 % here) does not count: noise near the crossover.
    c = crossover_from_timings([t(4096, 5.9, 6), t(4608, 6, 7), t(8192, 10, 20)])
    assert c["seq_len"] == 4608 and c["margin"] < 1
    assert crossover_from_timings([])["kernel_never_faster"] is False


@pytest.mark.parametrize("field", ["long_sequence_kernel", "rope_kernel"])
@pytest.mark.parametrize("entry, failed", [(None, False), ({"ok": True, "cosine": 0.9993}, False),
                                           ({"ok": False, "error": "inaccurate"}, True),
                                           ({"ok": False, "error": "out of memory", "oom": True}, False)])
def test_kernel_check_verdict(rep, rdna4, monkeypatch, field, entry, failed):
    """A kernel install.py checked on its own (Hopper's long-sequence kernel, the RoPE kernel) is off only
    where its check failed for a reason of its own: running out of memory says nothing about it."""
    r = _report(rep, rdna4, **{field: entry})
    rep.save_report(r)
    monkeypatch.setattr(rep, "report_key", lambda arch, *a: r["key"])
    assert getattr(rep, f"{field}_failed")(rdna4) is failed


def test_measured_pv_choice_replaces_the_table_default_only_when_auto(rep, monkeypatch):
    """install.py timed int8 P·V faster than fp8 at head_dim 128 on this (simulated) Hopper: an
    unconfigured node runs int8 there and says why; an explicit choice, a failed int8 variant or
    another head size keep their own."""
    from sagetriton.kernels.arch import ArchInfo
    from sagetriton.nodes.config.install_report import InstallReport
    from sagetriton.nodes.config.planner import KernelPlanner
    from sagetriton.nodes.config.settings import DEFAULT_SETTINGS
    from sagetriton.nodes.reporting.run_summary import describe_plan

    h200 = ArchInfo("nvidia", "sm90", "hopper", "NVIDIA H200", 132, "e4m3fn")
    r = _report(rep, h200, pv_choice={"seq_len": 8192, "batch": 2, "heads": 24, "by_head_dim": {
        "128": {"choice": "int8", "ms": {"fp8": 2.5, "int8": 1.8}},
        "64": {"choice": "fp8", "ms": {"fp8": 1.4, "int8": 1.9}}}})
    rep.save_report(r)
    monkeypatch.setattr(rep, "report_key", lambda arch, *a: r["key"])
    assert rep.measured_pv_choice(h200, 128) == ("int8", {"fp8": 2.5, "int8": 1.8})
    assert rep.measured_pv_choice(h200, 40)[0] == "fp8" and rep.measured_pv_choice(h200, 256)[0] == "int8"

    plan = KernelPlanner(report=InstallReport()).plan(h200, 128)
    assert plan.config.pv_precision == "int8" and "timed by install.py: fp8 2.50 ms, int8 1.80 ms" in plan.pv_source
    assert "int8 PV" in describe_plan(plan) and plan.pv_source in describe_plan(plan)
    assert KernelPlanner(report=InstallReport()).plan(h200, 64).config.pv_precision == "fp8"
    mine = KernelPlanner(DEFAULT_SETTINGS.replace(pv_precision="fp8"), InstallReport()).plan(h200, 128)
    assert mine.config.pv_precision == "fp8" and mine.pv_source == ""

    r["disabled_variants"] = [f"{plan.config.qk_quant_gran}/int8/fp32"]
    rep.save_report(r)
    kept = KernelPlanner(report=InstallReport()).plan(h200, 128)
    assert kept.config.pv_precision == "fp8" and kept.pv_source == ""
