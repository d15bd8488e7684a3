"""The launches behind ``sparse_attn`` (validated arguments only: ``sparse_api.check_sparse_args``).

Until the Triton kernels land this runs the pure-torch reference (correct, slow, O(L) memory per
query chunk).
"""
from __future__ import annotations

import torch

from .sparse_reference import sparse_reference


def run(q, k, v, tau, layout, scale, sinks, sinks_q, topk_ratio, extra_tokens, return_lse, return_density,
        out_layout, config):
    res = sparse_reference(q, k, v, tau, tensor_layout=layout, scale=scale, sink_blocks=sinks, sink_q=sinks_q,
                           topk_ratio=topk_ratio, extra_tokens=extra_tokens, return_lse=True, return_density=True,
                           dtype=torch.float32)
    out, lse, density = res
    if out_layout != layout:
        out = out.permute(0, 2, 1, 3).contiguous()
    extra = (lse,) if return_lse else ()
    extra += (density,) if return_density else ()
    return (out, *extra) if extra else out
