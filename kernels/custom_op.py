"""The custom op ``sagetriton::attention`` with a fake implementation, so ``torch.compile(fullgraph=True)``
traces through ``sageattn``; it also waits on and unwraps wrapper subclasses (``devices.wrapped``)."""
from __future__ import annotations

from typing import Optional

import torch

from .arch import KernelConfig
from .checks import _out_shape, check_config
from .host import _run


def _op_config(cfg: KernelConfig) -> tuple:
    """``cfg``'s fields in the custom op's argument order."""
    return (cfg.qk_quant_gran, cfg.pv_precision, cfg.pv_accum_dtype, cfg.fp8_format or "", cfg.block_m, cfg.block_n,
            cfg.num_warps, cfg.num_stages, cfg.use_tma, cfg.max_registers, cfg.shared_kv_min_len, cfg.v_residual,
            cfg.pdl, cfg.qk_rotation, cfg.rotation_tiles)



def _attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, is_causal: bool,
                    sm_scale: float, attn_mask: Optional[torch.Tensor], return_lse: bool,
                    qk_quant_gran: str, pv_precision: str, pv_accum_dtype: str, fp8_format: str,
                    block_m: int, block_n: int, num_warps: int, num_stages: int, use_tma: bool,
                    max_registers: int, shared_kv_min_len: int, v_residual: bool, pdl: bool, qk_rotation: bool,
                    rotation_tiles: bool, smooth_k: bool, smooth_v: bool,
                    out_layout: str, checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    # ``checked``: an eager ``sageattn`` call that checked its arguments and config (autograd, wrapper subclasses).
    # A traced graph enters with False, and so does any other caller: the checks run here then, once.
    cfg = KernelConfig(qk_quant_gran, pv_precision, pv_accum_dtype, fp8_format or None,
                       block_m, block_n, num_warps, num_stages, use_tma=use_tma, max_registers=max_registers,
                       shared_kv_min_len=shared_kv_min_len, v_residual=v_residual, pdl=pdl, qk_rotation=qk_rotation,
                       rotation_tiles=rotation_tiles)
    if not checked:
        check_config(cfg)
    return _run([q, k, v], layout, is_causal, sm_scale, attn_mask, return_lse, cfg, smooth_k, smooth_v, out_layout,
                release=False, in_op=True, checked=checked)


def _attention_fake(q, k, v, layout, is_causal, sm_scale, attn_mask, return_lse, qk_quant_gran, pv_precision,
                    pv_accum_dtype, fp8_format, block_m, block_n, num_warps, num_stages, use_tma, max_registers,
                    shared_kv_min_len, v_residual, pdl, qk_rotation, rotation_tiles, smooth_k, smooth_v, out_layout,
                    checked=False):
    B, D = q.shape[0], q.shape[3]
    H, LQ = (q.shape[1], q.shape[2]) if layout == "HND" else (q.shape[2], q.shape[1])
    lse_shape = (B, H, LQ) if return_lse else (0,)
    return q.new_empty(_out_shape(B, H, LQ, D, out_layout)), q.new_empty(lse_shape, dtype=torch.float32)


def register_once(name: str, impl, fake):
    """``torch.ops.sagetriton.<name>``, defined on first use in this process: the pack can be imported twice
    under different module names (ComfyUI names it after its folder) and the same code serves both; defined
    at import, as defining it while torch.compile traces is a graph break."""
    if not hasattr(torch.ops.sagetriton, name):
        op = torch.library.custom_op(f"sagetriton::{name}", impl, mutates_args=())
        op.register_fake(fake)
    return getattr(torch.ops.sagetriton, name)


attention_op = register_once("attention", _attention_impl, _attention_fake)
