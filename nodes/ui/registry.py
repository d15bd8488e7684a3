"""Node registration: ids carry the pack prefix, display names are pinned by the product."""
from .patch_node import SageTritonPatchModelAttention
from .settings_node import SageTritonSettings

NODE_CLASS_MAPPINGS = {
    "SageTritonSettings": SageTritonSettings,
    "SageTritonPatchModelAttention": SageTritonPatchModelAttention,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "SageTritonSettings": "Sage Settings",
    "SageTritonPatchModelAttention": "Patch Model Attention",
}
