"""Issue 40 item 7: values typed into a prompt that no widget could give are stopped by ComfyUI's own prompt
validation (``execution.validate_inputs``), with a message naming the input, in both node schemas."""
from __future__ import annotations

import asyncio

import pytest
from sagetriton.nodes.ui import v3_nodes
from sagetriton.nodes.ui.registry import NODE_CLASS_MAPPINGS as CLASSIC
from sagetriton.nodes.ui.registry import NODE_DISPLAY_NAME_MAPPINGS as NAMES

SETTINGS = "SageTritonSettings"
PATCH = "SageTritonPatchModelAttention"


class _ModelSource:  # a node with a MODEL output and no inputs: the Patch node's link needs a source
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "tests"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}


class _IntSource:  # a node of the wrong output type for a link into ``settings``
    RETURN_TYPES = ("INT",)
    FUNCTION = "load"
    CATEGORY = "tests"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}


@pytest.fixture(params=["classic", "v3"])
def registered(request, comfyui_path, monkeypatch):
    """ComfyUI's node table with this pack's nodes in one schema (and the two sources above)."""
    import nodes

    if request.param == "v3":
        monkeypatch.setenv(v3_nodes.SCHEMA_ENV, "v3")
        ours = v3_nodes.v3_node_classes(CLASSIC, NAMES)
    else:
        ours = dict(CLASSIC)
    for node_id, cls in {**ours, "TestModelSource": _ModelSource, "TestIntSource": _IntSource}.items():
        monkeypatch.setitem(nodes.NODE_CLASS_MAPPINGS, node_id, cls)
    return request.param


def _validate(prompt: dict, node: str):
    import execution

    valid, errors, *_ = asyncio.run(execution.validate_inputs("test", prompt, node, {}))
    return valid, " ".join(f"{e.get('message', '')} {e.get('details', '')}" for e in errors)


def _settings_inputs(**changes) -> dict:
    types = CLASSIC[SETTINGS].INPUT_TYPES()
    values = {name: spec[1]["default"] for section in ("required", "optional") for name, spec in types[section].items()}
    return {**values, **changes}


@pytest.mark.parametrize("value", ["fast", {"fallback": "auto"}, 7, [1, 2, 3]], ids=["str", "dict", "int", "list"])
def test_a_literal_settings_value_is_refused(registered, value):
    prompt = {"1": {"class_type": "TestModelSource", "inputs": {}},
              "2": {"class_type": PATCH, "inputs": {"model": ["1", 0], "settings": value}}}
    valid, message = _validate(prompt, "2")
    assert valid is False and "settings" in message and "Sage Settings" in message, message


def test_linked_or_absent_settings_pass(registered):
    prompt = {"1": {"class_type": "TestModelSource", "inputs": {}},
              "3": {"class_type": SETTINGS, "inputs": _settings_inputs()},
              "2": {"class_type": PATCH, "inputs": {"model": ["1", 0], "settings": ["3", 0]}}}
    assert _validate(prompt, "2") == (True, "")
    del prompt["2"]["inputs"]["settings"]
    assert _validate(prompt, "2") == (True, "")


def test_a_link_of_the_wrong_type_is_still_refused(registered):
    prompt = {"1": {"class_type": "TestModelSource", "inputs": {}}, "4": {"class_type": "TestIntSource", "inputs": {}},
              "2": {"class_type": PATCH, "inputs": {"model": ["1", 0], "settings": ["4", 0]}}}
    valid, message = _validate(prompt, "2")
    assert valid is False and "settings" in message, message


@pytest.mark.parametrize("name", ["qk_quant_gran", "fallback", "min_seq_len", "backend"])
def test_a_null_widget_value_is_refused(registered, name):
    prompt = {"3": {"class_type": SETTINGS, "inputs": _settings_inputs(**{name: None})}}
    valid, message = _validate(prompt, "3")
    assert valid is False and name in message, message


def test_patch_called_directly_with_a_literal_names_the_input(comfyui_path):
    from tiny_models import BUILDERS

    with pytest.raises(ValueError, match="settings: 'fast'"):
        CLASSIC[PATCH]().patch(BUILDERS["wan21"](seed=0).patcher, "fast")


# --- issue 49 item 9: ComfyUI reads any non-empty value of a BOOLEAN input as true --------------------------
@pytest.mark.parametrize("name,value", [("smooth_k", "false"), ("fast_rope", "no"), ("smooth_v", "true"),
                                        ("smooth_k", 0), ("fast_rope", None)])
def test_a_boolean_input_takes_only_true_or_false(registered, name, value):
    """The /prompt check (``boolean_inputs.check_prompt``), then ComfyUI's own validation of the prompt."""
    from sagetriton.nodes.ui.boolean_inputs import check_prompt

    prompt = {"3": {"class_type": SETTINGS, "inputs": _settings_inputs(**{name: value})}}
    check_prompt({"prompt": prompt})
    valid, message = _validate(prompt, "3")
    assert valid is False and f"{name}: {value!r} is not true or false" in message, message


def test_json_booleans_and_links_pass_the_boolean_check(registered):
    from sagetriton.nodes.ui.boolean_inputs import check_prompt

    prompt = {"3": {"class_type": SETTINGS, "inputs": _settings_inputs(smooth_k=False, fast_rope=True)}}
    before = repr(prompt)
    check_prompt({"prompt": prompt})
    assert repr(prompt) == before and _validate(prompt, "3") == (True, "")


def test_settings_built_directly_refuse_a_string_for_a_boolean(comfyui_path):
    with pytest.raises(TypeError, match="smooth_k must be True or False, got 'false'"):
        CLASSIC[SETTINGS]().build(**_settings_inputs(smooth_k="false"))
