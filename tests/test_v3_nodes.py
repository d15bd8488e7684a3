"""The nodes in ComfyUI's V3 schema and in the classic one: the same definitions, and both paths run.

The tested ComfyUI (0.3.64) ships an early ``comfy_api.latest`` with ``io.ComfyNode``, ``io.Schema``
and ``ComfyExtension``, so the V3 path runs here for real; the classic path is what a ComfyUI without
that API gets, and what 0.3.64 gets by default (``nodes/ui/v3_nodes.py`` says why); the tests here ask
for V3 with ``SAGETRITON_NODE_SCHEMA=v3``.
"""
from __future__ import annotations

import asyncio

import pytest
import torch
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.patching import patch_state_of
from sagetriton.nodes.ui import v3_nodes
from sagetriton.nodes.ui.registry import NODE_CLASS_MAPPINGS as CLASSIC
from sagetriton.nodes.ui.registry import NODE_DISPLAY_NAME_MAPPINGS as NAMES


@pytest.fixture
def io(comfyui_path, monkeypatch):
    monkeypatch.setenv(v3_nodes.SCHEMA_ENV, "v3")  # 0.3.64 gets the classic nodes by default (see v3_nodes)
    api = v3_nodes.v3_api()
    assert api is not None, "the tested ComfyUI has comfy_api.latest with the V3 node API"
    return api[0]


def comparable_inputs(input_types: dict) -> dict:
    """V1 input dicts with combos in one form: classic ``([choices], opts)`` == V3 ``("COMBO", {options})``."""
    out = {}
    for section, specs in input_types.items():
        for name, spec in specs.items():
            spec = (spec,) if isinstance(spec, str) else spec  # hidden: "UNIQUE_ID" (classic), ("UNIQUE_ID",) (V3)
            kind, opts = spec[0], dict(spec[1]) if len(spec) > 1 else {}
            if isinstance(kind, (list, tuple)):
                kind, opts["options"] = "COMBO", list(kind)
            if kind == "COMBO" and opts.get("multiselect") is False:  # V3 spells out the single choice
                del opts["multiselect"]
            out[(section, name)] = (kind, opts)
        out[(section, "<order>")] = list(specs)
    return out


@pytest.mark.parametrize("node_id", sorted(CLASSIC))
def test_v3_definition_equals_the_classic_one(io, node_id):
    classic = CLASSIC[node_id]
    v3 = v3_nodes.node_mappings(CLASSIC, NAMES)[node_id]
    assert issubclass(v3, io.ComfyNode) and v3 is not classic
    schema = v3.GET_SCHEMA()
    assert (schema.node_id, schema.display_name) == (node_id, NAMES[node_id])
    assert comparable_inputs(v3.INPUT_TYPES()) == comparable_inputs(classic.INPUT_TYPES())
    assert (v3.CATEGORY, v3.DESCRIPTION) == (classic.CATEGORY, classic.DESCRIPTION)
    assert tuple(v3.RETURN_TYPES) == tuple(classic.RETURN_TYPES)
    assert tuple(v3.OUTPUT_TOOLTIPS) == tuple(classic.OUTPUT_TOOLTIPS)
    # Per-node cache keys, as the classic node's UNIQUE_ID gives it (each Patch node shows its own run).
    classic_keyed_by_id = "UNIQUE_ID" in classic.INPUT_TYPES().get("hidden", {}).values()
    assert bool(v3.NOT_IDEMPOTENT) == classic_keyed_by_id
    info = v3.GET_NODE_INFO_V1()
    assert info["display_name"] == NAMES[node_id] and info["category"] == classic.CATEGORY
    assert info["output_name"] == list(getattr(classic, "RETURN_NAMES", None) or classic.RETURN_TYPES)
    assert all(info["output_tooltips"]) and info["output_tooltips"] == list(classic.OUTPUT_TOOLTIPS)


def test_both_paths_build_the_same_settings_and_patch(io):
    v3 = v3_nodes.node_mappings(CLASSIC, NAMES)
    chosen = dict(qk_quant_gran="per_thread", pv_precision="fp16", pv_accum_dtype="fp32", smooth_k=True,
                  smooth_v=True, min_seq_len=0, fallback="sdpa", full_precision_first_steps=1,
                  full_precision_last_steps=2, qk_rotation="off")
    (classic_settings,) = CLASSIC["SageTritonSettings"]().build(**chosen)
    v3_settings = v3["SageTritonSettings"].execute(**chosen)
    assert isinstance(v3_settings, io.NodeOutput) and v3_settings.result == (classic_settings,)
    assert classic_settings == SageSettings(**chosen)

    import comfy.model_patcher

    base = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
    node = v3["SageTritonPatchModelAttention"].PREPARE_CLASS_CLONE({io.Hidden.unique_id: "17"})
    (patched,) = node.execute(model=base, settings=classic_settings).result
    state = patch_state_of(patched)
    assert state.settings == classic_settings and state.node_id == "17"
    (classic_patched,) = CLASSIC["SageTritonPatchModelAttention"]().patch(base, classic_settings, unique_id="17")
    assert patch_state_of(classic_patched).settings == state.settings and patch_state_of(base) is None


def test_classic_definitions_by_version_or_when_asked(io, monkeypatch):
    assert v3_nodes.node_mappings(CLASSIC, NAMES) != CLASSIC  # SAGETRITON_NODE_SCHEMA=v3 (the fixture)
    monkeypatch.setenv(v3_nodes.SCHEMA_ENV, "classic")
    assert v3_nodes.node_mappings(CLASSIC, NAMES) == CLASSIC
    monkeypatch.delenv(v3_nodes.SCHEMA_ENV)
    version = v3_nodes.comfyui_version()
    assert version is not None and version >= (0, 3, 64)
    # The release the classic definitions were last checked on gets them by default; later ones get V3.
    assert (v3_nodes.node_mappings(CLASSIC, NAMES) == CLASSIC) == (version <= v3_nodes.LAST_CLASSIC_VERSION)
    monkeypatch.setattr(v3_nodes, "comfyui_version", lambda: (0, 38, 2))
    assert v3_nodes.node_mappings(CLASSIC, NAMES) != CLASSIC  # a newer one: V3
    monkeypatch.setattr(v3_nodes, "v3_api", lambda: None)  # no comfy_api.latest V3 API: classic
    assert v3_nodes.node_mappings(CLASSIC, NAMES) == CLASSIC


def test_the_pack_offers_a_comfy_entrypoint_with_v3_nodes(io, pack):
    assert set(pack.NODE_CLASS_MAPPINGS) == set(CLASSIC)
    from comfy_api.latest import ComfyExtension

    extension = pack.comfy_entrypoint()
    assert isinstance(extension, ComfyExtension)
    nodes = asyncio.run(extension.get_node_list())
    assert all(issubclass(cls, io.ComfyNode) for cls in nodes)
    assert {cls.GET_SCHEMA().node_id: cls.GET_SCHEMA().display_name for cls in nodes} == NAMES
