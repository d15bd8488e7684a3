"""Sage Settings' sparse-attention inputs (optional: workflows saved before them keep their widget values)."""
from __future__ import annotations

from ..config.sparse_settings import (
    DEFAULT_MIN_TOKENS,
    EXTRA_TOKENS_MAX,
    EXTRA_TOKENS_STEP,
    SINK_CHOICES,
    SPARSE_MODES,
    SPARSE_OFF,
    TAU_RANGE,
    TOPK_RANGE,
)

SPARSE_INPUTS = {
    "sparse": (list(SPARSE_MODES), {
        "default": SPARSE_OFF.mode,
        "tooltip": "Block-sparse attention for long self-attention (long video): each 64-token block attends the "
                   "key blocks that matter exactly and the rest as one averaged term each. Faster, not exact: "
                   "check results by eye. sol = per-row threshold (tau), top-k = a fixed share of blocks."}),
    "sparse_tau": ("FLOAT", {
        "default": SPARSE_OFF.tau, "min": TAU_RANGE[0], "max": TAU_RANGE[1], "step": 0.05,
        "tooltip": "sol's threshold in standard deviations of a row's block scores. Higher is sparser and faster: "
                   "about 16 % of key blocks exact at 1.0, 7 % at 1.5 (video models)."}),
    "sparse_topk_ratio": ("FLOAT", {
        "default": SPARSE_OFF.topk_ratio, "min": TOPK_RANGE[0], "max": TOPK_RANGE[1], "step": 0.01,
        "tooltip": "top-k's share of key blocks each query block attends exactly (the diagonal and conditioning "
                   "blocks come on top). Higher is closer to dense."}),
    "sparse_start_percent": ("FLOAT", {
        "default": SPARSE_OFF.start_percent, "min": 0.0, "max": 1.0, "step": 0.01,
        "tooltip": "Where in the sampling schedule sparse attention begins; before it every call is dense "
                   "(the first steps set the composition). Same meaning as ComfyUI's Model Sparse Attention."}),
    "sparse_end_percent": ("FLOAT", {
        "default": SPARSE_OFF.end_percent, "min": 0.0, "max": 1.0, "step": 0.01,
        "tooltip": "Where in the sampling schedule sparse attention ends; after it every call is dense."}),
    "sparse_dense_layers": ("STRING", {
        "default": SPARSE_OFF.dense_layers, "multiline": False,
        "tooltip": "Transformer blocks that always run dense, by the index the model reports, e.g. '0, 1, 47-49'. "
                   "Empty = none."}),
    "sparse_min_tokens": ("INT", {
        "default": DEFAULT_MIN_TOKENS, "min": 0, "max": 1 << 20, "step": 64,
        "tooltip": "Shorter self-attention calls stay dense (sparse gains little there). "
                   "Cross-attention and masked calls always stay dense."}),
    "sparse_sink_conditioning": (list(SINK_CHOICES), {
        "default": SPARSE_OFF.sink_conditioning,
        "tooltip": "Text and other conditioning tokens inside a joint attention (Flux, HunyuanVideo, Qwen-Image, "
                   "MiniMax-H3): exact_kv = every query attends them exactly; exact_kv_and_rows = their own rows "
                   "also attend everything exactly; off = treated like image tokens."}),
    "sparse_extra_tokens": ("INT", {
        "default": SPARSE_OFF.extra_tokens, "min": 0, "max": EXTRA_TOKENS_MAX, "step": EXTRA_TOKENS_STEP,
        "tooltip": "Per query block, this many more single tokens outside its exact blocks, the highest "
                   "scoring, are attended exactly. Closer to dense; 0 = off. Costly: on an H200, 256 of them make "
                   "a 104K-token call 2-3x as long with Triton 3.9 (about comfy-kitchen's time), 4-8x with Triton "
                   "3.6 (docs/SPARSE.md)."}),
}
