"""Figures a user reads in the tooltips and the README: one place, so the two cannot drift apart.

Measured on an NVIDIA H200 (docs/RESULTS.md has the runs); tests/test_user_text.py checks that the
README's settings table quotes the same figures as the tooltips.
"""
from __future__ import annotations

# Relative error of the attention output on random inputs, per P·V precision (lower is more accurate).
PV_ERROR = {"fp8": "0.039", "fp8+residual": "0.028", "int8": "0.017", "fp16": "0.013"}
# The Q/K rotation: how much closer to exact on inputs with outlier channels, and what it costs in speed.
QK_ROTATION_GAIN = "1.6-2.6x"
QK_ROTATION_COST = "1-6 %"
# RoPE in the pack's kernel: a Flux-dev 1024² step with it against the same patch with ComfyUI 0.3.64's RoPE.
ROPE_GAIN = "13 %"
