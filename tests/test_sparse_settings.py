"""Sage Settings' sparse options: parsing the dense-layer list, refusing bad values with the input's name
(in ComfyUI's own prompt validation, both node schemas), and what the node builds from them."""
from __future__ import annotations

import asyncio

import pytest
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.config.sparse_settings import SparseSettings, parse_dense_layers, split_node_choices
from sagetriton.nodes.ui import v3_nodes
from sagetriton.nodes.ui.registry import NODE_CLASS_MAPPINGS as CLASSIC
from sagetriton.nodes.ui.registry import NODE_DISPLAY_NAME_MAPPINGS as NAMES

SETTINGS = "SageTritonSettings"


@pytest.mark.parametrize("text,layers", [
    ("", set()), ("0, 1, 47-49", {0, 1, 47, 48, 49}), ("3 - 5; 7", {3, 4, 5, 7}), (" 2 2 ", {2}), ("9-9", {9}),
])
def test_dense_layers_are_block_indices_and_ranges(text, layers):
    assert parse_dense_layers(text) == layers


@pytest.mark.parametrize("text,words", [
    ("0, a", "'a' is not a block index"), ("5-3", "runs backwards; write it as '3-5'"), ("1.5", "'1.5'"),
    ("-1", "'-1'"), ("0-100000", "beyond 9999"), ("1-2-3", "'1-2-3'"),
])
def test_a_bad_dense_layer_list_says_what_is_wrong_and_shows_the_form(text, words):
    with pytest.raises(ValueError, match="dense_layers") as e:
        parse_dense_layers(text)
    assert words in str(e.value) and ("0, 1, 47-49" in str(e.value) or "backwards" in str(e.value)
                                      or "beyond" in str(e.value))


@pytest.mark.parametrize("change,name", [
    (dict(mode="dense"), "sparse="), (dict(tau=5.0), "sparse_tau"), (dict(tau=float("nan")), "sparse_tau"),
    (dict(topk_ratio=1.0), "sparse_topk_ratio"), (dict(start_percent=0.6, end_percent=0.5), "before"),
    (dict(min_tokens=-1), "sparse_min_tokens"), (dict(extra_tokens=100), "sparse_extra_tokens"),
    (dict(sink_conditioning="text"), "sparse_sink_conditioning"), (dict(dense_layers="x"), "dense_layers"),
])
def test_sparse_settings_refuse_bad_values_by_name(change, name):
    with pytest.raises(ValueError, match=name):
        SparseSettings(**change)


def test_sparse_is_off_by_default_and_core_s_defaults_otherwise():
    assert not SageSettings().sparse.enabled
    s = SparseSettings(mode="sol")
    assert (s.tau, s.start_percent, s.end_percent, s.min_tokens, s.sink_conditioning) == \
        (1.3, 0.2, 1.0, 12288, "exact_kv_and_rows")
    assert s.kernel_options() == {"tau": 1.3, "topk_ratio": None, "extra_tokens": 0}
    assert SparseSettings(mode="top-k", topk_ratio=0.2).kernel_options()["topk_ratio"] == 0.2


def test_a_workflow_saved_before_the_sparse_inputs_builds_with_sparse_off():
    rest, sparse = split_node_choices({"min_seq_len": 0, "fallback": "auto"})
    assert rest == {"min_seq_len": 0, "fallback": "auto"} and sparse == SparseSettings()


# --- through ComfyUI's prompt validation, both schemas -------------------------------------------------

@pytest.fixture(params=["classic", "v3"])
def settings_node(request, comfyui_path, monkeypatch):
    import nodes

    if request.param == "v3":
        monkeypatch.setenv(v3_nodes.SCHEMA_ENV, "v3")
        cls = v3_nodes.v3_node_classes(CLASSIC, NAMES)[SETTINGS]
    else:
        cls = CLASSIC[SETTINGS]
    monkeypatch.setitem(nodes.NODE_CLASS_MAPPINGS, SETTINGS, cls)
    return cls


def _inputs(**changes) -> dict:
    types = CLASSIC[SETTINGS].INPUT_TYPES()
    values = {name: spec[1]["default"] for section in ("required", "optional") for name, spec in types[section].items()}
    return {**values, **changes}


def _validate(inputs: dict):
    import execution

    valid, errors, *_ = asyncio.run(execution.validate_inputs("test", {"3": {"class_type": SETTINGS,
                                                                             "inputs": inputs}}, "3", {}))
    return valid, " ".join(f"{e.get('message', '')} {e.get('details', '')}" for e in errors)


@pytest.mark.parametrize("change,name", [
    (dict(sparse_dense_layers="0, 1, 4x"), "dense_layers"), (dict(sparse_tau=9.0), "sparse_tau"),
    (dict(sparse="fast"), "sparse"), (dict(sparse_min_tokens=-5), "sparse_min_tokens"),
])
def test_a_bad_sparse_value_stops_the_prompt_naming_the_input(settings_node, change, name):
    valid, message = _validate(_inputs(**change))
    assert valid is False and name in message, message


def test_sparse_choices_reach_the_settings(settings_node):
    chosen = _inputs(sparse="top-k", sparse_topk_ratio=0.2, sparse_dense_layers="0, 29", sparse_min_tokens=4096,
                     sparse_start_percent=0.1, sparse_sink_conditioning="exact_kv")
    assert _validate(chosen) == (True, "")
    (settings,) = CLASSIC[SETTINGS]().build(**chosen)
    assert settings.sparse == SparseSettings(mode="top-k", topk_ratio=0.2, dense_layers="0, 29", min_tokens=4096,
                                             start_percent=0.1, sink_conditioning="exact_kv")
    assert settings.sparse.layers == {0, 29} and settings.sparse.describe() == "top-k 20 %"


def test_sparse_is_the_pack_s_kernel_only_and_says_so_with_another_backend(comfyui_path):
    import comfy.model_patcher
    import torch
    from sagetriton.nodes.patching import patch_model, patch_state_of
    from sagetriton.nodes.reporting.run_summary import build_summary, format_summary

    base = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
    on = patch_state_of(patch_model(base, SageSettings(sparse=SparseSettings(mode="sol"))))
    assert on.sparse is not None and on.sparse.sigma_window is None  # no model_sampling: the step decides
    other = patch_state_of(patch_model(base, SageSettings(backend="SDPA", sparse=SparseSettings(mode="sol"))))
    assert other.sparse is None
    other.begin_run()
    text = format_summary(build_summary(other, other.run))
    assert "sparse attention is SageTriton's kernel: off while Sage Settings' backend is SDPA" in text
    assert patch_state_of(patch_model(base, SageSettings())).sparse is None  # off by default
