"""Patch Model Attention node: a clone of the MODEL whose attention runs on the SageTriton kernel."""
from __future__ import annotations

from ..patching import patch_model
from .settings_node import SETTINGS_TYPE, settings_input_problem


class SageTritonPatchModelAttention:
    DESCRIPTION = ("Runs the model's attention on SageTriton's quantized Triton kernel (INT8 Q·Kᵀ, FP16/FP8 P·V). "
                   "Calls the kernel cannot take fall back to regular attention; after each run this node shows "
                   "how many calls used the kernel. Bypass it to get the original model back.")
    CATEGORY = "sampling/attention"
    FUNCTION = "patch"
    RETURN_TYPES = ("MODEL",)
    OUTPUT_TOOLTIPS = ("The model with SageTriton attention; the input model is left unchanged.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL", {"tooltip": "The diffusion model whose attention to replace."}),
            },
            "optional": {
                "settings": (SETTINGS_TYPE, {
                    "tooltip": "Options from a Sage Settings node. Without it, the defaults for this GPU apply."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, settings=None):
        # ComfyUI checks no literal value of a custom type: a string typed into the prompt would reach patch()
        return settings_input_problem(settings)

    def patch(self, model, settings=None, unique_id=None):
        problem = settings_input_problem(settings)
        if problem is not True:  # a caller that skipped validation (an API script calling the class)
            raise ValueError(problem)
        return (patch_model(model, settings, node_id=unique_id or executing_node_id()),)


def executing_node_id():
    """The node ComfyUI is executing right now (this one), where the hidden input did not say."""
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:
        return None
    context = get_executing_context()
    return getattr(context, "node_id", None)
