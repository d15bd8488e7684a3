"""What one call allocates, counted on meta tensors: the real ``attention_forward`` runs its host code
(quantization buffers, descriptors, the split last wave's workspace) and records its launches instead
of running them, while a dispatch mode tracks the bytes alive at each allocation.

The issue's budget is SDPA's peak plus the quantized copies of Q, K and V. SDPA's peak holds at least
its output, the same size as ours, so a call within output + copies is within the budget whatever
SDPA allocates besides; what is over that is named here, and measured on the GPU by
``bench/bench_kernels.py`` (its "MiB" and "vs budget" columns).
"""
import weakref

import pytest
import torch
from sagetriton.installer import crosscompile
from sagetriton.kernels import api, checks, footprint, hopper_gluon, hopper_host, host, host_quant, quant
from sagetriton.kernels.arch import default_config, resolve_config
from torch.utils._python_dispatch import TorchDispatchMode

FACTORIES = {"aten::empty", "aten::empty_strided", "aten::zeros", "aten::ones", "aten::full", "aten::new_empty",
             "aten::new_zeros", "aten::empty_like", "aten::zeros_like", "aten::clone", "aten::contiguous",
             "aten::_to_copy"}


class PeakBytes(TorchDispatchMode):
    """Peak bytes alive among the tensors created inside the mode (freed when the last view dies)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.allocations = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._schema.name in FACTORIES and isinstance(out, torch.Tensor):
            n = out.untyped_storage().nbytes()
            self.live += n
            self.peak = max(self.peak, self.live)
            self.allocations.append((func._schema.name, tuple(out.shape), out.dtype, n))
            weakref.finalize(out, self._free, n)
        return out

    def _free(self, n):
        self.live -= n


def _sm90(head_dim, pv=None):
    arch = crosscompile.parse_target("sm90").arch_info()
    return resolve_config(arch, head_dim, None, pv)[0] if pv else default_config(arch, head_dim)


def _peak_of_call(monkeypatch, cfg, B, H, H_KV, L, D, layout="HND"):
    """(peak bytes, output bytes, the call's launches) of one call on meta tensors."""
    for m in (checks, host, host_quant, hopper_host):  # nothing runs: launches are recorded
        monkeypatch.setattr(m, "interpreter_enabled", lambda: False)

    def make(heads):
        shape = (B, heads, L, D) if layout == "HND" else (B, L, heads, D)
        return torch.empty(shape, dtype=torch.bfloat16, device="meta")

    q, k, v = make(H), make(H_KV), make(H_KV)
    with PeakBytes() as mode, crosscompile.record_launches() as recorded:
        out, _ = api.attention_forward(q, k, v, layout, False, None, None, False, cfg, True, False)
        out_bytes = out.untyped_storage().nbytes()
        launches = [s["name"] for s in recorded]
        del out
    return mode.peak, out_bytes, launches, mode.allocations


def _statistics_bytes(B, H_KV, D):
    """K mean / V range partials (4 slots of ``quant.STATS_PARTS`` per head) and their 3 finalized rows:
    per head, not per token (1.6 MB at 2 x 24 heads, head_dim 128)."""
    return (4 * quant.STATS_PARTS + 3) * B * H_KV * footprint.head_dim_padded(D) * footprint.FP32


CASES = [  # (what, config, B, H, H_KV, L, D, layout, the kernels that run)
    ("hopper, portable kernel below the Gluon kernel's length", _sm90(128), 2, 24, 24, 4096, 128, "HND",
     {"attention_kernel"}),
    ("hopper, Gluon kernel, whole waves", _sm90(128), 2, 24, 24, 4608, 128, "HND", {"shared_kv_attention_kernel"}),
    ("hopper, Gluon kernel and a split last wave, 8K", _sm90(128), 2, 24, 24, 8192, 128, "HND",
     {"shared_kv_attention_kernel", "shared_kv_split_kernel"}),
    ("hopper, Gluon kernel and a split last wave, 32K", _sm90(128), 1, 12, 12, 32768, 128, "HND",
     {"shared_kv_attention_kernel", "shared_kv_split_kernel"}),
    ("hopper, fewer CTAs than SMs: every CTA split", _sm90(128), 1, 2, 2, 8192, 128, "HND",
     {"shared_kv_split_kernel"}),
    ("hopper fp8+residual, split last wave", _sm90(128, "fp8+residual"), 2, 24, 24, 8192, 128, "HND",
     {"shared_kv_attention_kernel", "shared_kv_split_kernel"}),
    ("hopper head_dim 64, portable kernel", _sm90(64), 2, 24, 24, 8192, 64, "HND", {"attention_kernel"}),
    ("hopper, NHD, grouped-query heads, head_dim 80 padded to 128", _sm90(80), 1, 24, 8, 3000, 80, "NHD",
     {"attention_kernel"}),
    ("fp16 P·V: V read in place", _sm90(128, "fp16"), 1, 8, 8, 2048, 128, "HND", {"attention_kernel"}),
]


@pytest.mark.parametrize("what, cfg, B, H, H_KV, L, D, layout, kernels", CASES, ids=[c[0] for c in CASES])
def test_a_call_allocates_its_output_its_quantized_copies_and_per_head_statistics(
        monkeypatch, what, cfg, B, H, H_KV, L, D, layout, kernels):
    """Beyond output + copies: the per-head statistics and, with a split last wave, its shares'
    hand-over (row max, row sum and a flag per warpgroup of a tail CTA: at most 400 KB on an H200).
    Before the shares merged in turn, each kept fp32 rows: up to 25 MB, 14-17 % of the copies at
    8K-32K tokens (bench/NOTES.md attempt 45)."""
    if any(k.startswith("shared_kv") for k in kernels) and not hopper_gluon.AVAILABLE:
        pytest.skip("this Triton has no Gluon")
    peak, out_bytes, launches, allocations = _peak_of_call(monkeypatch, cfg, B, H, H_KV, L, D, layout)
    assert set(launches) & {"attention_kernel", "shared_kv_attention_kernel", "shared_kv_split_kernel"} == kernels
    copies = footprint.quantized_copy_bytes(B, H, H_KV, L, L, D, v_residual=cfg.v_residual)
    allowed = _statistics_bytes(B, H_KV, D)
    if "shared_kv_split_kernel" in kernels:
        allowed += footprint.max_split_workspace_bytes(api.sm_count(torch.device("meta")), 3 * hopper_gluon.ROWS,
                                                       hopper_gluon.CONSUMERS)
    assert peak - out_bytes - copies <= allowed, (peak - out_bytes - copies, allowed, allocations)
    assert peak >= out_bytes + B * (H + H_KV) * L * footprint.head_dim_padded(D)  # it sees the int8 Q and K
