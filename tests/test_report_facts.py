"""The runtime's view of the install report is a typed, frozen value (``installer/report_facts.py``), parsed once
each time the file is read, not walked again for every question."""
import dataclasses
import os

import pytest


@pytest.fixture
def rdna4(pack):
    from sagetriton.kernels.arch import ArchInfo

    return ArchInfo("amd", "gfx1201", "rdna4", "AMD Radeon RX 9070 XT", 32, "e4m3fn")


def test_the_report_is_parsed_once_per_file_change(rep, rdna4, monkeypatch):
    from sagetriton.installer import report_facts
    from sagetriton.kernels.arch import KernelConfig

    key = rep.report_key(rdna4, "2.9.0", "3.5.0")
    monkeypatch.setattr(rep, "report_key", lambda arch, *a: key)
    r = rep.new_report(key)
    r.update(crossover={"seq_len": 4096, "head_dim": 128, "by_head_dim": {"64": {"seq_len": 8192}}},
             disabled_variants=["per_thread/fp8/fp16"], sdpa_default_safe=False,
             rope_kernel={"ok": False, "error": "wrong"},
             pv_choice={"by_head_dim": {"128": {"choice": "int8", "ms": {"fp8": 2.0, "int8": 1.5}}}})
    path = rep.save_report(r)
    parsed = []
    real = report_facts.parse
    monkeypatch.setattr(report_facts, "parse", lambda report: parsed.append(report) or real(report))
    for _ in range(3):  # every question of a plan, several plans
        assert rep.measured_crossover(rdna4) == 4096 and rep.crossover_for(rdna4, KernelConfig(), 64) == 8192
        assert rep.is_variant_disabled(KernelConfig("per_thread", "fp8", "fp16"), rdna4)
        assert rep.sdpa_default_safe(rdna4) is False and rep.rope_kernel_failed(rdna4)
        assert not rep.long_sequence_kernel_failed(rdna4)
        assert rep.measured_pv_choice(rdna4, 128) == ("int8", {"fp8": 2.0, "int8": 1.5})
    assert len(parsed) == 1
    facts = rep.current_facts(rdna4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.rope_kernel_failed = False

    r["crossover"] = {"seq_len": 2048}  # the file replaced (install.py run again): read and parsed again
    rep.save_report(r)
    os.utime(path, ns=(1, 1))
    assert rep.measured_crossover(rdna4) == 2048 and len(parsed) == 2
    assert rep.current_facts(rdna4) is not facts and rep.current_facts(rdna4) is rep.current_facts(rdna4)


def test_no_report_gives_the_default_answers(rep, rdna4):
    from sagetriton.installer.report_facts import NO_FACTS

    assert rep.current_facts(rdna4) == NO_FACTS
    assert rep.measured_crossover(rdna4) is None and rep.measured_pv_choice(rdna4) is None
    assert rep.disabled_variants(rdna4) == frozenset() and not rep.rope_kernel_failed(rdna4)
