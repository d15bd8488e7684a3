"""Sparse calls left to the GPU's P·V default run INT8 on Hopper (where they meet comfy-kitchen's error within
0.55-0.61x its time, docs/RESULTS.md), the dense default elsewhere; the nodes do the same when P·V is on auto,
and keep what the user chose otherwise. Devices are simulated by their ``ArchInfo``."""
from __future__ import annotations

import torch
from sagetriton.kernels import sparse_launch
from sagetriton.kernels.arch import ArchInfo, sparse_default_pv
from sagetriton.nodes.config.planner import KernelPlanner
from sagetriton.nodes.config.settings import DEFAULT_SETTINGS

H200 = ArchInfo("nvidia", "sm90", "hopper", "NVIDIA H200", 132, "e4m3fn")
L40 = ArchInfo("nvidia", "sm89", "ada", "NVIDIA L40", 142, "e4m3fn")
RX9070 = ArchInfo("amd", "gfx1201", "rdna4", "AMD Radeon RX 9070 XT", 32, "e4m3fn")


def test_hopper_takes_int8_and_other_gpus_keep_their_default():
    assert sparse_default_pv(H200) == "int8"
    assert sparse_default_pv(L40) is None and sparse_default_pv(RX9070) is None


def test_a_kernel_call_without_a_config_resolves_the_sparse_default(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(sparse_launch, "arch_for_device", lambda device: H200)
    cfg = sparse_launch.default_config(cpu, 128)
    assert cfg.pv_precision == "int8"
    monkeypatch.setattr(sparse_launch, "arch_for_device", lambda device: RX9070)
    assert sparse_launch.default_config(cpu, 128).pv_precision != "int8"  # RDNA4's dense default


def test_the_nodes_sparse_plan_follows_auto_and_keeps_an_explicit_choice():
    auto = KernelPlanner()
    dense = auto.plan(H200, 128)
    assert dense.config.pv_precision == "fp8"  # dense calls keep Hopper's fast default
    sparse = auto.sparse_plan(H200, 128)
    assert sparse.config.pv_precision == "int8" and sparse.min_seq_len == dense.min_seq_len
    assert sparse.config.qk_quant_gran == dense.config.qk_quant_gran
    assert auto.sparse_plan(H200, 128) is sparse  # resolved once
    assert auto.plan(H200, 128) is dense
    mine = KernelPlanner(DEFAULT_SETTINGS.replace(pv_precision="fp8"))
    assert mine.sparse_plan(H200, 128).config.pv_precision == "fp8"
    other = KernelPlanner()
    assert other.sparse_plan(L40, 128) is other.plan(L40, 128)
