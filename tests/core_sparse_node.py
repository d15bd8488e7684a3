"""Current ComfyUI core's "Model Sparse Attention" node (``comfy_extras/nodes_sparse_attention.py``, core
0.38+), emulated for tests on an older ComfyUI. Written here from the behaviour its source shows (nothing
copied), for the generic models (not MiniMax-H3's block patches):

- one options object per patched model with ``dense_reason(transformer_options, tokens, block_index)``
  (the sigma window from ``percent_to_sigma``, ``min_tokens``, the dense blocks) and ``installed`` (the
  overrides it has put on the hook);
- an attention override that runs comfy-kitchen's ``sol_attn`` on (B, T, H, 128) fp16/bf16/fp32 (fp32 cast to
  bf16 first) self-attention without a mask, with the node's ``tau``, ``topk_ratio`` (its "sla" method) and
  ``extra_tokens`` (``token_aug``, 256 by default in current core), and hands every other call to the override
  that was on the hook before it (or to ``func``): masks, its dense reasons, devices or GPUs without the kernel,
  other head sizes, cross-attention or GQA, mixed dtypes;
- ``install``: puts a new override on top of whatever is on the hook unless one of its own is already
  there; core calls it when the node runs and again before every step (``ON_PREPARE_STATE`` with the
  sampler's model_options), so a node applied later cannot push it down.

ComfyUI 0.3.64 calls ``ON_PREPARE_STATE`` callbacks without the sampler's model_options; the emulation
reaches them from an ``OUTER_SAMPLE`` wrapper instead (the guider's own copy, which every step reads), once
per sampling run before the first step: the same outcome, as no other node moves the override mid-run.
``kernel`` stands in for ``sol_attn`` (comfy-kitchen is CUDA-only): it gets the (B, T, H, D) views and
records each call; ``available(device)`` stands in for ``sol_attn_is_available``.
"""
from __future__ import annotations

import re

import torch

OVERRIDE_KEY = "optimized_attention_override"
KEY = "block_sparse_attention"


class RecordingSol:
    """A stand-in for ``comfy_kitchen.sol_attn``: exact attention, and a record of the calls it ran."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, q, k, v, tau=1.3, scale=None, topk_ratio=0.0, token_aug=0, **kwargs):
        self.calls.append((tuple(q.shape), q.dtype, tau, topk_ratio, token_aug))
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), scale=scale)
        return out.transpose(1, 2).to(q.dtype)


def blocks_of(text: str) -> set:
    found = set()
    for lo, hi in re.findall(r"(\d+)(?:\s*-\s*(\d+))?", text or ""):
        a, b = int(lo), int(hi or lo)
        found.update(range(min(a, b), max(a, b) + 1))
    return found


class CoreSparseOptions:
    def __init__(self, kernel, sigma_start, sigma_end, min_tokens, dense_blocks, available, tau=1.3, topk_ratio=0.0,
                 extra_tokens=256):
        self.kernel = kernel
        self.tau, self.topk_ratio, self.extra_tokens = tau, topk_ratio, extra_tokens
        self.sigma_start, self.sigma_end = sigma_start, sigma_end
        self.min_tokens = min_tokens
        self.dense_blocks = dense_blocks
        self.available = available
        self.installed = set()

    def dense_reason(self, transformer_options, tokens, block_index):
        sigmas = transformer_options.get("sigmas")
        if sigmas is not None:
            sigma = float(sigmas[0])
            if sigma > self.sigma_start or sigma < self.sigma_end:
                return "outside the window"
        if tokens < self.min_tokens:
            return "short"
        if block_index is not None and block_index in self.dense_blocks:
            return "dense block"
        return None


def make_core_override(options: CoreSparseOptions, previous):
    def override(func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
                 **kwargs):
        topts = kwargs.get("transformer_options") or {}

        def declined():
            kw = dict(mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape,
                      skip_output_reshape=skip_output_reshape, **kwargs)
            return func(q, k, v, heads, **kw) if previous is None else previous(func, q, k, v, heads, **kw)

        if mask is not None:
            return declined()
        tokens = q.shape[2] if skip_reshape else q.shape[1]
        if options.dense_reason(topts, tokens, topts.get("block_index")) is not None:
            return declined()
        if skip_reshape:
            b, d = q.shape[0], q.shape[-1]
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))
        else:
            b, d = q.shape[0], q.shape[-1] // heads
            qs, ks, vs = (t.view(b, -1, heads, d) for t in (q, k, v))
        if (not options.available(q.device) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32)
                or d != 128 or q.shape != k.shape or q.shape != v.shape or k.dtype != q.dtype or v.dtype != q.dtype):
            return declined()
        if q.dtype == torch.float32:  # current core hands fp32 calls to the kernel in bf16
            qs, ks, vs = (t.to(torch.bfloat16) for t in (qs, ks, vs))
        out = options.kernel(qs, ks, vs, tau=options.tau, scale=kwargs.get("scale"), topk_ratio=options.topk_ratio,
                             token_aug=options.extra_tokens).to(q.dtype)
        return out.transpose(1, 2) if skip_output_reshape else out.reshape(b, -1, heads * d)

    return override


def install(options: CoreSparseOptions, transformer_options: dict) -> None:
    current = transformer_options.get(OVERRIDE_KEY)
    if current in options.installed:
        return
    override = make_core_override(options, current)
    options.installed.add(override)
    transformer_options[OVERRIDE_KEY] = override


def apply_core_sparse(model, kernel, start_percent=0.2, end_percent=1.0, min_tokens=12288, dense_blocks="",
                      available=lambda device: True, tau=1.3, topk_ratio=0.0, extra_tokens=256):
    """The node's execute: a clone of ``model`` (a ModelPatcher) with the sparse override installed."""
    import comfy.patcher_extension

    sampling = model.get_model_object("model_sampling")
    options = CoreSparseOptions(kernel, float(sampling.percent_to_sigma(start_percent)),
                                float(sampling.percent_to_sigma(end_percent)), min_tokens, blocks_of(dense_blocks),
                                available, tau, topk_ratio, extra_tokens)
    m = model.clone()
    install(options, m.model_options.setdefault("transformer_options", {}))

    def before_step(patcher, timestep, model_options=None):  # current core passes the sampler's model_options
        if model_options is not None:
            install(options, model_options.setdefault("transformer_options", {}))

    def before_run(executor, *args, **kwargs):  # ComfyUI 0.3.64: see the module docstring
        install(options, executor.class_obj.model_options.setdefault("transformer_options", {}))
        return executor(*args, **kwargs)

    m.add_callback_with_key(comfy.patcher_extension.CallbacksMP.ON_PREPARE_STATE, KEY, before_step)
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, KEY, before_run)
    return m
