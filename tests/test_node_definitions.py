"""The two nodes as ComfyUI sees them: ids, display names, sockets, tooltips, defaults."""
import pytest
from sagetriton.nodes.config.settings import SageSettings
from sagetriton.nodes.ui.registry import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

SETTINGS_INPUTS = {
    "qk_quant_gran": (["auto", "per_block", "per_warp", "per_thread"], "auto"),
    "pv_precision": (["auto", "fp16", "fp8", "fp8+residual", "int8"], "auto"),
    "pv_accum_dtype": (["auto", "fp32", "fp16+fp32", "fp16"], "auto"),
    "smooth_k": ("BOOLEAN", True),
    "smooth_v": ("BOOLEAN", False),
    "min_seq_len": ("INT", -1),
    "fallback": (["auto", "sdpa", "math"], "auto"),
    "full_precision_first_steps": ("INT", 0),
    "full_precision_last_steps": ("INT", 0),
}


def test_registry_ids_and_display_names():
    assert NODE_DISPLAY_NAME_MAPPINGS == {"SageTritonSettings": "Sage Settings",
                                          "SageTritonPatchModelAttention": "Patch Model Attention"}
    assert set(NODE_CLASS_MAPPINGS) == set(NODE_DISPLAY_NAME_MAPPINGS)


@pytest.mark.parametrize("node_id", ["SageTritonSettings", "SageTritonPatchModelAttention"])
def test_every_input_and_output_has_a_tooltip(node_id):
    cls = NODE_CLASS_MAPPINGS[node_id]
    inputs = cls.INPUT_TYPES()
    for section in ("required", "optional"):
        for name, spec in inputs.get(section, {}).items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    assert len(cls.OUTPUT_TOOLTIPS) == len(cls.RETURN_TYPES) and all(cls.OUTPUT_TOOLTIPS)
    assert cls.DESCRIPTION and cls.CATEGORY and callable(getattr(cls, cls.FUNCTION))


def test_sage_settings_sockets_and_defaults():
    cls = NODE_CLASS_MAPPINGS["SageTritonSettings"]
    required = cls.INPUT_TYPES()["required"]
    assert list(required) == list(SETTINGS_INPUTS)
    for name, (kind, default) in SETTINGS_INPUTS.items():
        assert required[name][0] == kind and required[name][1]["default"] == default
    assert cls.RETURN_TYPES == ("SAGE_SETTINGS",)
    (settings,) = cls().build(**{name: default for name, (_, default) in SETTINGS_INPUTS.items()})
    assert settings == SageSettings()
    # Added later as optional, so workflows saved before it keep their widget order.
    optional = cls.INPUT_TYPES()["optional"]
    assert list(optional) == ["qk_rotation", "backend", "fast_rope", "sparse", "sparse_tau", "sparse_topk_ratio",
                              "sparse_start_percent", "sparse_end_percent", "sparse_dense_layers", "sparse_min_tokens",
                              "sparse_sink_conditioning", "sparse_extra_tokens"]
    # Sparse attention is off unless asked for; its defaults are core's Model Sparse Attention's
    assert optional["sparse"][0] == ["off", "sol", "top-k"] and optional["sparse"][1]["default"] == "off"
    assert {n: optional[n][1]["default"] for n in ("sparse_tau", "sparse_start_percent", "sparse_end_percent",
                                                   "sparse_min_tokens", "sparse_dense_layers")} == \
        {"sparse_tau": 1.3, "sparse_start_percent": 0.2, "sparse_end_percent": 1.0, "sparse_min_tokens": 12288,
         "sparse_dense_layers": ""}
    assert optional["qk_rotation"][0] == ["auto", "on", "off"]
    assert optional["fast_rope"][0] == "BOOLEAN" and optional["fast_rope"][1]["default"] is True
    assert optional["backend"][0] == ["SageTriton", "SageAttention", "comfy-kitchen", "SDPA"]
    assert optional["backend"][1]["default"] == "SageTriton"
    assert cls().build(**{name: d for name, (_, d) in SETTINGS_INPUTS.items()}, qk_rotation="off")[0] \
        .explicit_kernel_choices()["qk_rotation"] is False
    assert cls().build(**{name: d for name, (_, d) in SETTINGS_INPUTS.items()}, fast_rope=False)[0].fast_rope is False


def test_patch_node_sockets():
    cls = NODE_CLASS_MAPPINGS["SageTritonPatchModelAttention"]
    inputs = cls.INPUT_TYPES()
    assert inputs["required"]["model"][0] == "MODEL"
    assert inputs["optional"]["settings"][0] == "SAGE_SETTINGS"
    assert inputs["hidden"] == {"unique_id": "UNIQUE_ID"}
    assert cls.RETURN_TYPES == ("MODEL",)
