"""Sparse calls left to the GPU's P·V default run INT8 on Hopper from ``arch.SPARSE_INT8_FROM_TOKENS`` tokens (where
it meets comfy-kitchen's error within 0.6x its time, docs/RESULTS.md), FP8 below; the nodes do the same when P·V
is on auto, and keep what the user chose otherwise. Devices are simulated by their ``ArchInfo``."""
from __future__ import annotations

import torch
from sagetriton.kernels import arch as arch_mod
from sagetriton.kernels import sparse_launch
from sagetriton.kernels.arch import SPARSE_INT8_FROM_TOKENS, ArchInfo, sparse_default_pv
from sagetriton.nodes.config.planner import KernelPlanner
from sagetriton.nodes.config.settings import DEFAULT_SETTINGS

H200 = ArchInfo("nvidia", "sm90", "hopper", "NVIDIA H200", 132, "e4m3fn")
L40 = ArchInfo("nvidia", "sm89", "ada", "NVIDIA L40", 142, "e4m3fn")
RX9070 = ArchInfo("amd", "gfx1201", "rdna4", "AMD Radeon RX 9070 XT", 32, "e4m3fn")
WAN_720P, SHORT = 75_600, 32_760


def test_hopper_takes_int8_from_the_threshold_and_other_gpus_keep_their_default():
    assert SHORT < SPARSE_INT8_FROM_TOKENS <= WAN_720P
    assert sparse_default_pv(H200, WAN_720P) == "int8"
    assert sparse_default_pv(H200, SPARSE_INT8_FROM_TOKENS) == "int8"
    assert sparse_default_pv(H200, SPARSE_INT8_FROM_TOKENS - 1) is None
    assert sparse_default_pv(L40, WAN_720P) is None and sparse_default_pv(RX9070, WAN_720P) is None


def test_a_kernel_call_without_a_config_resolves_the_sparse_default(monkeypatch):
    monkeypatch.setattr(sparse_launch, "arch_for_device", lambda device: H200)
    cpu = torch.device("cpu")
    assert sparse_launch.default_config(cpu, 128, WAN_720P).pv_precision == "int8"
    assert sparse_launch.default_config(cpu, 128, SHORT).pv_precision == "fp8"  # the dense default there
    monkeypatch.setattr(arch_mod, "SPARSE_INT8_FROM_TOKENS", 1 << 30)
    assert sparse_launch.default_config(cpu, 128, WAN_720P).pv_precision == "fp8"


def test_the_nodes_sparse_plan_follows_auto_and_keeps_an_explicit_choice():
    auto = KernelPlanner()
    dense = auto.plan(H200, 128)
    assert dense.config.pv_precision == "fp8"
    long = auto.sparse_plan(H200, 128, WAN_720P)
    assert long.config.pv_precision == "int8" and long.min_seq_len == dense.min_seq_len
    assert long.config.qk_quant_gran == dense.config.qk_quant_gran
    assert auto.sparse_plan(H200, 128, WAN_720P) is long  # resolved once
    assert auto.sparse_plan(H200, 128, SHORT) is dense
    assert auto.plan(H200, 128) is dense  # the dense calls keep theirs
    mine = KernelPlanner(DEFAULT_SETTINGS.replace(pv_precision="fp8"))
    assert mine.sparse_plan(H200, 128, WAN_720P).config.pv_precision == "fp8"
    other = KernelPlanner()
    assert other.sparse_plan(L40, 128, WAN_720P) is other.plan(L40, 128)
