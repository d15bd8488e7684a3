"""The nodes' boolean inputs take only true or false from a prompt.

ComfyUI's validation turns a BOOLEAN input's value into ``bool(value)`` before any node's own check sees it,
so "false" or "no" sent to ``/prompt`` would switch an option on. The prompt check, run on ``/prompt`` before
that validation, swaps such a value for a string that refuses that conversion with a message naming the input:
ComfyUI then rejects the prompt as it rejects any value it cannot convert, and the value never reaches a node.
"""
from __future__ import annotations

from typing import Optional

from ...kernels.log import logger
from .registry import NODE_CLASS_MAPPINGS


def boolean_inputs(node_cls) -> tuple:
    """Names of ``node_cls``'s BOOLEAN inputs."""
    types = node_cls.INPUT_TYPES()
    return tuple(name for section in ("required", "optional") for name, spec in types.get(section, {}).items()
                 if isinstance(spec, tuple) and spec and spec[0] == "BOOLEAN")


BOOLEAN_INPUTS = {node_id: names for node_id, cls in NODE_CLASS_MAPPINGS.items() if (names := boolean_inputs(cls))}


def not_a_boolean(name: str, value) -> Optional[str]:
    """Why ``value`` given for the boolean input ``name`` is refused, or None for true or false."""
    if isinstance(value, bool):
        return None
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    return (f"{name}: {shown} is not true or false (ComfyUI would read any non-empty value, \"false\" too, "
            "as true); send a JSON boolean")


class NotABoolean(str):
    """The value as it was sent, refusing ``bool()`` with the reason: ComfyUI's validation reports it."""

    why = ""

    def __bool__(self):
        raise ValueError(self.why)


def _refusing(value, why: str) -> NotABoolean:
    marked = NotABoolean(value if isinstance(value, str) else repr(value))
    marked.why = why
    return marked


def check_prompt(json_data):
    """``/prompt``'s body with each non-boolean value of our nodes' boolean inputs marked as refused."""
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    if not isinstance(prompt, dict):
        return json_data
    for node in prompt.values():
        names = BOOLEAN_INPUTS.get(node.get("class_type")) if isinstance(node, dict) else None
        inputs = node.get("inputs") if names else None
        if not isinstance(inputs, dict):
            continue
        for name in names:
            if name not in inputs or isinstance(inputs[name], list):  # absent (optional) or a link
                continue
            value = inputs[name]
            if isinstance(value, dict) and "__value__" in value:  # the frontend's wrapped widget value
                value = value["__value__"]
            why = not_a_boolean(name, value)
            if why is not None:
                inputs[name] = _refusing(value, why)
    return json_data


def attach_prompt_check() -> bool:
    """Run ``check_prompt`` on every ``/prompt`` of the ComfyUI server in this process; False without one."""
    try:
        from server import PromptServer
    except ImportError:
        return False
    instance = getattr(PromptServer, "instance", None)
    add = getattr(instance, "add_on_prompt_handler", None)
    if add is None:
        logger.debug("[SageTriton] no on_prompt handlers on this ComfyUI: boolean inputs unchecked")
        return False
    add(check_prompt)
    return True
