"""Test-only node pack, linked into the e2e server's custom_nodes next to SageTriton.

The tiny model itself is loaded by ComfyUI's own UNETLoader; what core cannot give without a real
text encoder is the conditioning, so this pack makes a random one of the right width.
"""
import torch


class SageTritonE2ETinyConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "width": ("INT", {"default": 4096, "min": 1, "max": 8192, "tooltip": "Text embedding width."}),
            "tokens": ("INT", {"default": 8, "min": 1, "max": 512, "tooltip": "Number of text tokens."}),
            "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1, "tooltip": "Random seed."}),
        }}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "testing/sagetriton"

    def make(self, width, tokens, seed):
        g = torch.Generator().manual_seed(seed)
        return ([[torch.randn(1, tokens, width, generator=g), {}]],)


NODE_CLASS_MAPPINGS = {"SageTritonE2ETinyConditioning": SageTritonE2ETinyConditioning}
