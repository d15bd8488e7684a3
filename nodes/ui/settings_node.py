"""Sage Settings node: the user's kernel choices as a SAGE_SETTINGS value."""
from __future__ import annotations

from ..backends.alt_backends import BACKENDS, DEFAULT_BACKEND, available_backends
from ..config.settings import (
    FALLBACK_CHOICES,
    PV_ACCUM_DTYPE_CHOICES,
    PV_PRECISION_CHOICES,
    QK_QUANT_GRAN_CHOICES,
    QK_ROTATION_CHOICES,
    SageSettings,
)
from ..config.sparse_settings import dense_layers_problem, split_node_choices
from .sparse_inputs import SPARSE_INPUTS
from .user_figures import PV_ERROR, QK_ROTATION_COST, QK_ROTATION_GAIN, ROPE_GAIN

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
                "tooltip": "Precision of the P·V product. Relative error on random inputs: "
                           + ", ".join(f"{k} {v}" for k, v in PV_ERROR.items())
                           + " (lower is more accurate and slower). auto = the faster of fp8 and int8 on this GPU, "
                           "as timed by install.py; sparse calls on Hopper take int8."}),
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
                "tooltip": "Use the kernel from this key length on. -1 = the crossover measured on this GPU "
                           "(shorter calls run faster on PyTorch attention), 0 = always use the kernel."}),
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
                "tooltip": "Rotate Q and K before INT8 rounding (exact for attention): "
                           f"{QK_ROTATION_GAIN} closer to exact on inputs with outlier channels, "
                           f"{QK_ROTATION_COST} slower on an H200. auto = on for GPUs."}),
            "backend": (list(BACKENDS), {
                "default": DEFAULT_BACKEND,
                "tooltip": "Which attention runs the calls the kernel would take, to compare them: "
                           "SageTriton, SageAttention (CUDA library), comfy-kitchen (ComfyUI's INT8) or SDPA. "
                           f"Runs here: {', '.join(available_backends())}. One that cannot run here is marked on this "
                           "node; SageTriton (without a GPU, ComfyUI's attention) runs instead."}),
            "fast_rope": ("BOOLEAN", {
                "default": True,
                "tooltip": "Rotate q and k by position (RoPE) for Flux, Chroma, HiDream and Wan in SageTriton's "
                           "kernel: ComfyUI's own math, same bits, in one pass instead of five. A Flux step is "
                           f"{ROPE_GAIN} faster with ComfyUI 0.3.64's RoPE replaced. Off = ComfyUI's RoPE."}),
            **SPARSE_INPUTS,
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, sparse_dense_layers=""):
        # a typo in the layer list stops the prompt here, naming the input, not at the first sampling step
        problem = dense_layers_problem(sparse_dense_layers)
        return True if problem is None else problem

    def build(self, **choices):
        rest, sparse = split_node_choices(choices)
        return (SageSettings(**rest, sparse=sparse),)
