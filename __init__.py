"""SageTriton: quantized attention (INT8 Q·Kᵀ, FP16/FP8 P·V) for ComfyUI, written in Triton.

Importing this package is cheap: no compilation and no GPU probing. The node classes and the
server route are only registered when ComfyUI is importable, so ``kernels`` also works as a
plain library (``from <pack>.kernels import sageattn``).
"""
import importlib.util

from .nodes.reporting.stats import attention_stats

WEB_DIRECTORY = "./web"
NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}


def _comfyui_present() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("comfy", "folder_paths"))


if _comfyui_present():
    from .nodes.ui.registry import NODE_CLASS_MAPPINGS as _CLASSIC_NODES
    from .nodes.ui.registry import NODE_DISPLAY_NAME_MAPPINGS  # noqa: F811
    from .nodes.ui.v3_nodes import make_extension, node_mappings, v3_node_classes

    # V3 node classes (comfy_api.latest) where this ComfyUI has that API, the classic ones elsewhere; both
    # present the same definitions. ComfyUI reads NODE_CLASS_MAPPINGS first; comfy_entrypoint is for
    # loaders that ask for the V3 extension.
    NODE_CLASS_MAPPINGS = node_mappings(_CLASSIC_NODES, NODE_DISPLAY_NAME_MAPPINGS)

    def comfy_entrypoint():
        """ComfyUI's V3 entry point: the nodes as a ComfyExtension."""
        return make_extension(list(v3_node_classes(_CLASSIC_NODES, NODE_DISPLAY_NAME_MAPPINGS).values()))

    try:  # core's attention registry (ComfyUI 0.3.60+): "sagetriton" by name; never stops the nodes loading
        from .nodes.core_backends import register_with_core

        register_with_core()
    except Exception as _e:  # noqa: BLE001
        import logging

        logging.getLogger("SageTriton").warning("[SageTriton] not registered as a ComfyUI attention backend: %s", _e)

    try:  # "false" sent to /prompt for a boolean input is refused, not read as true (nodes/ui/boolean_inputs.py)
        from .nodes.ui.boolean_inputs import attach_prompt_check

        attach_prompt_check()
    except Exception as _e:  # noqa: BLE001
        import logging

        logging.getLogger("SageTriton").warning("[SageTriton] boolean inputs unchecked on /prompt: %s", _e)

    try:  # the status page and the one-time background self-test must never stop the nodes from loading
        from .nodes.reporting.status_route import attach_to_server

        attach_to_server()
    except Exception as _e:  # noqa: BLE001
        import logging

        logging.getLogger("SageTriton").warning("[SageTriton] /sage/status or the background self-test "
                                                "unavailable: %s", _e)

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY", "attention_stats"]
