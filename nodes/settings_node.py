"""Sage Settings node: the user's kernel choices as a SAGE_SETTINGS value."""
from __future__ import annotations

from .alt_backends import BACKENDS, DEFAULT_BACKEND, available_backends
from .settings import (
    FALLBACK_CHOICES,
    PV_ACCUM_DTYPE_CHOICES,
    PV_PRECISION_CHOICES,
    QK_QUANT_GRAN_CHOICES,
    QK_ROTATION_CHOICES,
    SageSettings,
)

SETTINGS_TYPE = "SAGE_SETTINGS"


def settings_input_problem(value):
    """True, or why ``value`` typed into a prompt is not a settings input (only a Sage Settings node makes one).

    At validation ComfyUI passes None for a linked input, so None is "linked or left empty": both fine.
    """
    if value is None or isinstance(value, SageSettings):
        return True
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    return (f"settings: {shown} ({type(value).__name__}) is not Sage Settings; connect a Sage Settings node's "
            "output, or leave the input unconnected for this GPU's defaults")


class SageTritonSettings:
    DESCRIPTION = ("Quantized-attention options for Patch Model Attention. 'auto' uses the defaults for this GPU; "
                   "choices the GPU cannot run are downgraded to the nearest supported one, with a log line.")
    CATEGORY = "sampling/attention"
    FUNCTION = "build"
    RETURN_TYPES = (SETTINGS_TYPE,)
    RETURN_NAMES = ("settings",)
    OUTPUT_TOOLTIPS = ("Settings for the Patch Model Attention node.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "qk_quant_gran": (list(QK_QUANT_GRAN_CHOICES), {
                "default": "auto",
                "tooltip": "How many Q/K tokens share one INT8 scale. per_block is fastest, per_thread most accurate. "
                           "auto = this GPU's default."}),
            "pv_precision": (list(PV_PRECISION_CHOICES), {
                "default": "auto",
                "tooltip": "Precision of the P·V product. int8 is about twice as accurate as fp8 (relative error "
                           "0.017 vs 0.039, ComfyUI's own INT8 attention 0.016) and the default where it is also "
                           "faster (RTX 30/40/50, A100); on Hopper it runs at 1.06-1.20x SDPA against fp8's "
                           "1.48-1.61x (H200, 8K-32K tokens), so fp8 is the default there. fp8 needs fp8 matrix units "
                           "(Ada, Hopper, Blackwell, MI300, RDNA4; elsewhere it falls back to fp16). fp8+residual "
                           "adds a second fp8 product with V's rounding error (0.028) but is about 25% slower (H200: "
                           "1.13-1.17x SDPA vs 1.48-1.55x at 8K-16K tokens). fp16 is the most accurate (0.013) and "
                           "the slowest. auto = whichever of this GPU's P·V paths install.py timed faster here "
                           "(without its report: this GPU's default)."}),
            "pv_accum_dtype": (list(PV_ACCUM_DTYPE_CHOICES), {
                "default": "auto",
                "tooltip": "Accumulator of P·V. fp32 is safest; fp16+fp32 accumulates each tile in fp16 and sums "
                           "in fp32; fp16 is fastest but can overflow on models with large V. "
                           "auto = this GPU's default."}),
            "smooth_k": ("BOOLEAN", {
                "default": True,
                "tooltip": "Subtract K's per-channel mean before INT8 quantization: exact for softmax and removes "
                           "the outliers that hurt INT8 accuracy. Keep on."}),
            "smooth_v": ("BOOLEAN", {
                "default": False,
                "tooltip": "Subtract V's mean before P·V and add it back after: keeps fp16 accumulation in range. "
                           "Try it if outputs go black or noisy with fp16 accumulation."}),
            "min_seq_len": ("INT", {
                "default": -1, "min": -1, "max": 1 << 20, "step": 1,
                "tooltip": "Use the kernel only when the key length is at least this. -1 = the crossover measured "
                           "for this GPU (below it PyTorch attention is faster; calls with less work than that "
                           "measurement, e.g. few heads, stay on PyTorch too), 0 = always use the kernel."}),
            "fallback": (list(FALLBACK_CHOICES), {
                "default": "auto",
                "tooltip": "Attention for calls the kernel does not take. auto = ComfyUI's own attention (math-only "
                           "SDPA on RDNA4, where SDPA's flash path can crash); sdpa = PyTorch SDPA; math = "
                           "math-only SDPA in query chunks (slow, safe)."}),
            "full_precision_first_steps": ("INT", {
                "default": 0, "min": 0, "max": 10000, "step": 1,
                "tooltip": "This many first sampling steps use the fallback instead of the quantized kernel "
                           "(a known fix for INT8 artefacts in composition)."}),
            "full_precision_last_steps": ("INT", {
                "default": 0, "min": 0, "max": 10000, "step": 1,
                "tooltip": "This many last sampling steps use the fallback instead of the quantized kernel "
                           "(a known fix for INT8 artefacts in fine detail)."}),
        }, "optional": {
            # Optional, so workflows saved before it existed keep their widget values.
            "qk_rotation": (list(QK_ROTATION_CHOICES), {
                "default": "auto",
                "tooltip": "Rotate Q and K (a fixed Hadamard matrix, exact for attention) before INT8 rounding, "
                           "which spreads outlier channels: 1.6-2.6x closer to exact on inputs with massive "
                           "channels or outlier tokens, for 2-6% of speed. auto = on for GPUs."}),
            "backend": (list(BACKENDS), {
                "default": DEFAULT_BACKEND,
                "tooltip": "Which attention runs the calls the kernel would take, to compare them in one workflow: "
                           "SageTriton (this pack), SageAttention (the CUDA library, if installed), comfy-kitchen "
                           "(ComfyUI's INT8 attention, if available) or SDPA (PyTorch). Installed here: "
                           f"{', '.join(available_backends())}. A choice that is not installed runs SageTriton, "
                           "with a log line naming the fix."}),
        }}

    def build(self, **choices):
        return (SageSettings(**choices),)
