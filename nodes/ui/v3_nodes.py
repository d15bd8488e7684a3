"""The two nodes in ComfyUI's V3 schema (``comfy_api.latest``: ``io.ComfyNode``, ``define_schema``,
``ComfyExtension``), built from the classic definitions, so both present the same ids, display names,
inputs (order, defaults, ranges, tooltips), outputs and categories. The classic classes stay the
source of truth and serve ComfyUI releases without the V3 API.

Imports ComfyUI's API only when asked for.
"""
from __future__ import annotations

import inspect
import os
from typing import Optional

from ...kernels.log import logger

# The V3 names this module uses; a ComfyUI whose comfy_api.latest lacks any of them gets the classic nodes.
_V3_NAMES = ("ComfyNode", "Schema", "NodeOutput", "Combo", "Boolean", "Int", "Float", "String", "Model", "Custom",
             "Hidden")
SCHEMA_ENV = "SAGETRITON_NODE_SCHEMA"  # "v3" or "classic": overrides the choice by version
# The newest ComfyUI served the classic definitions by default. Its early V3 support was tested with these
# nodes and falls short: no combo or range checks (done in validate_inputs here), no per-node cache keys
# (not_idempotent here), and in its frontend (1.27) the Patch nodes' per-run panel did not update.
LAST_CLASSIC_VERSION = (0, 3, 64)


def v3_api():
    """(io module, ComfyExtension) of the running ComfyUI, or None where it has no usable V3 API."""
    try:
        from comfy_api.latest import ComfyExtension, io
    except Exception:  # noqa: BLE001 - any failure means: no V3 here
        return None
    if not all(hasattr(io, name) for name in _V3_NAMES):
        return None
    return io, ComfyExtension


def comfyui_version() -> Optional[tuple]:
    try:
        from comfyui_version import __version__
    except Exception:  # noqa: BLE001 - releases before the file existed
        return None
    try:
        return tuple(int(p) for p in __version__.split(".")[:3])
    except ValueError:
        return None


def use_v3() -> bool:
    """V3 classes where the API exists and ComfyUI is newer than ``LAST_CLASSIC_VERSION``, or where
    ``SAGETRITON_NODE_SCHEMA=v3`` asks for them; ``=classic`` always gets the classic ones."""
    choice = os.environ.get(SCHEMA_ENV, "").strip().lower()
    if choice == "classic" or v3_api() is None:
        return False
    if choice == "v3":
        return True
    version = comfyui_version()
    return version is not None and version > LAST_CLASSIC_VERSION


def _v3_input(io, name: str, spec: tuple, optional: bool):
    kind = spec[0]
    opts = dict(spec[1]) if len(spec) > 1 else {}
    common = dict(optional=optional, tooltip=opts.get("tooltip"))
    if isinstance(kind, (list, tuple)):
        return io.Combo.Input(name, options=list(kind), default=opts.get("default"), **common)
    if kind == "BOOLEAN":
        return io.Boolean.Input(name, default=opts.get("default"), **common)
    if kind == "INT":
        return io.Int.Input(name, default=opts.get("default"), min=opts.get("min"), max=opts.get("max"),
                            step=opts.get("step"), **common)
    if kind == "FLOAT":
        return io.Float.Input(name, default=opts.get("default"), min=opts.get("min"), max=opts.get("max"),
                              step=opts.get("step"), **common)
    if kind == "STRING":
        return io.String.Input(name, default=opts.get("default"), multiline=opts.get("multiline", False), **common)
    if kind == "MODEL":
        return io.Model.Input(name, **common)
    return io.Custom(kind).Input(name, **common)


def _v3_output(io, kind: str, name, tooltip):
    cls = io.Model if kind == "MODEL" else io.Custom(kind)
    return cls.Output(display_name=name, tooltip=tooltip)


def _widget_ranges(input_types: dict) -> dict:
    """name -> allowed choices (list) or (min, max) for every combo and INT input, (min, max, float) for FLOAT."""
    ranges = {}
    for section in ("required", "optional"):
        for name, spec in input_types.get(section, {}).items():
            opts = spec[1] if len(spec) > 1 else {}
            if isinstance(spec[0], (list, tuple)):
                ranges[name] = list(spec[0])
            elif spec[0] == "INT":
                ranges[name] = (opts.get("min"), opts.get("max"))
            elif spec[0] == "FLOAT":
                ranges[name] = (opts.get("min"), opts.get("max"), float)
    return ranges


def check_widget_values(ranges: dict, values: dict, linked=()):
    """True, or a message naming the first input whose value is not allowed. ``linked``: the inputs fed by a
    link (their value, None at validation, is checked where it is produced)."""
    for name, allowed in ranges.items():
        if name not in values or name in linked:  # not given (optional), or from a link
            continue
        value = values[name]
        if isinstance(allowed, list):
            if value not in allowed:
                return f"{name}: {value!r} is not one of {', '.join(map(str, allowed))}"
        else:
            low, high, *real = allowed
            number = (int, float) if real else int
            if isinstance(value, bool) or not isinstance(value, number) or value != value \
                    or (low is not None and value < low) or (high is not None and value > high):
                return f"{name}: {value!r} is outside {low}..{high}"
    return True


def check_link_types(node_cls, linked: dict):
    """True, or a message naming the first link of the wrong type. ComfyUI leaves this check to a node whose
    validate_inputs takes ``input_types`` (which it must, to tell a link from a typed-in null)."""
    from comfy_execution.graph import get_input_info
    from comfy_execution.validation import validate_node_input

    for name, received in linked.items():
        expected = get_input_info(node_cls, name)[0]
        if expected is not None and not validate_node_input(received, expected):
            return f"{name}: a {received} output cannot connect to this {expected} input"
    return True


def make_v3_node(classic: type, node_id: str, display_name: str):
    """A V3 ``ComfyNode`` class presenting ``classic``'s definition and running its function."""
    io, _ = v3_api()
    types = classic.INPUT_TYPES()
    inputs = [_v3_input(io, n, s, False) for n, s in types.get("required", {}).items()]
    inputs += [_v3_input(io, n, s, True) for n, s in types.get("optional", {}).items()]
    hidden = [io.Hidden.unique_id] if "unique_id" in types.get("hidden", {}) else []
    names = getattr(classic, "RETURN_NAMES", None) or (None,) * len(classic.RETURN_TYPES)
    outputs = [_v3_output(io, kind, name, tip)
               for kind, name, tip in zip(classic.RETURN_TYPES, names, classic.OUTPUT_TOOLTIPS, strict=True)]

    ranges = _widget_ranges(types)
    literal_check = getattr(classic, "VALIDATE_INPUTS", None)  # the classic node's own checks (Patch: settings)
    literal_names = inspect.signature(literal_check).parameters if literal_check is not None else ()

    class Node(io.ComfyNode):
        @classmethod
        def validate_inputs(cls, input_types=None, **values):
            # The early V3 API (0.3.64) checks no combo choices or INT ranges of V3 nodes; a wrong value
            # must still stop the prompt at validation, naming the input, as it does for classic nodes.
            # input_types names the linked inputs: a None that is not one was typed in (null), and is refused.
            linked = input_types or {}
            verdict = check_link_types(cls, linked) if linked else True
            if verdict is True:
                verdict = check_widget_values(ranges, values, linked)
            if verdict is True and literal_check is not None:
                verdict = literal_check(**{n: values.get(n) for n in literal_names if n not in linked})
            return verdict

        @classmethod
        def define_schema(cls):
            # not_idempotent: ComfyUI keys a classic node's cache by its id when it asks for UNIQUE_ID, but
            # not a V3 node's (its hidden inputs read as tuples); two identical Patch nodes must still run apart.
            return io.Schema(node_id=node_id, display_name=display_name, category=classic.CATEGORY,
                             description=classic.DESCRIPTION, inputs=inputs, outputs=outputs, hidden=hidden,
                             not_idempotent=bool(hidden))

        @classmethod
        def execute(cls, **kwargs):
            if hidden:
                kwargs["unique_id"] = getattr(cls.hidden, "unique_id", None) if cls.hidden is not None else None
            return io.NodeOutput(*getattr(classic(), classic.FUNCTION)(**kwargs))

    Node.__name__ = Node.__qualname__ = f"{classic.__name__}V3"
    return Node


def v3_node_classes(classic_mappings: dict, display_names: dict) -> dict:
    return {node_id: make_v3_node(cls, node_id, display_names[node_id]) for node_id, cls in classic_mappings.items()}


def make_extension(node_classes: list):
    """The ``ComfyExtension`` that ``comfy_entrypoint`` returns."""
    _, comfy_extension = v3_api()

    class SageTritonExtension(comfy_extension):
        async def get_node_list(self):
            return list(node_classes)

    return SageTritonExtension()


def node_mappings(classic_mappings: dict, display_names: dict) -> dict:
    """The node classes to register: V3 where the running ComfyUI has the API, else the classic ones."""
    if not use_v3():
        return dict(classic_mappings)
    try:
        return v3_node_classes(classic_mappings, display_names)
    except Exception as e:  # noqa: BLE001 - an API that moved must not cost the user the nodes
        logger.warning("[SageTriton] ComfyUI's V3 node API could not describe the nodes (%s); using the classic "
                       "definitions.", e)
        return dict(classic_mappings)
